//go:build linux

package local

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// helperModes are the helpers this binary has: the C ones (cgo builds)
// and the Go ones. The whole suite runs with the default (C where built
// in; scripts/test also runs it without cgo); TestHelpers runs the same
// sandbox lives with each, so both are always tested.
func helperModes() []string {
	if haveCHelper {
		return []string{"C", "Go"}
	}
	return []string{"Go"}
}

func TestHelpers(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			t.Run("isolation", func(t *testing.T) {
				exit, out := sh(t, b, `id -u; id -G; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
					set -- $(tr '\0' ' ' < /proc/1/cmdline); echo "pid1=$*"; hostname; ls /dev | tr '\n' ' '; echo
					touch /usr/x 2>/dev/null || echo ro; echo w > /workspace/w && echo w > /tmp/w && echo rw
					if [ -e /var ] || [ -e `+b.dir+` ]; then echo SEEN; fi; ulimit -c; echo "umask $(umask)"`)
				if exit.Code != 0 || strings.Contains(out, "SEEN") {
					t.Errorf("exit %+v:\n%s", exit, out)
				}
				wantContains(t, out, "1000\n1000\n", "CapEff:\t0000000000000000\n", "CapBnd:\t0000000000000000\n",
					"NoNewPrivs:\t1\n", "Seccomp:\t2\n", "pid1=delegate-sandbox-init "+initCommand+"\n", "sandbox\n",
					"fd full null random shm stderr stdin stdout tty urandom zero \n", "ro\nrw\n", "0\n", "umask 0022\n")
			})
			t.Run("exit, signal, lookup", func(t *testing.T) {
				for _, c := range []struct {
					args []string
					code int
					sig  string
					out  string
				}{
					{[]string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 3, "", "out\nerr\n"},
					{[]string{"/bin/sh", "-c", "kill -TERM $$"}, 143, "terminated", ""},
					{[]string{"no-such-command"}, codeNotFound, "", setupPrefix + `"no-such-command": command not found in PATH "/usr/local/bin:/usr/bin:/bin"` + "\n"},
					{[]string{"/etc/passwd"}, codeCannotExec, "", setupPrefix + `cannot run "/etc/passwd": permission denied` + "\n"},
				} {
					before := time.Now()
					exit, out := run(t, create(t, b, defaultSpec()), c.args...)
					if exit.Code != c.code || exit.Signal != c.sig || out != c.out || exit.OutputBytes != int64(len(out)) {
						t.Errorf("%q: exit %+v, output %q; want %d %q %q", c.args, exit, out, c.code, c.sig, c.out)
					}
					// When it ended, as the shim recorded it (for a
					// server that adopts the job later, issue 35).
					if exit.EndedAt.Before(before) || exit.EndedAt.After(time.Now()) {
						t.Errorf("%q: ended at %v, not between its start (%v) and now", c.args, exit.EndedAt, before)
					}
				}
			})
			t.Run("stdout and stderr apart", func(t *testing.T) {
				// Byte-exact, each in its stream, and in the order written:
				// stdout before stderr when both are ready (the shim's
				// order), a pause before each later switch.
				p := start(t, create(t, b, defaultSpec()), "/bin/sh", "-c",
					`echo out; echo err >&2; sleep 0.3; printf 'no newline'; sleep 0.3; printf '\001\000\377' >&2; sleep 0.3; echo end`)
				exit, out := finishTagged(t, p)
				want := "[stdout]out\n[stderr]err\n[stdout]no newline[stderr]\x01\x00\xff[stdout]end\n"
				if exit.Code != 0 || out != want || exit.OutputBytes != 25 {
					t.Errorf("exit %+v, output %q; want %q", exit, out, want)
				}
				// Read from inside a piece, a few bytes at a time.
				var all []sandbox.Output
				for off := int64(2); ; off += 5 {
					outs, err := p.ReadOutput(context.Background(), off, 5)
					if err != nil || len(outs) == 0 {
						break
					}
					for _, o := range outs {
						all = sandbox.Append(all, o.Stream, o.Data)
					}
				}
				if got := tagged(all); got != "[stdout]t\n"+strings.TrimPrefix(want, "[stdout]out\n") {
					t.Errorf("read 5 bytes at a time from 2: %q", got)
				}
				exit, out = run(t, create(t, b, defaultSpec()), "/bin/sh", "-c", "echo only >&2; exit 4")
				if exit.Code != 4 || out != "only\n" {
					t.Errorf("exit %+v, output %q", exit, out)
				}
				// Without a pause: the stream written to first is read first
				// (the shims read in the order the pipes became ready).
				exit, out = finishTagged(t, start(t, create(t, b, defaultSpec()), "/bin/sh", "-c", "echo err >&2; echo out"))
				if want := "[stderr]err\n[stdout]out\n"; exit.Code != 0 || out != want {
					t.Errorf("exit %+v, output %q; want %q", exit, out, want)
				}
			})
			t.Run("stream records bounded", func(t *testing.T) {
				// A job that switches stream at every write: past
				// maxStreamRecords the rest is Combined, and no byte is lost.
				sb := create(t, b, defaultSpec())
				p, err := sb.Exec(context.Background(), sandbox.Command{
					Args: []string{"/bin/sh", "-c", `i=0; while [ $i -lt 400 ]; do printf o; sleep 0.001; printf e >&2; sleep 0.001; i=$((i+1)); done`},
					Env:  testEnv, OutputLimit: 16 << 10, // 256 records at most
				})
				if err != nil {
					t.Fatal(err)
				}
				exit, _ := finish(t, p)
				outs, err := p.ReadOutput(context.Background(), 0, 1<<20)
				if err != nil || exit.Code != 0 || exit.OutputBytes != 800 {
					t.Fatalf("exit %+v, %v", exit, err)
				}
				all := string(sandbox.Join(outs))
				last := outs[len(outs)-1]
				if len(outs) != 256 || last.Stream != sandbox.Combined || strings.Count(all, "o") != 400 || strings.Count(all, "e") != 400 {
					t.Errorf("%d pieces (want 256), the last %s (want combined): %.300q", len(outs), last.Stream, tagged(outs))
				}
				if fi, err := os.Stat(sb.path(fileStreams)); err != nil {
					t.Error(err)
				} else if fi.Size() != 256*streamRecordSize {
					t.Errorf("stream records: %d bytes, want %d", fi.Size(), 256*streamRecordSize)
				}
			})
			t.Run("output limit and status lines", func(t *testing.T) {
				sb := create(t, b, defaultSpec())
				p, err := sb.Exec(context.Background(), sandbox.Command{
					Args: []string{"/bin/sh", "-c", `echo step1 > $DELEGATE_STATUS_FILE; i=0; while [ $i -lt 1000 ]; do echo 0123456789; i=$((i+1)); done`},
					Env:  []string{"PATH=/usr/bin:/bin", "DELEGATE_STATUS_FILE=" + StatusFile}, OutputLimit: 25,
				})
				if err != nil {
					t.Fatal(err)
				}
				exit, out := finish(t, p)
				ev, _ := p.ReadEvents(context.Background(), 0, 100)
				if exit.Code != 0 || !exit.Truncated || exit.OutputBytes != 11000 || out != "0123456789\n0123456789\n012" || string(ev) != "step1\n" {
					t.Errorf("exit %+v, output %q, events %q", exit, out, ev)
				}
			})
			t.Run("status flood keeps the latest line", func(t *testing.T) {
				p := start(t, create(t, b, defaultSpec()), "/bin/sh", "-c",
					`yes flood | head -n 200000 > `+StatusFile+`; printf 'the end\nno newline' > `+StatusFile)
				if exit, _ := finish(t, p); exit.Code != 0 {
					t.Fatalf("exit %+v", exit)
				}
				ev, _ := p.ReadEvents(context.Background(), 0, 2<<20)
				kept := maxEventsBytes / len("flood\n")
				line, count, err := p.(sandbox.LatestEvent).LatestEvent(context.Background())
				if len(ev) != kept*len("flood\n") || line != "no newline" || count != int64(200000-kept+2) || err != nil {
					t.Errorf("events %d bytes (want %d), latest %q after %d lines (want %d), %v", len(ev), kept*len("flood\n"), line, count, 200000-kept+2, err)
				}
			})
			t.Run("deadline", func(t *testing.T) {
				sb := create(t, b, defaultSpec())
				p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000"}, Env: testEnv,
					Deadline: time.Now().Add(300 * time.Millisecond)})
				if err != nil {
					t.Fatal(err)
				}
				if exit, _ := finish(t, p); !exit.DeadlineExceeded || !exit.Killed || exit.Code != 137 || exit.Signal != "killed" {
					t.Errorf("exit %+v", exit)
				}
				if pids, err := stateOf(t, sb).Cgroup.procs(); err != nil || len(pids) != 0 {
					t.Errorf("left in the cgroups: %v %v", pids, err)
				}
			})
			t.Run("kill", func(t *testing.T) {
				sb := create(t, b, defaultSpec())
				p := start(t, sb, "/bin/sh", "-c", "sleep 1000 & echo started; wait")
				waitFor(10*time.Second, func() bool { out, _ := p.ReadOutput(context.Background(), 0, 10); return len(out) > 0 })
				if err := p.Kill(context.Background()); err != nil {
					t.Fatal(err)
				}
				if exit, _ := finish(t, p); !exit.Killed || exit.Code != 137 {
					t.Errorf("exit %+v", exit)
				}
			})
			t.Run("set-up failure", func(t *testing.T) {
				sb := create(t, b, defaultSpec())
				if err := os.Remove(sb.path(dirRootfs)); err != nil {
					t.Fatal(err)
				}
				exit, out := finishTagged(t, start(t, sb, "/bin/echo", "should not run"))
				want := "[stderr]" + setupPrefix + "mount root tmpfs: no such file or directory\n"
				if exit.Code != codeSetupFailed || out != want || exit.Reason != strings.TrimSpace(strings.TrimPrefix(want, "[stderr]"+setupPrefix)) {
					t.Errorf("exit %+v, output %q; want %q", exit, out, want)
				}
			})
		})
	}
}

