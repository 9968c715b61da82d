package proxmox_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
)

// vm makes one VM through the backend alone (no engine: nobody watches
// the command but the test).
func vm(t *testing.T) (*proxmox.Backend, sandbox.Instance) {
	t.Helper()
	return vmWith(t, proxmox.Config{})
}

func vmWith(t *testing.T, cfg proxmox.Config) (*proxmox.Backend, sandbox.Instance) {
	t.Helper()
	return vmSpec(t, cfg, sandbox.Spec{JobID: "job-cmd", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30})
}

// vmSpec is vmWith for a sandbox spec of the test's.
func vmSpec(t *testing.T, cfg proxmox.Config, spec sandbox.Spec) (*proxmox.Backend, sandbox.Instance) {
	t.Helper()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	cfg.Template, cfg.PollInterval = "debian-job", 50*time.Millisecond
	b, err := proxmox.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	return b, sb
}

func runCmd(t *testing.T, sb sandbox.Instance, cmd sandbox.Command) (sandbox.Exit, string) {
	t.Helper()
	exit, p := runProc(t, sb, cmd)
	out, err := p.ReadOutput(context.Background(), 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return exit, string(sandbox.Join(out))
}

// runProc runs cmd to its end and returns the process.
func runProc(t *testing.T, sb sandbox.Instance, cmd sandbox.Command) (sandbox.Exit, sandbox.Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
	}
	p, err := sb.Exec(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return exit, p
}

// tagged reads a process's output from offset, max bytes at a time, and
// renders it as "[stream]data", in order.
func tagged(t *testing.T, p sandbox.Process, offset int64, max int) string {
	t.Helper()
	var all []sandbox.Output
	for {
		outs, err := p.ReadOutput(context.Background(), offset, max)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) == 0 {
			break
		}
		for _, o := range outs {
			all = sandbox.Append(all, o.Stream, o.Data)
			offset += int64(len(o.Data))
		}
	}
	var b strings.Builder
	for _, o := range all {
		fmt.Fprintf(&b, "[%s]%s", o.Stream, o.Data)
	}
	return b.String()
}

