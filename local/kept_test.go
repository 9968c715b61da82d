//go:build linux

package local

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// keptSandbox makes a kept sandbox (Spec.MultiExec) on b.
func keptSandbox(t *testing.T, b *Backend, expires time.Time) *sbox {
	t.Helper()
	spec := defaultSpec()
	spec.MultiExec, spec.Expires = true, expires
	return create(t, b, spec)
}

// cKeptSandbox makes a kept sandbox that lives a minute on a backend of
// its own, for a test of the C helpers (skipped in a build without them).
func cKeptSandbox(t *testing.T) (*Backend, *sbox) {
	t.Helper()
	if !haveCHelper {
		t.Skip("the C helpers are not in this build")
	}
	b := newBackend(t, 0)
	return b, keptSandbox(t, b, time.Now().Add(time.Minute))
}

// inEachKeptSandbox runs f as a subtest per helper mode this build has
// ("C", "Go"), with a kept sandbox that lives for lifetime, on a backend
// of its own that uses those helpers.
func inEachKeptSandbox(t *testing.T, lifetime time.Duration, f func(t *testing.T, mode string, b *Backend, sb *sbox)) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			f(t, mode, b, keptSandbox(t, b, time.Now().Add(lifetime)))
		})
	}
}

// keptRun runs a shell script as a command of sb and wants exit 0.
func keptRun(t *testing.T, sb *sbox, script string) string {
	t.Helper()
	exit, out := run(t, sb, "/bin/sh", "-c", script)
	if exit.Code != 0 {
		t.Fatalf("%q: exit %+v:\n%s", script, exit, out)
	}
	return out
}

// TestKeptCommandsShareProcesses: a later command of a kept sandbox sees
// the processes an earlier one left in the background (ps, /proc) and
// can signal them, by name and by a pid left in /tmp.
func TestKeptCommandsShareProcesses(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		keptRun(t, sb, `sleep 300 >/dev/null 2>&1 & echo $! > /tmp/sleep.pid
sleep 301 >/dev/null 2>&1 & echo $! > /tmp/other.pid`)
		out := keptRun(t, sb, `pid=$(cat /tmp/sleep.pid); tr '\0' ' ' < /proc/$pid/cmdline; echo; ps -eo pid,args | grep -c '[s]leep 30'`)
		if out != "sleep 300 \n2\n" {
			t.Fatalf("the second command sees of the first one's background: %q, want its sleeps", out)
		}
		out = keptRun(t, sb, `pkill -x -f 'sleep 300' && echo signalled; kill $(cat /tmp/other.pid) && echo killed
for p in $(cat /tmp/sleep.pid) $(cat /tmp/other.pid); do
  i=0; while kill -0 $p 2>/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
  kill -0 $p 2>/dev/null && echo "$p ALIVE" || echo "$p gone"
done`)
		pid1, pid2 := strings.TrimSpace(keptRun(t, sb, "cat /tmp/sleep.pid")), strings.TrimSpace(keptRun(t, sb, "cat /tmp/other.pid"))
		if want := fmt.Sprintf("signalled\nkilled\n%s gone\n%s gone\n", pid1, pid2); out != want {
			t.Errorf("the third command killing the first one's background: %q, want %q", out, want)
		}
		if pids := sandboxProcs(t, sb); len(pids) != 1 {
			t.Errorf("processes in the sandbox besides its init: %v", pids)
		}
	})
}

// sandboxProcs lists the processes in the sandbox's cgroups (its init,
// and its commands' processes), with their command lines; not the spare
// the C init holds ready for the next command.
func sandboxProcs(t *testing.T, sb *sbox) []string {
	t.Helper()
	pids, err := stateOf(t, sb).Cgroup.procs()
	if err != nil {
		t.Fatal(err)
	}
	cmdlines := map[int]string{}
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		cmdlines[pid] = strings.ReplaceAll(string(cmdline), "\x00", " ")
	}
	var out []string
	for _, pid := range pids {
		if isSpare(pid) || justForkedSpare(pid, cmdlines) {
			continue
		}
		out = append(out, fmt.Sprintf("%d %s", pid, cmdlines[pid]))
	}
	return out
}

// justForkedSpare says whether pid is a spare init has forked and not yet
// placed in its spare group: init's child, with init's command line.
func justForkedSpare(pid int, cmdlines map[int]string) bool {
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, _ := strconv.Atoi(strings.TrimSpace(v))
			parent, ok := cmdlines[ppid]
			return ok && parent == cmdlines[pid] && strings.Contains(parent, initCommand)
		}
	}
	return false
}

// isSpare says whether pid is a kept sandbox's spare: in a pids group
// spare-N.
func isSpare(pid int) bool { return spareGroup(pid) != "" }

// spareGroup is the name of the spare group pid is in ("spare-N"), or "".
func spareGroup(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if _, path, ok := strings.Cut(line, ":pids:"); ok && strings.HasPrefix(filepath.Base(path), "spare-") {
			return filepath.Base(path)
		}
	}
	return ""
}

// TestKeptCommandGroup: each command of a kept sandbox is in a cgroup of
// its own, named after it, below the sandbox's (the C keeper's spare,
// renamed, in cgroup v1); the C helpers hold one spare ready, placed
// in its group ahead of the next command, and no more: the first spare
// (spare-1) became the first command, a later one waits.
func TestKeptCommandGroup(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		for range 3 {
			p := start(t, sb, "/bin/sh", "-c", "{ grep ':pids:' /proc/self/cgroup || grep '^0::' /proc/self/cgroup; } | cut -d: -f3")
			exit, out := finish(t, p)
			if want := "/" + p.ID() + "\n"; exit.Code != 0 || out != want {
				t.Errorf("the command's group: %+v %q, want %q", exit, out, want)
			}
		}
		var groups []string
		spares := func() int {
			pids, err := stateOf(t, sb).Cgroup.procs()
			if err != nil {
				t.Fatal(err)
			}
			groups = nil
			for _, pid := range pids {
				if g := spareGroup(pid); g != "" {
					groups = append(groups, g)
				}
			}
			return len(groups)
		}
		want := 0
		if mode == "C" && b.cg.Version == 1 {
			want = 1 // made a moment after the last command came
		}
		waitFor(5*time.Second, func() bool { return spares() == want })
		// No event says that no more spares come: a while without one.
		time.Sleep(100 * time.Millisecond)
		if n := spares(); n != want || (n == 1 && groups[0] == "spare-1") {
			t.Errorf("spares in the sandbox: %q, want %d (and not the first)", groups, want)
		}
	})
}

