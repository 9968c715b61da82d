//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

func TestKill(t *testing.T) {
	b := newBackend(t, 0)
	tests := []struct {
		name string
		// ready says when to kill; nil: right after Exec, racing the start.
		ready func(sb *sbox) bool
	}{
		{"running job with children", func(sb *sbox) bool {
			pids, _ := stateOf(t, sb).Cgroup.procs()
			return len(pids) >= 4 // init, sh, two sleeps
		}},
		{"right after Exec", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := create(t, b, defaultSpec())
			st := stateOf(t, sb)
			p := start(t, sb, "/bin/sh", "-c", "sleep 1000 & sleep 1000 & echo started; wait")
			if tt.ready != nil && !waitFor(10*time.Second, func() bool { return tt.ready(sb) }) {
				t.Fatal("the job's processes never appeared in its cgroup")
			}
			if err := p.Kill(context.Background()); err != nil {
				t.Fatalf("Kill: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			exit, err := p.Wait(ctx)
			if err != nil {
				t.Fatalf("Wait after Kill: %v", err)
			}
			if !exit.Killed || exit.Code != 137 || exit.Signal != "killed" {
				t.Errorf("exit = %+v, want Killed, 137, killed", exit)
			}
			if pids, err := st.Cgroup.procs(); err != nil || len(pids) != 0 {
				t.Errorf("processes left in the sandbox cgroup after Wait: %v %v", pids, err)
			}
			if err := p.Kill(context.Background()); err != nil {
				t.Errorf("second Kill: %v", err)
			}
		})
	}

	t.Run("after a normal exit", func(t *testing.T) {
		sb := create(t, b, defaultSpec())
		p := start(t, sb, "/bin/true")
		exit, _ := finish(t, p)
		if err := p.Kill(context.Background()); err != nil {
			t.Errorf("Kill after exit: %v", err)
		}
		again, err := p.Wait(context.Background())
		if err != nil || !reflect.DeepEqual(again, exit) || exit.Killed || exit.Code != 0 {
			t.Errorf("Wait after Kill after exit = %+v, %v; first %+v", again, err, exit)
		}
	})
}

// TestJobEndKillsLeftovers: when the job's main process exits, what it
// left running in the background dies with the sandbox's pid 1.
func TestJobEndKillsLeftovers(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	exit, out := run(t, sb, "/bin/sh", "-c", "sleep 1000 & echo bye")
	if exit.Code != 0 || out != "bye\n" {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	if pids, _ := stateOf(t, sb).Cgroup.procs(); len(pids) != 0 {
		t.Errorf("background processes survived the job: %v", pids)
	}
}

func TestRecover(t *testing.T) {
	dir := t.TempDir()
	canRun(t)
	b1, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("re-attach to a running job", func(t *testing.T) {
		sb, err := b1.Create(ctx, defaultSpec())
		if err != nil {
			t.Fatal(err)
		}
		defer b1.Destroy(ctx, sb.ID())
		p := start(t, sb, "/bin/sh", "-c", "sleep 2; echo done")
		id, execID := sb.ID(), p.ID()

		// A new Backend value on the same directory is a restarted server:
		// it has no child to wait for and must poll.
		b2, err := New(Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		ids, err := b2.List(ctx)
		if err != nil || !listed(ids, id) {
			t.Fatalf("List = %v, %v; want %s in it", ids, err, id)
		}
		for _, in := range ids {
			if in.ID == id && in.JobID != defaultSpec().JobID {
				t.Fatalf("List names job %q for %s, want %q", in.JobID, id, defaultSpec().JobID)
			}
		}
		sb2, err := b2.Recover(ctx, id)
		if err != nil {
			t.Fatalf("Recover: %v", err)
		}
		p2, err := sb2.Process(ctx, execID)
		if err != nil {
			t.Fatalf("Process: %v", err)
		}
		if p2.(*process).done != nil {
			t.Fatal("the recovered process claims to be our child")
		}
		exit, out := finish(t, p2)
		if exit.Code != 0 || out != "done\n" {
			t.Errorf("recovered exit %+v, output %q; want 0, done", exit, out)
		}
		if _, err := sb2.Process(ctx, "ex-00000000"); !errors.Is(err, sandbox.ErrGone) {
			t.Errorf("Process(unknown id): err = %v, want ErrGone", err)
		}
	})

	t.Run("shim killed", func(t *testing.T) {
		sb, err := b1.Create(ctx, defaultSpec())
		if err != nil {
			t.Fatal(err)
		}
		defer b1.Destroy(ctx, sb.ID())
		p := start(t, sb, "/bin/sh", "-c", "sleep 1000")
		dir := sb.(*sbox).dir
		var shim, init int
		if !waitFor(10*time.Second, func() bool {
			shim, _ = readPID(filepath.Join(dir, fileShimPID))
			init, _ = readPID(filepath.Join(dir, fileInitPID))
			return shim > 0 && init > 0
		}) {
			t.Fatal("no shim or init pid recorded")
		}
		syscall.Kill(shim, syscall.SIGKILL)
		syscall.Kill(init, syscall.SIGKILL)

		b2, err := New(Config{Dir: filepath.Dir(dir)})
		if err != nil {
			t.Fatal(err)
		}
		sb2, err := b2.Recover(ctx, sb.ID())
		if err != nil {
			t.Fatal(err)
		}
		p2, err := sb2.Process(ctx, p.ID())
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if exit, err := p2.Wait(wctx); err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "shim") {
			t.Errorf("Wait on a sandbox whose shim was killed = %+v, %v; want an error about the shim", exit, err)
		}
		// The original (child) handle says the same.
		if exit, err := p.Wait(wctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait on the child handle = %+v, %v; want an error", exit, err)
		}
	})

	t.Run("gone", func(t *testing.T) {
		for _, id := range []string{"sb-000000000000", "../etc", "", "sb-0123456789ab/.."} {
			if _, err := b1.Recover(ctx, id); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("Recover(%q): err = %v, want ErrGone", id, err)
			}
		}
	})
}

// assertNoTrace checks that nothing of a destroyed sandbox is left.
func assertNoTrace(t *testing.T, b *Backend, id string, st sandboxState) {
	t.Helper()
	dir := filepath.Join(b.dir, id)
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), id) {
		t.Errorf("mounts of %s left:\n%s", id, mounts)
	}
	for _, d := range st.Cgroup.dirs() {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left (%v)", d, err)
		}
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox directory left (%v)", err)
	}
	ids, err := b.List(context.Background())
	if err != nil || listed(ids, id) {
		t.Errorf("List = %v, %v; still has %s", ids, err, id)
	}
}

