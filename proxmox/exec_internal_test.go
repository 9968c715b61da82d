package proxmox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestBootstrapUnit (6): the bootstrap joins a bundle's parts and runs it
// in a unit of its own, keeping its pid (the one the agent reported):
// systemd-run --scope where systemd runs, else a session of its own.
func TestBootstrapUnit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	// A systemd-run that records its arguments and runs the command, as
	// --scope does (in the same process).
	fake := "#!/bin/sh\necho \"$@\" > \"$RUNLOG\"\nwhile [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done\nexec \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "systemd-run"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, systemd bool, parts int) (pid int, out string) {
		t.Helper()
		b := filepath.Join(dir, "run-0123456789abcdef")
		// The bundle in two parts, or one written as itself: it writes its
		// pid and its session.
		bundle := `echo "$$ $(cut -d' ' -f6 /proc/$$/stat)" > "$0.out"` + "\nexit 0\n\x00\xffdata"
		if parts == 2 {
			os.WriteFile(b+".p0000", []byte(bundle[:20]), 0o600)
			os.WriteFile(b+".p0001", []byte(bundle[20:]), 0o600)
		} else {
			os.WriteFile(b, []byte(bundle), 0o600)
		}
		marker := filepath.Join(dir, "no-systemd")
		if systemd {
			marker = dir
		}
		cmd := exec.Command("/bin/sh", "-c", bootstrapScript, b, marker)
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "RUNLOG=" + filepath.Join(dir, "runlog")}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		got, err := os.ReadFile(b + ".out")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(b + ".p0000"); err == nil {
			t.Error("the parts were left")
		}
		os.Remove(b) // as a bundle does once it runs
		return cmd.Process.Pid, strings.TrimSpace(string(got))
	}
	pid, out := run(t, true, 2)
	log, _ := os.ReadFile(filepath.Join(dir, "runlog"))
	if f := strings.Fields(out); len(f) != 2 || f[0] != strconv.Itoa(pid) ||
		!strings.HasPrefix(string(log), "--scope --quiet --collect --unit=delegate-run-0123456789abcdef /bin/sh ") {
		t.Errorf("with systemd: pid %d, bundle saw %q, systemd-run %q", pid, out, log)
	}
	os.Remove(filepath.Join(dir, "runlog"))
	for _, parts := range []int{2, 1} {
		pid, out = run(t, false, parts)
		if f := strings.Fields(out); len(f) != 2 || f[0] != strconv.Itoa(pid) || f[1] != f[0] {
			t.Errorf("without systemd, %d parts: pid %d, bundle saw %q (pid, session): not a session of its own", parts, pid, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "runlog")); err == nil {
		t.Error("systemd-run ran without systemd")
	}
}

// TestRunOutputCut (15): a command whose output the agent cut at 16 MiB
// (out-truncated) is an error, not a partial answer (a file listing, say).
func TestRunOutputCut(t *testing.T) {
	t.Parallel()
	sim, err := pvesim.New(pvesim.Options{TaskDelay: 20 * time.Millisecond, BootDelay: 50 * time.Millisecond, AuthFailureDelay: -1, SandboxDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	if err := sim.AddToken(pvesim.Token{ID: "root@pam!tk", Secret: "s", Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddTemplate("pve1", 9000, "tpl", pvesim.TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: "root@pam", TokenName: "tk", TokenValue: "s",
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), TaskPollInterval: 20 * time.Millisecond, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(c, Config{Template: "tpl", PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(context.Background(), sandbox.Spec{JobID: "job-cut", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	s := sb.(*vmSandbox)
	ctx := context.Background()
	if out, err := s.runOK(ctx, []string{"echo", "hi"}); err != nil || string(out) != "hi\n" {
		t.Fatalf("echo: %q, %v", out, err)
	}
	if out, err := s.runOK(ctx, []string{"head", "-c", fmt.Sprint(16<<20 + 1), "/dev/zero"}); err == nil || !strings.Contains(err.Error(), "cut") {
		t.Fatalf("16 MiB and a byte: %d bytes, %v", len(out), err)
	}
}