// TestKeptDevServerRestart: the agent's round: a dev server started in the
// background by one command, checked by the next, then killed and
// started again on the same port by a later one.
func TestKeptDevServerRestart(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed on this host")
	}
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		const serve = `cd /workspace && python3 -m http.server 8123 --bind 127.0.0.1 >/tmp/server.log 2>&1 & echo $! > /tmp/server.pid
i=0; until python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8123), 1)' 2>/dev/null; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.05; done; echo up`
		const get = `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8123/page.txt").read().decode(), end="")'`
		if err := sb.WriteFile(context.Background(), "/workspace/page.txt", []byte("v1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := keptRun(t, sb, serve); out != "up\n" {
			t.Fatalf("start the server: %q", out)
		}
		first := strings.TrimSpace(keptRun(t, sb, "cat /tmp/server.pid"))
		if out := keptRun(t, sb, get); out != "v1\n" {
			t.Fatalf("the server from another command: %q", out)
		}
		// Restart: kill the server the first command started, start it
		// again on the same port.
		keptRun(t, sb, `pid=$(cat /tmp/server.pid); kill $pid; i=0; while kill -0 $pid 2>/dev/null; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.05; done`)
		if err := sb.WriteFile(context.Background(), "/workspace/page.txt", []byte("v2\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		exit, out := run(t, sb, "/bin/sh", "-c", serve)
		if exit.Code != 0 || out != "up\n" {
			_, log := run(t, sb, "/bin/cat", "/tmp/server.log")
			t.Fatalf("restart the server on the same port: %+v %q; its log:\n%s", exit, out, log)
		}
		second := strings.TrimSpace(keptRun(t, sb, "cat /tmp/server.pid"))
		if out := keptRun(t, sb, get); out != "v2\n" || second == first {
			t.Errorf("after the restart: %q from server %s (the first was %s)", out, second, first)
		}
	})
}

// TestKeptCommandEnds: a command's deadline and its Kill end that
// command's processes, those it moved to a session of their own
// included, and nothing else: what another command left in the
// background runs on, and the sandbox takes more commands.
func TestKeptCommandEnds(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		keptRun(t, sb, `sleep 300 >/dev/null 2>&1 & echo $! > /tmp/keep.pid`)
		mine := `sleep 1000 & echo $! > /tmp/mine.pid; setsid sleep 1001 >/dev/null 2>&1 & echo started; sleep 1002`
		p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", mine}, Env: testEnv,
			Deadline: time.Now().Add(700 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		if exit, _ := finish(t, p); !exit.DeadlineExceeded || !exit.Killed || exit.Code != 137 {
			t.Errorf("at its deadline: %+v", exit)
		}
		check := func(how string) {
			t.Helper()
			out := keptRun(t, sb, `kill -0 $(cat /tmp/keep.pid) && echo kept; ps -eo args | grep -c '^sleep 100[0-2]' || true`)
			if out != "kept\n0\n" {
				t.Errorf("after %s: %q, want the other command's sleep kept and none of this one's", how, out)
			}
		}
		check("the deadline")
		p = start(t, sb, "/bin/sh", "-c", mine)
		if !waitFor(10*time.Second, func() bool {
			out, _ := p.ReadOutput(context.Background(), 0, 100)
			return len(out) > 0
		}) {
			t.Fatal("the command never started")
		}
		if err := p.Kill(context.Background()); err != nil {
			t.Fatal(err)
		}
		if exit, _ := finish(t, p); !exit.Killed || exit.Code != 137 || exit.DeadlineExceeded {
			t.Errorf("killed: %+v", exit)
		}
		check("Kill")
	})
}

// TestKeptServerKilled: the server is killed (SIGKILL) while a command of
// a kept sandbox runs and another one's background process lives; a new
// server finds the sandbox, the command's end and its output, and runs
// more commands in it beside that background process.
func TestKeptServerKilled(t *testing.T) {
	canRun(t)
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			server := exec.Command(self, dir, mode)
			server.Env = append(os.Environ(), testHelperEnv+"=keptserver")
			server.Stderr = testLogWriter{t}
			stdout, err := server.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := server.Start(); err != nil {
				t.Fatal(err)
			}
			defer server.Process.Kill()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			var id, execID string
			if _, serr := fmt.Sscan(line, &id, &execID); err != nil || serr != nil {
				t.Fatalf("the server said %q (%v, %v)", line, err, serr)
			}
			if err := server.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			server.Wait()

			b, err := New(Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			b.shims.goHelpers = mode == "Go"
			inst, err := b.Recover(context.Background(), id)
			if err != nil {
				t.Fatalf("Recover: %v", err)
			}
			sb := inst.(*sbox)
			t.Cleanup(func() {
				st := stateOf(t, sb)
				if err := sb.Destroy(context.Background()); err != nil {
					t.Errorf("Destroy: %v", err)
				}
				assertNoTrace(t, b, id, st)
			})
			p, err := sb.Process(context.Background(), execID)
			if err != nil {
				t.Fatal(err)
			}
			exit, out := finish(t, p)
			if exit.Code != 7 || out != "begin\nend\n" {
				t.Errorf("the command the killed server started: %+v %q", exit, out)
			}
			if out := keptRun(t, sb, `ps -eo args | grep -c '^sleep 300'`); out != "1\n" {
				t.Errorf("the background process of a command of the killed server: %q", out)
			}
		})
	}
}