func TestDestroy(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, sb *sbox)
	}{
		{"unused", func(t *testing.T, sb *sbox) {}},
		{"after a job", func(t *testing.T, sb *sbox) { run(t, sb, "/bin/true") }},
		{"while a job runs", func(t *testing.T, sb *sbox) {
			start(t, sb, "/bin/sh", "-c", "sleep 1000 & sleep 1000")
			waitFor(5*time.Second, func() bool { pids, _ := stateOf(t, sb).Cgroup.procs(); return len(pids) >= 3 })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sbi, err := b.Create(ctx, defaultSpec())
			if err != nil {
				t.Fatal(err)
			}
			sb := sbi.(*sbox)
			st := stateOf(t, sb)
			if err := sb.WriteFile(ctx, "/workspace/f", []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, sb)
			if err := b.Destroy(ctx, sb.id); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			assertNoTrace(t, b, sb.id, st)
			if err := b.Destroy(ctx, sb.id); err != nil {
				t.Errorf("second Destroy: %v", err)
			}
			if err := sb.Destroy(ctx); err != nil {
				t.Errorf("Sandbox.Destroy after Backend.Destroy: %v", err)
			}
			if _, err := b.Recover(ctx, sb.id); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("Recover after Destroy: %v, want ErrGone", err)
			}
			if _, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}}); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("Exec after Destroy: %v, want ErrGone", err)
			}
			if err := sb.WriteFile(ctx, "/workspace/f", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("WriteFile after Destroy: %v, want ErrGone", err)
			}
		})
	}
	if err := b.Destroy(ctx, "../../etc"); err == nil {
		t.Error("Destroy of a path-like id succeeded")
	}
}