// TestShimWithoutPlan: a shim whose server went away before it sent the
// plan records that, with either helper.
func TestShimWithoutPlan(t *testing.T) {
	canRun(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			cmd := exec.Command(self, shimCommand, dir)
			cmd.Env = helperEnv(mode == "C")
			cmd.Dir = dir
			cmd.ExtraFiles = []*os.File{r}
			logged, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("shim: %v: %s", err, logged)
			}
			if mode == "C" {
				// The C shim writes its own log, made with its first message.
				logged, _ = os.ReadFile(filepath.Join(dir, fileShimLog))
			}
			if !strings.Contains(string(logged), "no plan") {
				t.Errorf("the shim's log does not say why: %q", logged)
			}
			var rec exitRecord
			if err := readJSON(filepath.Join(dir, fileExit), &rec); err != nil {
				t.Fatal(err)
			}
			out, _ := os.ReadFile(filepath.Join(dir, fileOutput))
			if rec.Code != codeSetupFailed || !strings.Contains(rec.Reason, "no plan") || !strings.HasPrefix(string(out), setupPrefix+"no plan") {
				t.Errorf("exit record %+v, output %q", rec, out)
			}
			// The sandbox's own words are on the job's stderr.
			outs, err := splitStreams(filepath.Join(dir, fileStreams), 0, out)
			if err != nil || len(outs) != 1 || outs[0].Stream != sandbox.Stderr {
				t.Errorf("streams of the output: %q, %v", tagged(outs), err)
			}
		})
	}
}