// runKeptServer is the test binary as a server that keeps a sandbox: it
// starts a command that leaves a sleep behind and one that runs a while,
// says their sandbox's and the second one's ids, and waits to be killed.
func runKeptServer(args []string) int {
	b, err := New(Config{Dir: args[0]})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b.shims.goHelpers = args[1] == "Go"
	spec := defaultSpec()
	spec.MultiExec, spec.Expires = true, time.Now().Add(time.Minute)
	sb, err := b.Create(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	first, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 &"}, Env: testEnv})
	if err == nil {
		_, err = first.Wait(ctx)
	}
	var second sandbox.Process
	if err == nil {
		second, err = sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo begin; sleep 1; echo end; exit 7"}, Env: testEnv})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(sb.ID(), second.ID())
	waitKilled()
	return 0
}

// TestKeptSandboxExpires: a kept sandbox's processes end at Spec.Expires
// by themselves (its supervisor ends its init), with no server watching;
// then it is gone for Recover and Exec, and Destroy removes all of it.
func TestKeptSandboxExpires(t *testing.T) {
	const lifetime = 3 * time.Second
	inEachKeptSandbox(t, lifetime, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		start := time.Now()
		keptRun(t, sb, `sleep 300 >/dev/null 2>&1 &`)
		// Seen before the sandbox expires (a loaded machine may take the
		// sandbox's whole life to get here: then its end is what counts).
		if procs := sandboxProcs(t, sb); len(procs) != 2 && time.Since(start) < lifetime/2 {
			t.Fatalf("processes of the sandbox: %v, want init and the sleep", procs)
		}
		if !waitFor(10*time.Second, func() bool { return len(sandboxProcs(t, sb)) == 0 }) {
			t.Fatalf("processes after the sandbox expired: %v", sandboxProcs(t, sb))
		}
		// Its keeper ends once it has reaped init: a moment after the
		// last process of the sandbox's cgroups (it is not in them).
		var err error
		if !waitFor(10*time.Second, func() bool {
			_, err = b.Recover(context.Background(), sb.id)
			return errors.Is(err, sandbox.ErrGone)
		}) {
			t.Errorf("Recover of an expired sandbox: %v, want ErrGone", err)
		}
		if _, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/true"}}); !errors.Is(err, sandbox.ErrGone) {
			t.Errorf("Exec in an expired sandbox: %v, want ErrGone", err)
		}
	})
}

// TestKeptPause: Pause freezes every process of a kept sandbox, what its
// commands left in the background included (each command is in a cgroup
// of its own below the sandbox's); a command killed while the sandbox is
// paused dies, and the rest stays frozen until Resume.
func TestKeptPause(t *testing.T) {
	b := newBackend(t, 0)
	if b.cg.Freezer == "" {
		t.Skip("this host has no freezer")
	}
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b.shims.goHelpers = mode == "Go"
			sb := keptSandbox(t, b, time.Now().Add(time.Minute))
			keptRun(t, sb, `(while :; do date +%s%N >> /workspace/ticks; sleep 0.02; done) >/dev/null 2>&1 &`)
			ticks := func() int {
				data, _ := sb.ReadFile(context.Background(), "/workspace/ticks", 0, 1<<20)
				return strings.Count(string(data), "\n")
			}
			if !waitFor(10*time.Second, func() bool { return ticks() > 3 }) {
				t.Fatal("the background loop never ticked")
			}
			other := start(t, sb, "/bin/sh", "-c", "echo running; sleep 300")
			waitFor(10*time.Second, func() bool { out, _ := other.ReadOutput(context.Background(), 0, 10); return len(out) > 0 })
			if err := sb.Pause(context.Background()); err != nil {
				logProcs(t, sb)
				t.Fatal(err)
			}
			before := ticks()
			// Paused, nothing happens: a while in which the loop would
			// have ticked several times (no event marks a tick not made).
			time.Sleep(300 * time.Millisecond)
			if after := ticks(); after != before {
				t.Errorf("the background loop ticked %d times while paused", after-before)
			}
			// Killed while paused, the command dies at once (the sandbox is
			// thawed for it, then frozen again).
			if err := other.Kill(context.Background()); err != nil {
				t.Fatalf("Kill while paused: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if exit, err := other.Wait(ctx); err != nil || !exit.Killed {
				t.Errorf("killed while paused: %+v %v", exit, err)
			}
			before = ticks()
			time.Sleep(300 * time.Millisecond) // as above: ticks not made
			if after := ticks(); after != before {
				t.Errorf("the background loop ticked %d times while paused, after the kill", after-before)
			}
			if err := sb.Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !waitFor(10*time.Second, func() bool { return ticks() > before+3 }) {
				t.Error("resumed, the background loop did not go on")
			}
		})
	}
}

// logProcs logs what each process of the sandbox is doing (a pause that
// does not complete: which one is not frozen, and where it waits).
func logProcs(t *testing.T, sb *sbox) {
	pids, _ := stateOf(t, sb).Cgroup.procs()
	for _, p := range pids {
		var f [5][]byte
		for i, name := range []string{"cmdline", "stat", "wchan", "stack", "cgroup"} {
			f[i], _ = os.ReadFile(fmt.Sprintf("/proc/%d/%s", p, name))
		}
		t.Logf("%d %q: %s wchan=%s\n%s%s", p, f[0], f[1], f[2], f[3], f[4])
	}
}

// TestKeptCommandOwnParts: each command of a kept sandbox has its own
// inputs, environment, working directory, standard input and status
// channel, and the same confinement as a sandbox's one command; two run
// at once.
func TestKeptCommandOwnParts(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		keptRun(t, sb, "mkdir /workspace/sub")
		script := `echo "$NAME $(pwd) $(cat $DELEGATE_INPUTS/secret) $(cat)"; ls $DELEGATE_INPUTS | tr '\n' ' '; echo
echo "status of $NAME" > ` + StatusFile + `; sleep 0.5; find /run | sort | tr '\n' ' '; echo
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr '\t\n' '  '; echo; id -u`
		var ps []sandbox.Process
		for _, name := range []string{"one", "two"} {
			p, err := sb.Exec(context.Background(), sandbox.Command{
				Args: []string{"/bin/sh", "-c", script}, Env: append([]string{"NAME=" + name}, testEnv...), Dir: "/workspace/sub",
				Inputs: map[string][]byte{"secret": []byte(name + "-secret"), "stdin": []byte(name + "-stdin")}, Stdin: "stdin",
			})
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		for i, name := range []string{"one", "two"} {
			exit, out := finish(t, ps[i])
			want := fmt.Sprintf("%s /workspace/sub %s-secret %s-stdin\nsecret stdin \n", name, name, name) +
				"/run /run/delegate /run/delegate/inputs /run/delegate/inputs/secret /run/delegate/inputs/stdin /run/delegate/status \n" +
				"CapEff: 0000000000000000 CapBnd: 0000000000000000 NoNewPrivs: 1 Seccomp: 2 \n1000\n"
			if exit.Code != 0 || out != want {
				t.Errorf("command %s: %+v\n%q\nwant\n%q", name, exit, out, want)
			}
			ev, err := ps[i].ReadEvents(context.Background(), 0, 100)
			if err != nil || string(ev) != "status of "+name+"\n" {
				t.Errorf("command %s's status lines: %q, %v", name, ev, err)
			}
		}
	})
}