// TestCreateRollback makes Create fail after the workspace is mounted and
// some cgroups exist, and checks that nothing is left.
func TestCreateRollback(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	good := b.cg
	b.cg.Pids = filepath.Join(t.TempDir(), "not-a-cgroup") // the last group to be made
	_, err := b.Create(ctx, defaultSpec())
	b.cg = good
	if err == nil {
		t.Fatal("Create succeeded with a broken cgroup layout")
	}
	id := regexp.MustCompile(`sb-[0-9a-f]{12}`).FindString(err.Error())
	if id == "" {
		t.Fatalf("the error does not name the sandbox: %v", err)
	}
	if ids, _ := b.List(ctx); len(ids) != 0 {
		t.Errorf("List after a failed Create = %v", ids)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) != 0 {
		t.Errorf("left in the state directory: %v", ents)
	}
	for _, parent := range []string{good.Memory, good.CPU} {
		if _, err := os.Stat(filepath.Join(parent, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left behind (%v)", filepath.Join(parent, id), err)
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), id) {
		t.Errorf("mounts of %s left", id)
	}
}

func TestCreateValidation(t *testing.T) {
	b := newBackend(t, 0)
	b.roots.rootfsDir = t.TempDir()
	os.WriteFile(filepath.Join(b.roots.rootfsDir, "file"), nil, 0o644)
	os.Mkdir(filepath.Join(b.roots.rootfsDir, "empty"), 0o755)
	tests := []struct {
		name string
		edit func(*sandbox.Spec)
		want string
	}{
		{"no memory", func(s *sandbox.Spec) { s.MemoryBytes = 0 }, "memory"},
		{"no disk", func(s *sandbox.Spec) { s.DiskBytes = 0 }, "disk"},
		{"negative cpu", func(s *sandbox.Spec) { s.CPU = -1 }, "cpu"},
		{"unknown template", func(s *sandbox.Spec) { s.Template = "rootfs" }, `no root filesystem "rootfs"`},
		{"template path", func(s *sandbox.Spec) { s.Template = "/nonexistent/rootfs" }, "not a path"},
		{"template is a file", func(s *sandbox.Spec) { s.Template = "file" }, "not a directory"},
		{"template without a shell", func(s *sandbox.Spec) { s.Template = "empty" }, "bin/sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := defaultSpec()
			tt.edit(&spec)
			sb, err := b.Create(context.Background(), spec)
			if err == nil {
				sb.Destroy(context.Background())
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
	if ids, _ := b.List(context.Background()); len(ids) != 0 {
		t.Errorf("failed Creates left sandboxes: %v", ids)
	}
}

// buildRootfs makes a tiny root filesystem from the host's /bin/sh and the
// libraries ldd says it needs, plus a marker file, as "rootfs" in a new
// directory (see useRootfs).
func buildRootfs(t *testing.T) string {
	t.Helper()
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Skipf("no /bin/sh on this host: %v", err)
	}
	out, err := exec.Command("ldd", sh).Output()
	if err != nil {
		t.Skipf("cannot list the libraries of %s (ldd: %v); cannot build a template rootfs", sh, err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	copyFile := func(src, dst string) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(sh, filepath.Join(root, "bin/sh"))
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				real, err := filepath.EvalSymlinks(f)
				if err != nil {
					t.Fatal(err)
				}
				copyFile(real, filepath.Join(root, f))
			}
		}
	}
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte("from-the-template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("bin", filepath.Join(root, "sbin")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "proc"), 0o755) // skipped: the sandbox brings its own
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// useRootfs makes the directory of root b's rootfs directory and returns
// the name a Spec.Template gives for root.
func useRootfs(b *Backend, root string) string {
	b.roots.rootfsDir = filepath.Dir(root)
	return filepath.Base(root)
}

func TestTemplate(t *testing.T) {
	b := newBackend(t, 0)
	root := buildRootfs(t)
	spec := defaultSpec()
	spec.Template = useRootfs(b, root)
	sb := create(t, b, spec)
	if err := sb.WriteFile(context.Background(), "/workspace/in", []byte("injected\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// dash builtins only: the template has nothing else.
	exit, out := run(t, sb, "/bin/sh", "-c", `
		read x < /marker; echo "$x"
		read y < /workspace/in; echo "$y"
		if [ -e /usr/bin/ls ] || [ -e /etc/passwd ]; then echo host-visible; else echo host-hidden; fi
		if [ -L /sbin ]; then echo sbin-link; fi
		if [ -r /proc/self/status ]; then echo proc-ok; fi
		if echo x > /marker2 2>/dev/null; then echo WROTE-root; else echo root-ro; fi
		echo out > /workspace/out`)
	if exit.Code != 0 {
		t.Errorf("exit %+v", exit)
	}
	wantContains(t, out, "from-the-template\n", "injected\n", "host-hidden\n", "sbin-link\n", "proc-ok\n", "root-ro\n")
	if got, err := sb.ReadFile(context.Background(), "/workspace/out", 0, 10); err != nil || string(got) != "out\n" {
		t.Errorf("ReadFile = %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "marker2")); err == nil {
		t.Error("the job wrote into the template")
	}
}

// TestConcurrent runs several sandboxes at once; each must see only its
// own workspace.
func TestConcurrent(t *testing.T) {
	b := newBackend(t, 0)
	t.Run("group", func(t *testing.T) {
		for i := range 6 {
			name := string(rune('a' + i))
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				sb := create(t, b, defaultSpec())
				if err := sb.WriteFile(context.Background(), "/workspace/"+name, []byte(name), 0o644); err != nil {
					t.Fatal(err)
				}
				exit, out := run(t, sb, "/bin/sh", "-c", "sleep 0.2; ls /workspace")
				if exit.Code != 0 || out != name+"\n" {
					t.Errorf("exit %+v, ls /workspace = %q, want only %q", exit, out, name)
				}
			})
		}
	})
}

// TestSetupFailuresAreVisible breaks a sandbox behind the backend's back
// and expects the reason in the output and exit code 125, not silence.
func TestSetupFailuresAreVisible(t *testing.T) {
	b := newBackend(t, 0)
	tests := []struct {
		name  string
		spoil func(t *testing.T, sb *sbox)
		want  string
	}{
		{"init cannot build the root", func(t *testing.T, sb *sbox) {
			if err := os.Remove(sb.path(dirRootfs)); err != nil {
				t.Fatal(err)
			}
		}, "mount root tmpfs"},
		{"shim cannot place init in the cgroups", func(t *testing.T, sb *sbox) {
			if err := syscall.Rmdir(stateOf(t, sb).Cgroup.Pids); err != nil {
				t.Fatal(err)
			}
		}, "place the sandbox in its cgroups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := create(t, b, defaultSpec())
			tt.spoil(t, sb)
			exit, out := run(t, sb, "/bin/echo", "should not run")
			if exit.Code != codeSetupFailed || !strings.HasPrefix(out, setupPrefix) || !strings.Contains(out, tt.want) || strings.Contains(out, "should not run") {
				t.Errorf("exit %+v, output %q; want code %d and a %q line about %q", exit, out, codeSetupFailed, setupPrefix, tt.want)
			}
		})
	}
}

func TestListHidesSandboxesBeingCreated(t *testing.T) {
	b := newBackend(t, 0)
	id := "sb-0123456789ab"
	if err := os.Mkdir(filepath.Join(b.dir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	done := b.live.create(id)
	if ids, _ := b.List(context.Background()); listed(ids, id) {
		t.Errorf("List shows a sandbox being created: %v", ids)
	}
	done()
	if ids, _ := b.List(context.Background()); !listed(ids, id) {
		t.Errorf("List = %v, want %s", ids, id)
	}
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Errorf("Destroy of a half-made sandbox: %v", err)
	}
}

// TestDestroyWithoutDirectory: cgroups left by an interrupted Destroy
// (directory already gone) are removed by the next one.
func TestDestroyWithoutDirectory(t *testing.T) {
	b := newBackend(t, 0)
	id := "sb-ba9876543210"
	cg := b.cg.names(id)
	if err := cg.create(limits{MemoryBytes: 64 * mib, PidsMax: 10}); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for _, d := range cg.dirs() {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left (%v)", d, err)
		}
	}
}

// TestStateDirBehindSymlink: mounts are matched by path, and mountinfo
// shows paths without symlinks.
func TestStateDirBehindSymlink(t *testing.T) {
	canRun(t)
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Dir: link})
	if err != nil {
		t.Fatal(err)
	}
	sbi, err := b.Create(context.Background(), defaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	st := stateOf(t, sbi.(*sbox))
	if err := b.Destroy(context.Background(), sbi.ID()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	assertNoTrace(t, b, sbi.ID(), st)
}

// TestDeadline: the shim kills a job at Command.Deadline by itself, so a
// job whose server is gone still cannot outlive its timeout.
func TestDeadline(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	st := stateOf(t, sb)
	p, err := sb.Exec(context.Background(), sandbox.Command{
		Args: []string{"/bin/sh", "-c", "echo started; sleep 1000 & sleep 1000"}, Env: testEnv,
		OutputLimit: 1 << 20, Deadline: time.Now().Add(time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	exit, out := finish(t, p)
	// On a loaded machine the deadline can come before the shell's first
	// line (CI under a load of 30: no output at all); what is tested is
	// the kill, not the echo.
	if !exit.DeadlineExceeded || !exit.Killed || exit.Code != 137 || (out != "started\n" && out != "") {
		t.Fatalf("exit %+v output %q", exit, out)
	}
	if pids, err := st.Cgroup.procs(); err != nil || len(pids) != 0 {
		t.Fatalf("processes left after the deadline: %v %v", pids, err)
	}

	// A job that ends in time is not marked.
	sb = create(t, b, defaultSpec())
	p, err = sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/true"}, Env: testEnv, Deadline: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if exit, _ := finish(t, p); exit.DeadlineExceeded || exit.Killed || exit.Code != 0 {
		t.Fatalf("in-time job: %+v", exit)
	}
}