// TestCommandStreams: where the guest has perl, a command's stdout and
// stderr are kept apart, byte for byte, in the order written (a pause
// before each change of stream: when both have something at once, stdout
// is read first), also read by a process found again after a restart,
// from any offset; without perl they come together.
func TestCommandStreams(t *testing.T) {
	t.Parallel()
	_, sb := vm(t)
	script := `echo out; echo err >&2; sleep 0.3; printf 'a\000b\377'; sleep 0.3; printf x >&2; sleep 0.3; echo end; exit 3`
	exit, p := runProc(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", script}})
	want := "[stdout]out\n[stderr]err\n[stdout]a\x00b\xff[stderr]x[stdout]end\n"
	if got := tagged(t, p, 0, 1<<20); exit.Code != 3 || exit.OutputBytes != 17 || got != want {
		t.Fatalf("exit %+v, output %q; want %q", exit, got, want)
	}
	again, err := sb.Process(context.Background(), p.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := tagged(t, again, 2, 3); got != "[stdout]t\n"+strings.TrimPrefix(want, "[stdout]out\n") {
		t.Errorf("found again, from 2, 3 bytes at a time: %q", got)
	}

	_, sb = vmWith(t, proxmox.Config{GuestPerl: "/nonexistent/perl"})
	exit, p = runProc(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo out; echo err >&2"}})
	if got := tagged(t, p, 0, 1<<20); exit.Code != 0 || got != "[combined]out\nerr\n" {
		t.Fatalf("without perl: exit %+v, output %q", exit, got)
	}
}

// TestCommandContract: the Proxmox backend honours every field of
// sandbox.Command: Dir, Deadline (a kill in the guest that needs no
// server, of the command and what it started) and OutputLimit.
func TestCommandContract(t *testing.T) {
	_, sb := vm(t)

	t.Run("dir", func(t *testing.T) {
		exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"pwd"}, Dir: "/tmp"})
		if exit.Code != 0 || out != "/tmp\n" {
			t.Fatalf("%+v %q", exit, out)
		}
		exit, out = runCmd(t, sb, sandbox.Command{Args: []string{"pwd"}})
		if exit.Code != 0 || out != "/workspace\n" {
			t.Fatalf("default dir: %+v %q", exit, out)
		}
		exit, out = runCmd(t, sb, sandbox.Command{Args: []string{"pwd"}, Dir: "/workspace/missing"})
		if exit.Code != 125 || !strings.Contains(out, "cannot enter the working directory /workspace/missing") {
			t.Fatalf("missing dir: %+v %q", exit, out)
		}
		if _, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"pwd"}, Dir: "tmp"}); err == nil {
			t.Fatal("a relative dir was taken")
		}
	})

	t.Run("on the guest's disk", func(t *testing.T) {
		// delegate's files in the guest (the bundle, the command's
		// directory, a file's parts on their way) are in /var/tmp, on the
		// guest's disk, and none in /tmp (RAM on Debian 13); the
		// simulator's guest has a Debian guest's /var/tmp.
		if err := sb.WriteFile(context.Background(), "/workspace/big", make([]byte, 100<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c",
			`find /tmp -mindepth 1; echo --; stat -c %a /var/tmp /var/tmp/delegate; ls /var/tmp/delegate`}})
		if exit.Code != 0 || !regexp.MustCompile(`^--\n1777\n700\n(cmd-[0-9a-f]{16}\.d\n)+$`).MatchString(out) {
			t.Fatalf("%+v %q", exit, out)
		}
	})

	t.Run("deadline", func(t *testing.T) {
		// The command starts a child that would write a file after the
		// deadline: the watchdog kills both.
		start := time.Now()
		exit, out := runCmd(t, sb, sandbox.Command{
			Args:     []string{"/bin/sh", "-c", "(sleep 3; echo late > /workspace/late) & echo started; sleep 60"},
			Deadline: time.Now().Add(1500 * time.Millisecond),
		})
		took := time.Since(start)
		if !exit.DeadlineExceeded || exit.Code != 137 || out != "started\n" || took > 10*time.Second {
			t.Fatalf("%+v %q after %s", exit, out, took)
		}
		// The child is gone (soon after, if not at once), before it could
		// write its file: no process names the file ('l[a]te' is not in
		// the pattern's own command line).
		testkit.Eventually(t, 10*time.Second, "the command's child killed", func() bool {
			_, procs := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "grep -ls 'workspace/l[a]te' /proc/[0-9]*/cmdline; true"}})
			return procs == ""
		})
		exit, out = runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "cat /workspace/late 2>&1 || echo none"}})
		if out != "cat: /workspace/late: No such file or directory\nnone\n" {
			t.Fatalf("the command's child outlived the deadline: %q", out)
		}
		// A command that ends in time is not marked.
		exit, _ = runCmd(t, sb, sandbox.Command{Args: []string{"true"}, Deadline: time.Now().Add(time.Minute)})
		if exit.DeadlineExceeded || exit.Code != 0 {
			t.Fatalf("%+v", exit)
		}
	})

	t.Run("inputs, stdin and env", func(t *testing.T) {
		// Inputs are files of the job's user only in a directory of the
		// command's own; Stdin is one of them; the environment is exactly
		// Env (nothing of the agent's), and its file is gone once read.
		script := `stat -c %a "$DELEGATE_INPUTS" "$DELEGATE_INPUTS/a" "$DELEGATE_INPUTS/in.txt"; cat; cat "$DELEGATE_INPUTS/a"
[ -e "${DELEGATE_INPUTS%/in}/env" ] && echo env-left || echo env-gone
env -0 | grep -zv '^PWD=' | sort -z | tr '\000' '\n'`
		exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", script},
			Env:    []string{"PATH=/usr/bin:/bin", "FOO=it's \"quoted\"\nover lines $(x)"},
			Inputs: map[string][]byte{"a": []byte("A\x00\xff\n"), "in.txt": []byte("from stdin\n")}, Stdin: "in.txt"})
		inputs := regexp.MustCompile(`DELEGATE_INPUTS=(/var/tmp/delegate/cmd-[0-9a-f]{16}\.d/in)\n`).FindStringSubmatch(out)
		want := "700\n400\n400\nfrom stdin\nA\x00\xff\nenv-gone\n"
		if exit.Code != 0 || inputs == nil || out != want+"DELEGATE_INPUTS="+inputs[1]+"\nFOO=it's \"quoted\"\nover lines $(x)\nPATH=/usr/bin:/bin\n" {
			t.Fatalf("%+v %q", exit, out)
		}
		for _, bad := range []sandbox.Command{
			{Args: []string{"true"}, Inputs: map[string][]byte{"../x": nil}},
			{Args: []string{"true"}, Inputs: map[string][]byte{"a": nil}, Stdin: "b"},
			{Args: []string{"true"}, Env: []string{"NOT-A-NAME=1"}},
		} {
			if _, err := sb.Exec(context.Background(), bad); err == nil {
				t.Errorf("%+v was taken", bad)
			}
		}
	})

	t.Run("output limit", func(t *testing.T) {
		exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "seq 1 1000"}, OutputLimit: 100})
		if len(out) != 100 || !strings.HasPrefix(out, "1\n2\n") || !exit.Truncated || exit.OutputBytes != 3893 {
			t.Fatalf("%+v %d bytes kept", exit, len(out))
		}
		exit, out = runCmd(t, sb, sandbox.Command{Args: []string{"echo", "hi"}, OutputLimit: 100})
		if exit.Truncated || out != "hi\n" || exit.OutputBytes != 3 {
			t.Fatalf("%+v %q", exit, out)
		}
	})
}