// TestKeptSetupFailure: a command whose program is missing or whose
// directory is not there fails as a sandbox's one command does; the
// sandbox goes on.
func TestKeptSetupFailure(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		for _, c := range []struct {
			cmd  sandbox.Command
			code int
			out  string
		}{
			{sandbox.Command{Args: []string{"no-such-command"}, Env: testEnv}, codeNotFound,
				setupPrefix + `"no-such-command": command not found in PATH "/usr/local/bin:/usr/bin:/bin"` + "\n"},
			{sandbox.Command{Args: []string{"/bin/true"}, Env: testEnv, Dir: "/nowhere"}, codeCannotExec,
				setupPrefix + "working directory /nowhere does not exist in the sandbox\n"},
			{sandbox.Command{Args: []string{"/etc/passwd"}, Env: testEnv}, codeCannotExec,
				setupPrefix + `cannot run "/etc/passwd": permission denied` + "\n"},
		} {
			p, err := sb.Exec(context.Background(), c.cmd)
			if err != nil {
				t.Fatal(err)
			}
			exit, out := finishTagged(t, p)
			if exit.Code != c.code || out != "[stderr]"+c.out || exit.Reason != strings.TrimSuffix(strings.TrimPrefix(c.out, setupPrefix), "\n") {
				t.Errorf("%q: %+v %q; want %d %q", c.cmd.Args, exit, out, c.code, c.out)
			}
		}
		if out := keptRun(t, sb, "echo still"); out != "still\n" {
			t.Errorf("after the failures: %q", out)
		}
	})
}

// TestCommandGroupV2: a kept sandbox's command's group in cgroup v2 (not
// every test host has v2 controllers: the unified hierarchy of a hybrid
// host, or v2 itself, has cgroup.kill and cgroup.procs all the same):
// a process places itself through a descriptor opened for it, and
// killGroup ends it and what it forked, whatever its session.
func TestCommandGroupV2(t *testing.T) {
	canRun(t)
	root := ""
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := parseMountinfo(strings.NewReader(string(mi)))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			root = m.MountPoint
		}
	}
	if root == "" {
		t.Skip("no cgroup2 hierarchy here")
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.kill")); err != nil {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			t.Skipf("no usable cgroup2 hierarchy at %s", root)
		}
	}
	sbDir := filepath.Join(root, fmt.Sprintf("delegate-test-%d", os.Getpid()))
	if err := os.Mkdir(sbDir, 0o755); err != nil {
		t.Skipf("cannot make a group in %s: %v", root, err)
	}
	cg := cgroupSet{Version: 2, Memory: sbDir, CPU: sbDir, Pids: sbDir, Freezer: sbDir}
	t.Cleanup(func() {
		killGroup(sbDir, 2, 5*time.Second)
		if err := cg.remove(5 * time.Second); err != nil {
			t.Error(err)
		}
	})
	group := cg.commandGroup("ex-0000abcd")
	if err := os.Mkdir(group, 0o755); err != nil {
		t.Fatal(err)
	}
	procsFile, err := os.OpenFile(filepath.Join(group, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The process writes "0" itself (as a command does) before it runs.
	cmd := exec.Command("/bin/sh", "-c", `echo 0 >&3; exec 3>&-; setsid sleep 1000 & sleep 1000`)
	cmd.ExtraFiles = []*os.File{procsFile}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	procsFile.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	if !waitFor(5*time.Second, func() bool { p, _ := cgroupTreeProcs(sbDir); return len(p) == 3 }) {
		p, _ := cgroupTreeProcs(sbDir)
		t.Fatalf("processes in the sandbox's group and below: %v, want the shell and two sleeps", p)
	}
	if p, _ := cg.procs(); len(p) != 3 {
		t.Errorf("the set's processes (below it included): %v", p)
	}
	if left := killGroup(group, 2, 5*time.Second); len(left) != 0 {
		t.Errorf("left after killGroup: %v", left)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("the command's shell outlived killGroup")
	}
	if err := cg.remove(5 * time.Second); err != nil {
		t.Errorf("remove with a command's group below: %v", err)
	}
	if _, err := os.Stat(sbDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox's group is left: %v", err)
	}
}

// TestKeptAccounts: a kept sandbox's commands have the sandbox's own
// passwd and group (its job user named), as a sandbox's one command has.
func TestKeptAccounts(t *testing.T) {
	b := newBackend(t, 0)
	sb := keptSandbox(t, b, time.Now().Add(time.Minute))
	for range 2 {
		if out := keptRun(t, sb, "id -un; id -gn"); out != jobUser+"\n"+jobUser+"\n" {
			t.Errorf("the job's user and group: %q, want %s", out, jobUser)
		}
	}
}

// TestKeptShimsFromTheKeeper: with the C helpers, the shim of a kept
// sandbox's command is a fork of the sandbox's keeper (spawn_shim), not
// a process the server starts; it is known as the command's shim (a
// restarted server finds it by its pid file), the keeper is not, and a
// shim the server starts for a sandbox made without it still works.
func TestKeptShimsFromTheKeeper(t *testing.T) {
	_, sb := cKeptSandbox(t)
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sleep", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := p.(*process).dir
	keeper, err := readPID(filepath.Join(sb.dir, fileShimPID))
	if err != nil {
		t.Fatal(err)
	}
	var shim int
	if !pollUntil(5*time.Second, func() bool {
		shim, err = readPID(filepath.Join(dir, fileShimPID))
		return err == nil
	}) {
		t.Fatalf("the command's shim recorded no pid: %v", err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", shim))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	if fields[1] != fmt.Sprint(keeper) {
		t.Errorf("the shim's parent is %s, not the keeper (%d)", fields[1], keeper)
	}
	if !isShimOf(shim, dir) {
		t.Error("the keeper's fork is not known as the command's shim")
	}
	if isShimOf(keeper, dir) {
		t.Error("the keeper is taken for a command's shim")
	}
	if exit, err := p.Wait(context.Background()); err != nil || exit.Code != 0 {
		t.Fatalf("the command: %+v %v", exit, err)
	}

	// A sandbox whose keeper was not asked to (a state without Spawns, as
	// an earlier server wrote it), found by a server that starts: the
	// server starts the shim.
	st := stateOf(t, sb)
	st.Spawns = false
	if err := writeJSONAtomic(filepath.Join(sb.dir, fileState), st); err != nil {
		t.Fatal(err)
	}
	found, err := sb.b.Recover(context.Background(), sb.id)
	if err != nil {
		t.Fatal(err)
	}
	if out := keptRun(t, found.(*sbox), "echo from a shim the server started"); out != "from a shim the server started\n" {
		t.Fatalf("output %q", out)
	}
}

// TestSpawnShimKeeperGone: a request for a command's shim that finds no
// keeper at the sandbox's socket (it ended after Exec looked) says the
// sandbox is gone, which makes the engine mark it so.
func TestSpawnShimKeeperGone(t *testing.T) {
	dir := t.TempDir()
	// A socket that was bound and closed: its file stays, nobody listens.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(dir, fileControl)}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, d := range []string{dir, t.TempDir()} { // refused; no socket at all
		err := spawnShim(d, "ex-00000000", &plan{Mode: modeCommand}, w)
		if !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), "keeper is gone") {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// TestKeptKilledAtOnce: a command killed right after Exec, before or
// while it starts, ends killed, whichever way the kill meets it (the
// keeper finding the marker after naming the spare's group, the kill
// finding the command in that group, or the shim's answer), and leaves
// nothing running; the sandbox takes the next command.
func TestKeptKilledAtOnce(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		ctx := context.Background()
		for i := range 15 {
			p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", "sleep 300"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Kill(ctx); err != nil {
				t.Fatalf("round %d: Kill: %v", i, err)
			}
			exit, err := p.Wait(ctx)
			if err != nil || !exit.Killed {
				t.Fatalf("round %d: %+v %v", i, exit, err)
			}
		}
		if out := keptRun(t, sb, `ps -eo args | grep -c '^sleep 300' || true`); out != "0\n" {
			t.Errorf("left running: %q", out)
		}
	})
}