// TestJobDescriptors: the job holds its stdin, stdout and stderr and
// nothing else, even when the server itself was given descriptors
// without close-on-exec (a parent that leaks them: a shell, an MCP
// client). A directory descriptor of the host's root would let the job
// out of its root; a pipe would be shared by every sandbox.
func TestJobDescriptors(t *testing.T) {
	canRun(t)
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0) // no O_CLOEXEC: leaked on purpose
	if err != nil {
		t.Fatal(err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(root); unix.Close(p[0]); unix.Close(p[1]) })
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			// The shell's descriptors, listed while it waits for ls alone
			// (a pipeline or a redirection would hold one of its own).
			exit, out := sh(t, b, `ls /proc/$$/fd; ls /proc/$$/fd/`+strconv.Itoa(root)+`/ 2>/dev/null || true`)
			if exit.Code != 0 || out != "0\n1\n2\n" {
				t.Errorf("the job's descriptors (want 0 1 2, and no view of the host's root through %d): exit %+v\n%s", root, exit, out)
			}
		})
	}
}

// TestJobSignalDispositions: the job starts with every signal at its
// default disposition, whatever the server ignored (a server started
// with nohup, or in the background by a shell, ignores SIGHUP or
// SIGINT, and ignored signals survive exec).
func TestJobSignalDispositions(t *testing.T) {
	canRun(t)
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
	t.Cleanup(func() { signal.Reset(syscall.SIGHUP, syscall.SIGINT) })
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			exit, out := sh(t, b, `grep -E '^Sig(Ign|Blk):' /proc/self/status`)
			if want := "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"; exit.Code != 0 || out != want {
				t.Errorf("exit %+v, output %q; want %q", exit, out, want)
			}
		})
	}
}