// TestCheckTemplate: a job naming a template that does not exist is
// refused at submission (a field error listing the templates), from a
// list of the cluster's templates read now and then; one made after the
// list was read is found.
func TestCheckTemplate(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	listings := func() int {
		n := 0
		for _, r := range sim.Requests() {
			if r.Path == "/cluster/resources" && r.TokenID == token {
				n++
			}
		}
		return n
	}
	submit := func(tpl string) error {
		_, err := s.eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", VMTemplate: tpl}, delegate.SubmitOptions{})
		return err
	}
	var fe *delegate.FieldError
	if err := submit("nope"); !errors.As(err, &fe) || fe.Field != "manifest.vmTemplate" || !strings.Contains(fe.Rule, "available: debian-job (9000)") {
		t.Fatalf("unknown template: %v", err)
	}
	// The check alone (no engine, whose sweep lists the cluster too).
	b, err := proxmox.New(c, proxmox.Config{Template: "debian-job"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.CheckTemplate(ctx, "debian-job"); err != nil {
		t.Fatal(err)
	}
	before := listings()
	for range 5 {
		if err := b.CheckTemplate(ctx, "debian-job"); err != nil {
			t.Fatal(err)
		}
		if err := b.CheckTemplate(ctx, "9000"); err != nil {
			t.Fatal(err)
		}
	}
	if n := listings() - before; n != 0 {
		t.Errorf("%d listings for 10 checks of a known template", n)
	}
	var te *sandbox.TemplateError
	if err := b.CheckTemplate(ctx, "nope"); !errors.As(err, &te) {
		t.Fatalf("unknown template: %v", err)
	}
	// A template made since the list was read is found: the list is read
	// again for a name it lacks, at most every few seconds (checks
	// before then answer from the list).
	if err := sim.AddTemplate("pve1", 9100, "brand-new", pvesim.TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(15*time.Second, func() bool { err = b.CheckTemplate(ctx, "brand-new"); return err == nil }) {
		t.Fatalf("a new template: %v", err)
	}
}

// TestOlderCommandFound: a command that a delegate from before guestDir
// moved to /var/tmp started (its files in /tmp/delegate, its exec id's
// bundle "run-...") is found again by its exec id after an upgrade.
func TestOlderCommandFound(t *testing.T) {
	_, sb := vm(t)
	const run = "run-0123456789abcdef"
	exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c",
		`d=/tmp/delegate/` + run + `.d; mkdir -p $d && printf 'old output\n' >$d/output && : >$d/events && echo 3 >$d/output.exit`}})
	if exit.Code != 0 {
		t.Fatalf("%+v %q", exit, out)
	}
	p, err := sb.Process(context.Background(), "pid:1:0:"+run)
	if err != nil {
		t.Fatal(err)
	}
	if exit, err = p.Wait(context.Background()); err != nil || exit.Code != 3 {
		t.Fatalf("%+v %v", exit, err)
	}
	got, err := p.ReadOutput(context.Background(), 0, 1<<10)
	if err != nil || string(sandbox.Join(got)) != "old output\n" {
		t.Fatalf("%q %v", sandbox.Join(got), err)
	}
}