// TestKeptExecDirsAhead: each command of a kept sandbox leaves the next
// one's directory, status channel and files its shim and Exec fill made
// (empty: no record, no pid yet), which the next command takes; the sandbox's destruction forgets that
// directory and every process of the sandbox the backend knew.
func TestKeptExecDirsAhead(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		ids, ahead := make([]string, 3), ""
		for i := range ids {
			p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", "echo line > " + StatusFile + "; echo out"}})
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = p.ID()
			if i > 0 && ids[i] != ahead {
				t.Fatalf("command %d is %s, not in the directory made ahead for it, %s", i, ids[i], ahead)
			}
			next := b.live.spare(sb.dir, false)
			if next == "" || next == ids[i] {
				t.Fatalf("command %d (%s): the next command's directory is %q", i, ids[i], next)
			}
			if _, err := os.Stat(filepath.Join(sb.dir, dirExecs, next)); err != nil {
				t.Fatalf("the next command's directory: %v", err)
			}
			for _, name := range aheadFiles {
				if fi, err := os.Stat(filepath.Join(sb.dir, dirExecs, next, name)); err != nil || fi.Size() != 0 {
					t.Fatalf("the next command's directory: %s is not there, empty: %v %v", name, fi, err)
				}
			}
			if _, err := sb.Process(context.Background(), next); !errors.Is(err, sandbox.ErrGone) {
				t.Fatalf("Process of the next command's id, before it came: %v", err)
			}
			if fi, err := os.Stat(filepath.Join(sb.dir, dirChannel, next)); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
				t.Fatalf("the next command's status channel: %v %v", fi, err)
			}
			if exit, err := p.Wait(context.Background()); err != nil || exit.Code != 0 {
				t.Fatalf("command %d: %+v %v", i, exit, err)
			}
			var rec execRecord
			if err := readJSON(filepath.Join(sb.dir, dirExecs, ids[i], fileExec), &rec); err != nil || rec.ID != ids[i] {
				t.Fatalf("command %d's record: %+v %v", i, rec, err)
			}
			if got, err := sb.Process(context.Background(), ids[i]); err != nil || got.ID() != ids[i] {
				t.Fatalf("Process(%s) = %v, %v", ids[i], got, err)
			}
			events, err := os.ReadFile(filepath.Join(sb.dir, dirExecs, ids[i], fileEvents))
			if err != nil || !strings.Contains(string(events), "line") {
				t.Fatalf("command %d's status line: %q %v", i, events, err)
			}
			ahead = next
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b.live.spare(sb.dir, false) != "" {
			t.Error("the destroyed sandbox's next command directory is remembered")
		}
		b.live.mu.Lock()
		defer b.live.mu.Unlock()
		for d := range b.live.procs {
			if strings.HasPrefix(d, sb.dir) {
				t.Errorf("a process of the destroyed sandbox is remembered: %s", d)
			}
		}
	})
}

// TestOneShotMakesNothingAhead: a backend of a process that serves one
// command line (Config.OneShot, the CLI's exec) makes no directory ahead
// for a next command, which only its memory would know of: a kept
// sandbox's directory gathered one unused per CLI command. Its command
// runs in a directory of its own, and a later command too.
func TestOneShotMakesNothingAhead(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		b.oneShot = true
		for i := range 2 {
			keptRun(t, sb, "echo out")
			if id := b.live.spare(sb.dir, false); id != "" {
				t.Fatalf("command %d: a directory made ahead, %s", i, id)
			}
			entries, err := os.ReadDir(filepath.Join(sb.dir, dirExecs))
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != i+1 {
				t.Fatalf("after %d commands, %d command directories: %v", i+1, len(entries), entries)
			}
			chans, err := os.ReadDir(filepath.Join(sb.dir, dirChannel))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range chans {
				if !strings.HasPrefix(c.Name(), "ex-") {
					continue // the sandbox's own files (its passwd and group)
				}
				if _, err := os.Stat(filepath.Join(sb.dir, dirExecs, c.Name())); err != nil {
					t.Errorf("a status channel without its command: %s", c.Name())
				}
			}
		}
	})
}

// TestKeptSpareGone: a spare that is not in its group when a command
// comes (here: killed; or not placed yet) is not given the command: the
// command is forked as it comes, in a group of its own named after it,
// and a Kill at once still ends it.
func TestKeptSpareGone(t *testing.T) {
	if !haveCHelper {
		t.Skip("the C helpers are not in this build")
	}
	b := newBackend(t, 0)
	if b.cg.Version != 1 {
		t.Skip("spares are cgroup v1's")
	}
	sb := keptSandbox(t, b, time.Now().Add(time.Minute))
	ctx := context.Background()
	keptRun(t, sb, "true") // the first spare became it; the next is made
	killSpare := func() {
		t.Helper()
		var spare int
		if !waitFor(5*time.Second, func() bool {
			pids, err := stateOf(t, sb).Cgroup.procs()
			if err != nil {
				t.Fatal(err)
			}
			for _, pid := range pids {
				if spareGroup(pid) != "" {
					spare = pid
					return true
				}
			}
			return false
		}) {
			t.Fatal("no spare in the sandbox")
		}
		if err := unix.Kill(spare, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Gone, reaped by init: not merely out of its group in
		// /proc/<pid>/cgroup, which shows "/" for a cgroup v1 hierarchy
		// as soon as a process begins to exit, while it is still in
		// the group and its socket still open (a command given to it
		// then ends as it did, killed).
		waitFor(5*time.Second, func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", spare))
			return errors.Is(err, os.ErrNotExist)
		})
	}
	for i := range 3 {
		killSpare()
		p := start(t, sb, "/bin/sh", "-c", "{ grep ':pids:' /proc/self/cgroup || grep '^0::' /proc/self/cgroup; } | cut -d: -f3")
		exit, out := finish(t, p)
		if want := "/" + p.ID() + "\n"; exit.Code != 0 || out != want {
			t.Errorf("round %d: the command's group: %+v %q, want %q", i, exit, out, want)
		}
	}
	killSpare()
	p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", "sleep 300"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if exit, err := p.Wait(wctx); err != nil || !exit.Killed {
		t.Fatalf("killed at once: %+v %v", exit, err)
	}
}

// TestKeptSpareEndsIdle: a kept sandbox's spare waits plan.SpareIdle for
// a command, then ends (issue 41, item 5: a sandbox without commands
// holds its keeper and its init, as bubblewrap holds its two processes);
// the command that comes after is forked as it comes, in a group of its
// own, as is the next, whether the spare made meanwhile takes it or not.
func TestKeptSpareEndsIdle(t *testing.T) {
	if !haveCHelper {
		t.Skip("the C helpers are not in this build")
	}
	b := newBackend(t, 0)
	if b.cg.Version != 1 {
		t.Skip("spares are cgroup v1's")
	}
	// Long enough that the spare is seen before it ends, under load too.
	b.plans.spareIdle = 2 * time.Second
	sb := keptSandbox(t, b, time.Now().Add(time.Minute))
	spare := func() int {
		pids, err := stateOf(t, sb).Cgroup.procs()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if spareGroup(pid) != "" {
				return pid
			}
		}
		return 0
	}
	keptRun(t, sb, "true") // the first spare became it; the next is made
	if !waitFor(5*time.Second, func() bool { return spare() != 0 }) {
		t.Fatal("no spare after the first command")
	}
	if !waitFor(20*time.Second, func() bool { return spare() == 0 }) {
		t.Fatal("the spare is there 20 s on, its idle time 2 s")
	}
	for i := range 2 {
		p := start(t, sb, "/bin/sh", "-c", "grep ':pids:' /proc/self/cgroup | cut -d: -f3")
		exit, out := finish(t, p)
		if want := "/" + p.ID() + "\n"; exit.Code != 0 || out != want {
			t.Errorf("command %d: its group: %+v %q, want %q", i, exit, out, want)
		}
	}
}

// TestKeptKeeperOutOfDescriptors: a command the C keeper cannot make
// pipes for (its descriptor limit reached) fails with the reason, the
// sandbox runs the next command once the keeper has room again, and the
// keeper keeps no descriptor of the failed one.
func TestKeptKeeperOutOfDescriptors(t *testing.T) {
	_, sb := cKeptSandbox(t)
	keptRun(t, sb, "true") // the keeper's spare and the like are made
	keeper, err := readPID(filepath.Join(sb.dir, fileShimPID))
	if err != nil {
		t.Fatal(err)
	}
	all := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", keeper))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// A command's shim waits for the next command once its own has ended,
	// and the keeper holds its end of the shim's socket (shim_idle): one
	// for each of the keeper's children but init. own counts the rest;
	// a shim between its command's end and its word to the keeper makes
	// it one lower for a moment.
	shims := func() int {
		procs, _ := os.ReadDir("/proc")
		k := 0
		for _, e := range procs {
			if pid, err := strconv.Atoi(e.Name()); err == nil && parentOf(pid) == keeper {
				k++
			}
		}
		return k - 1 // init
	}
	own := func() int { return all() - shims() }
	var before unix.Rlimit
	if err := unix.Prlimit(keeper, unix.RLIMIT_NOFILE, nil, &before); err != nil {
		t.Fatal(err)
	}
	n := own()
	// The request brings two descriptors (the plan, the server's pipe)
	// and the output pipe two more: the stderr pipe finds no room (or,
	// with another shim waiting by then, the stdout pipe; with one gone,
	// the ctl pair). The limit bounds descriptors' numbers, not their
	// count: it leaves five numbers free below it (the keeper holds some
	// above, and frees and takes waiting shims' in between).
	used := map[int]bool{}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", keeper))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		used[fd] = true
	}
	limit := 0
	for free := 0; free < 5; limit++ {
		if !used[limit] {
			free++
		}
	}
	lim := unix.Rlimit{Cur: uint64(limit), Max: before.Max}
	if err := unix.Prlimit(keeper, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	const failures = 4
	for range failures {
		exit, out := run(t, sb, "/bin/true")
		if exit.Code == 0 || !strings.Contains(exit.Reason+out, "too many open files") {
			unix.Prlimit(keeper, unix.RLIMIT_NOFILE, &before, nil)
			t.Fatalf("a command without room for its pipes: %+v %q", exit, out)
		}
	}
	if err := unix.Prlimit(keeper, unix.RLIMIT_NOFILE, &before, nil); err != nil {
		t.Fatal(err)
	}
	keptRun(t, sb, "true")
	// A descriptor left by each failed command would be 4 more.
	if !waitFor(5*time.Second, func() bool { return own() <= n+1 }) {
		t.Errorf("the keeper holds %d descriptors of its own after %d failed commands, %d before", own(), failures, n)
	}
}

// TestKeptExitToldFirst: the C shim of a kept sandbox's command tells the
// server how the command ended on its pipe and closes it before it writes
// exit.json: Wait takes that record (here with the file gone), and the
// file, once written, says the same.
func TestKeptExitToldFirst(t *testing.T) {
	b, sb := cKeptSandbox(t)
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", "echo out; exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	proc := p.(*process)
	select {
	case <-proc.recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the command's end was not recorded")
	}
	var told exitRecord
	if err := json.Unmarshal(proc.toldExit(), &told); err != nil {
		t.Fatalf("the shim's pipe: %q: %v", proc.toldExit(), err)
	}
	if told.Code != 7 || told.OutputBytes != 4 {
		t.Errorf("told %+v, want code 7 and 4 bytes of output", told)
	}
	// The file comes after the pipe is closed.
	var file exitRecord
	if !pollUntil(5*time.Second, func() bool { return readJSON(proc.path(fileExit), &file) == nil }) || file != told {
		t.Errorf("exit.json %+v, told %+v", file, told)
	}
	os.Remove(proc.path(fileExit))
	exit, err := p.Wait(context.Background())
	if err != nil || exit.Code != 7 || exit.OutputBytes != 4 {
		t.Errorf("Wait without exit.json: %+v %v", exit, err)
	}
	// The backend forgets the ended command (a later Process reads its
	// directory).
	if !pollUntil(5*time.Second, func() bool {
		return b.live.get(proc.dir) == nil
	}) {
		t.Error("the backend still holds the ended command")
	}
}

// TestSpareOpsLeadCommandPlans: the steps a kept sandbox's spare takes
// before its command comes (the keeper's plan's SpareOps) are the first
// Ahead steps of every command's plan, with a trust bundle and without,
// and the command's own steps (its channel, its inputs, the seccomp
// filter) come after them: the C spare skips what it took.
func TestSpareOpsLeadCommandPlans(t *testing.T) {
	be := newBackend(t, 0)
	dir := t.TempDir()
	for _, trust := range []bool{false, true} {
		st := sandboxState{Cgroup: cgroupSet{Version: 1}}
		if trust {
			st.Proxy = &proxyState{Trust: true}
		}
		kp, err := be.plans.keeperPlan(dir, st)
		if err != nil {
			t.Fatal(err)
		}
		cmd := sandbox.Command{Args: []string{"/bin/true"}, Inputs: map[string][]byte{"in.txt": []byte("x")}}
		ep := be.plans.execPlan(dir, st, execRecord{ID: "ex-0123abcd", Args: cmd.Args}, cmd)
		if ep.Ahead == 0 || int(ep.Ahead) != len(kp.SpareOps) {
			t.Fatalf("trust %v: %d steps ahead, the spare has %d", trust, ep.Ahead, len(kp.SpareOps))
		}
		if !reflect.DeepEqual(ep.Ops[:ep.Ahead], kp.SpareOps) {
			t.Errorf("trust %v: the command's first steps\n%+v\nare not the spare's\n%+v", trust, ep.Ops[:ep.Ahead], kp.SpareOps)
		}
		for _, o := range ep.Ops[:ep.Ahead] {
			if o.code == opSeccomp || o.code == opInput || strings.Contains(strings.Join(o.s[:], " "), "ex-0123abcd") {
				t.Errorf("trust %v: step %q, which depends on the command, is taken ahead", trust, o.label)
			}
		}
		after := map[opCode]bool{}
		for _, o := range ep.Ops[ep.Ahead:] {
			after[o.code] = true
		}
		for _, c := range []opCode{opBindKept, opInput, opSeccomp} {
			if !after[c] {
				t.Errorf("trust %v: no step %d after the ones taken ahead", trust, c)
			}
		}
	}
}

// TestKeptShimServesInTurn: a command's shim, once its command is
// recorded and its output closed, supervises the sandbox's next command
// (shim_idle in command_linux.c): each command still gets its own output,
// exit code and log; a command whose background process holds its output
// keeps its shim, and the next gets another; a shim is counted once in
// the supervisors' memory however many commands it served.
func TestKeptShimServesInTurn(t *testing.T) {
	b, sb := cKeptSandbox(t)
	shimOf := func(p sandbox.Process) int {
		t.Helper()
		pid, err := readPID(filepath.Join(p.(*process).dir, fileShimPID))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	runOne := func(script string) (sandbox.Process, sandbox.Exit, string) {
		t.Helper()
		p := start(t, sb, "/bin/sh", "-c", script)
		exit, out := finish(t, p)
		return p, exit, out
	}
	first, exit, out := runOne("echo one")
	if exit.Code != 0 || out != "one\n" {
		t.Fatalf("first: %+v %q", exit, out)
	}
	shim := shimOf(first)
	// The shim goes idle a moment after it told the server.
	var second sandbox.Process
	if !pollUntil(5*time.Second, func() bool {
		p, exit, out := runOne("echo two >&2; exit 3")
		if exit.Code != 3 || out != "two\n" {
			t.Fatalf("second: %+v %q", exit, out)
		}
		second = p
		return shimOf(p) == shim
	}) {
		t.Fatalf("no command was supervised by the first one's shim (%d)", shim)
	}
	// Its end is told the server first, then written down.
	if !pollUntil(5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(second.(*process).dir, fileExit))
		return err == nil
	}) {
		t.Error("the second command's end is not recorded in its own directory")
	}
	// A command that leaves a process holding its output keeps its shim.
	held, exit, _ := runOne("sleep 30 & echo held")
	if exit.Code != 0 {
		t.Fatalf("held: %+v", exit)
	}
	_, exit, out = runOne("echo four")
	if exit.Code != 0 || out != "four\n" {
		t.Fatalf("fourth: %+v %q", exit, out)
	}
	if _, alive := shimAlive(held.(*process).dir); !alive {
		t.Error("the shim of the command whose output is held ended")
	}
	m, err := b.SupervisorMemory()
	if err != nil {
		t.Fatal(err)
	}
	// The keeper, init, the held command's shim, init's spare (unless it
	// is being made) and at most IDLE_SHIMS (2) waiting shims, each once
	// (a shim is named by the directory of each command it served).
	if m.Processes < 3 || m.Processes > 6 {
		t.Errorf("%d supervisor processes counted, want 3 to 6", m.Processes)
	}
}

// TestKeptLongDataDir: a data directory whose control socket's path is
// longer than a socket address holds still gets its commands to the
// keeper (spawnShim addresses the socket through the directory's
// descriptor then).
func TestKeptLongDataDir(t *testing.T) {
	if !haveCHelper {
		t.Skip("the C helpers are not in this build")
	}
	canRun(t)
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	b, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sb := keptSandbox(t, b, time.Now().Add(time.Minute))
	if n := len(sb.path(fileControl)); n < len(unix.RawSockaddrUnix{}.Path) {
		t.Fatalf("the control socket's path has %d bytes: not too long for an address", n)
	}
	for i := range 2 {
		if out := keptRun(t, sb, fmt.Sprintf("echo %d", i)); out != fmt.Sprintf("%d\n", i) {
			t.Errorf("command %d: output %q", i, out)
		}
	}
}

// TestShimsHoldNothingInherited: a descriptor the server inherited
// without close-on-exec (a script's lock, say) does not live on in its
// sandboxes' shims and keepers, which outlive the server: an engine
// test's kept sandbox held the lock of the script that ran the tests,
// and every later run of it waited.
func TestShimsHoldNothingInherited(t *testing.T) {
	stray := filepath.Join(t.TempDir(), "stray")
	if err := os.WriteFile(stray, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(stray, unix.O_RDONLY, 0) // no O_CLOEXEC: every child inherits it
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	holds := func(pid int) bool {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range ents {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); l == stray {
				return true
			}
		}
		return false
	}
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			kept := keptSandbox(t, b, time.Now().Add(time.Minute))
			keeper, err := readPID(filepath.Join(kept.dir, fileShimPID))
			if err != nil {
				t.Fatal(err)
			}
			if holds(keeper) {
				t.Errorf("the keeper holds a descriptor the server inherited")
			}
			sb := create(t, b, defaultSpec())
			p := start(t, sb, "/bin/sh", "-c", "sleep 5")
			defer p.Kill(context.Background())
			// Once it has started init, the shim is past its start.
			var shim int
			if !waitFor(10*time.Second, func() bool {
				_, ierr := readPID(filepath.Join(sb.dir, fileInitPID))
				shim, err = readPID(filepath.Join(sb.dir, fileShimPID))
				return ierr == nil && err == nil
			}) {
				t.Fatal("no shim, or no init")
			}
			if holds(shim) {
				t.Errorf("the shim holds a descriptor the server inherited")
			}
		})
	}
}

// TestKeptHelpersLean: a kept sandbox's C helpers (keeper, init, the
// spare, the last command's idle shim) that have waited a while
// (lean_poll) hold none of the binary's file-backed data pages but the
// few it may have written: the kernel maps 64 KiB around each page a
// helper reads, and the 50 MB
// binary's data so came to ~200 KiB in each of them, shared among them
// only: more than the rest of a kept sandbox (issue 41, item 5).
func TestKeptHelpersLean(t *testing.T) {
	_, sb := cKeptSandbox(t)
	keptRun(t, sb, "sleep 300 >/dev/null 2>&1 &")
	keeper, err := readPID(filepath.Join(sb.dir, fileShimPID))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	if !waitFor(20*time.Second, func() bool {
		held = held[:0]
		helpers := descendantsRunning(keeper, exe)
		for _, pid := range helpers {
			// At most the pages lean_poll keeps, clean or not: the GOT's
			// and those of the C variables with initial values.
			if kib := fileDataKiB(t, pid, exe); kib > 16 {
				held = append(held, fmt.Sprintf("%d: %d KiB", pid, kib))
			}
		}
		return len(helpers) >= 2 && len(held) == 0
	}) {
		t.Fatalf("helpers of the kept sandbox holding file pages of the binary's writable data 20 s after its command: %v", held)
	}
}

// descendantsRunning lists pid and its descendants that run exe.
func descendantsRunning(pid int, exe string) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		if pp, err := strconv.Atoi(fields[1]); err == nil {
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for a := p; a > 1; a = parent[a] {
			if a == pid {
				if path, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p)); err == nil && path == exe {
					out = append(out, p)
				}
				break
			}
		}
	}
	return out
}

// fileDataKiB is how much of exe's writable mappings pid holds that is
// the file's content (Rss less Anonymous in its smaps).
func fileDataKiB(t *testing.T, pid int, exe string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0 // it ended
	}
	in, kib := false, 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 6 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			in = f[1] == "rw-p" && f[5] == exe
		case in && len(f) == 3 && f[0] == "Rss:":
			n, _ := strconv.Atoi(f[1])
			kib += n
		case in && len(f) == 3 && f[0] == "Anonymous:":
			n, _ := strconv.Atoi(f[1])
			kib -= n
		}
	}
	return kib
}
