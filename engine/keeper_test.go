package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/storetest"
)

// keptFixture is the engine with fast sandbox timers.
func keptFixture(t *testing.T, cfg engine.Config) *fixture {
	if cfg.SandboxTick == 0 {
		cfg.SandboxTick = 10 * time.Millisecond
	}
	return newFixture(t, cfg)
}

func (f *fixture) sandbox(id string) *delegate.Sandbox {
	f.t.Helper()
	sb, err := f.eng.GetSandbox(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sb
}

// TestKeptSandboxCommands: commands submitted with manifest.sandbox run
// in the kept sandbox's one instance, side by side, as jobs; the sandbox
// counts them and is idle once none runs.
func TestKeptSandboxCommands(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{})
	ctx := context.Background()
	sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != delegate.SandboxIdle || sb.Instance == "" || !strings.HasPrefix(sb.ID, "sbx-") {
		t.Fatalf("opened %+v", sb)
	}
	if f.backend.Len() != 1 {
		t.Fatalf("%d instances, want 1", f.backend.Len())
	}
	in := script("echo one")
	in.Sandbox = sb.ID
	one := f.submit(in)
	p1 := f.started()
	in.Task = "echo two"
	two := f.submit(in)
	p2 := f.started()
	if p1.Sandbox != p2.Sandbox || p1.Sandbox.ID() != sb.Instance {
		t.Fatalf("the commands ran in %s and %s, want both in %s", p1.Sandbox.ID(), p2.Sandbox.ID(), sb.Instance)
	}
	if p1.ID() == p2.ID() {
		t.Error("two commands with one id")
	}
	eventually(t, "two commands running", func() bool { return f.sandbox(sb.ID).Running == 2 })
	if got := f.sandbox(sb.ID); got.State != delegate.SandboxRunning || got.Commands != 2 {
		t.Errorf("with two commands: %+v", got)
	}
	p1.Finish(sandbox.Exit{})
	p2.Finish(sandbox.Exit{Code: 3})
	if j := f.wait(f.eng, one.ID); j.Status != delegate.StatusSuccess || j.Sandbox != sb.ID {
		t.Errorf("first command: %+v", j)
	}
	if j := f.wait(f.eng, two.ID); j.Status != delegate.StatusFailed {
		t.Errorf("second command: %+v", j)
	}
	eventually(t, "the sandbox idle", func() bool {
		got := f.sandbox(sb.ID)
		return got.State == delegate.SandboxIdle && got.Running == 0
	})
	if f.backend.Len() != 1 {
		t.Errorf("%d instances after the commands, want the kept one", f.backend.Len())
	}
	// The kept sandbox's limits are its own: a command may not bring any.
	bad := script("true")
	bad.Sandbox, bad.Resources = sb.ID, &delegate.Resources{Memory: "4G"}
	if _, err := f.eng.Submit(ctx, bad, delegate.SubmitOptions{}); err == nil || !strings.Contains(err.Error(), "manifest.resources") {
		t.Errorf("a command with resources of its own: %v", err)
	}
	missing := script("true")
	missing.Sandbox = "sbx-nothere"
	if _, err := f.eng.Submit(ctx, missing, delegate.SubmitOptions{}); !errors.Is(err, delegate.ErrNotFound) || !strings.Contains(err.Error(), "sbx-nothere") {
		t.Errorf("an unknown sandbox: %v", err)
	}
}

// TestKeptSandboxCommandCap: at most MaxSandboxCommands commands run at
// once in one sandbox (counted from its jobs): one more fails, saying
// why, and once one ends the next runs.
func TestKeptSandboxCommandCap(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{MaxConcurrent: 2 * delegate.MaxSandboxCommands})
	sb, err := f.eng.OpenSandbox(context.Background(), delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	in := script("sleep 60")
	in.Sandbox = sb.ID
	var running []*sandboxtest.Process
	for range delegate.MaxSandboxCommands {
		f.submit(in)
		running = append(running, f.started())
	}
	// Refused at submission, naming the cap (before: accepted, then
	// failed when it started).
	_, err = f.eng.Submit(context.Background(), in, delegate.SubmitOptions{})
	if !errors.Is(err, delegate.ErrConflict) || !strings.Contains(err.Error(), fmt.Sprintf("runs %d commands not ended", delegate.MaxSandboxCommands)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("(%d, a fixed limit, not a setting)", delegate.MaxSandboxCommands)) {
		t.Fatalf("a command past the cap: %v", err)
	}
	if got := f.sandbox(sb.ID); got.Running != delegate.MaxSandboxCommands || got.Commands != delegate.MaxSandboxCommands || got.State != delegate.SandboxRunning {
		t.Errorf("at the cap: %+v", got)
	}
	running[0].Finish(sandbox.Exit{})
	eventually(t, "a command ended", func() bool { return f.sandbox(sb.ID).Running == delegate.MaxSandboxCommands-1 })
	next := f.submit(in)
	running = append(running[1:], f.started())
	if got := f.sandbox(sb.ID); got.Running != delegate.MaxSandboxCommands {
		t.Errorf("after one ended and one more came: %+v", got)
	}
	for _, p := range running {
		p.Finish(sandbox.Exit{})
	}
	if j := f.wait(f.eng, next.ID); j.Status != delegate.StatusSuccess {
		t.Errorf("the command after one ended: %s %q", j.Status, j.Error)
	}
}

// TestPersistentJobKeepsASandbox: a persistent job makes a kept sandbox,
// which the next command runs in; releasing it destroys its machine, and
// a command for it is then refused.
func TestPersistentJobKeepsASandbox(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{})
	ctx := context.Background()
	m := script("echo first")
	m.Lifecycle = delegate.LifecyclePersistent
	first := f.submit(m)
	f.started().Finish(sandbox.Exit{})
	j := f.wait(f.eng, first.ID)
	if j.Sandbox == "" {
		t.Fatalf("the persistent job kept no sandbox: %+v", j)
	}
	sb := f.sandbox(j.Sandbox)
	if sb.JobID != first.ID || sb.Instance != j.SandboxID || sb.Commands != 1 {
		t.Errorf("the kept sandbox: %+v", sb)
	}
	next := script("cat keep.txt")
	next.Sandbox = sb.ID
	f.submit(next)
	if p := f.started(); p.Sandbox.ID() != sb.Instance {
		t.Errorf("the next command ran in %s, want %s", p.Sandbox.ID(), sb.Instance)
	} else {
		p.Finish(sandbox.Exit{})
	}
	page, _ := f.eng.List(ctx, delegate.ListOptions{})
	kept := 0
	for _, s := range page.Jobs {
		if s.SandboxKept {
			kept++
		}
	}
	if kept != 1 {
		t.Errorf("%d jobs say they keep a sandbox, want the one that made it", kept)
	}
	released, ok, err := f.eng.ReleaseSandbox(ctx, sb.ID)
	if err != nil || !ok || released.State != delegate.SandboxReleased {
		t.Fatalf("release: %+v %v %v", released, ok, err)
	}
	eventually(t, "the machine destroyed", func() bool { return f.backend.Len() == 0 })
	if _, again, err := f.eng.ReleaseSandbox(ctx, sb.ID); err != nil || again {
		t.Errorf("a second release: %v %v", again, err)
	}
	if _, err := f.eng.Submit(ctx, next, delegate.SubmitOptions{}); err == nil || !strings.Contains(err.Error(), "released") {
		t.Errorf("a command for a released sandbox: %v", err)
	}
	if j, _ := f.eng.Get(ctx, first.ID); j.SandboxID != "" {
		t.Errorf("the job that made it still names its machine: %+v", j)
	}
}

// TestKeptSandboxTimers: idle past its idle timeout a sandbox is paused;
// a command resumes it; paused past its pause timeout it goes; past its
// lifetime it goes whatever it does.
func TestKeptSandboxTimers(t *testing.T) {
	t.Parallel()
	// In a synctest bubble the timers run on the bubble's clock: the
	// waits below take no real time, and the order of the timers'
	// firings is the same on a loaded machine as on an idle one.
	synctest.Test(t, testKeptSandboxTimers)
}

func testKeptSandboxTimers(t *testing.T) {
	f := keptFixture(t, engine.Config{})
	ctx := context.Background()
	sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{IdleTimeout: 1, PauseTimeout: 2, Lifetime: 3600})
	if err != nil {
		t.Fatal(err)
	}
	inst := func() *sandboxtest.FakeInstance {
		i, err := f.backend.Recover(ctx, sb.Instance)
		if err != nil {
			return nil
		}
		return i.(*sandboxtest.FakeInstance)
	}
	eventually(t, "paused when idle", func() bool { return f.sandbox(sb.ID).State == delegate.SandboxPaused })
	if !inst().Paused() {
		t.Fatal("the sandbox is recorded paused, its machine is not")
	}
	// A file call on a paused sandbox resumes it (never an error).
	if err := f.eng.WriteSandboxFile(ctx, sb.ID, "notes.txt", []byte("hi"), 0o644); err != nil {
		t.Fatalf("write to a paused sandbox: %v", err)
	}
	if got := f.sandbox(sb.ID); got.State != delegate.SandboxIdle || inst().Paused() {
		t.Errorf("after a file call: %+v (machine paused %v)", got, inst().Paused())
	}
	eventually(t, "paused again", func() bool { return f.sandbox(sb.ID).State == delegate.SandboxPaused })
	eventually(t, "gone after its pause timeout", func() bool { return f.sandbox(sb.ID).State == delegate.SandboxGone })
	if got := f.sandbox(sb.ID); !strings.Contains(got.Reason, "pause timeout") || inst() != nil {
		t.Errorf("gone: %+v", got)
	}

	short, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{Lifetime: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := script("sleep 100")
	m.Sandbox = short.ID
	job := f.submit(m)
	f.started()
	eventually(t, "gone at its lifetime, a command running", func() bool { return f.sandbox(short.ID).State == delegate.SandboxGone })
	if j := f.wait(f.eng, job.ID); j.Status == delegate.StatusSuccess {
		t.Errorf("the command of a sandbox that went: %+v", j)
	}

	// Longer timers than the server's settings are refused, naming the
	// field and the setting.
	for _, spec := range []struct {
		spec           delegate.SandboxSpec
		field, setting string
	}{
		{delegate.SandboxSpec{IdleTimeout: 3 * 3600}, "idle_timeout", "DELEGATE_SANDBOX_IDLE"},
		{delegate.SandboxSpec{PauseTimeout: 48 * 3600}, "pause_timeout", "DELEGATE_SANDBOX_PAUSE"},
		{delegate.SandboxSpec{Lifetime: 48 * 3600}, "lifetime", "DELEGATE_SANDBOX_LIFETIME"},
	} {
		_, err := f.eng.OpenSandbox(ctx, spec.spec)
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != spec.field || !strings.Contains(err.Error(), spec.setting) {
			t.Errorf("%+v: %v", spec.spec, err)
		}
	}
}

// TestKeptSandboxFiles: files of a sandbox's workspace, read at an
// offset, written, listed; paths that leave the workspace are refused
// naming the field.
func TestKeptSandboxFiles(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{})
	ctx := context.Background()
	sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.eng.WriteSandboxFile(ctx, sb.ID, "src/a.txt", []byte("hello world"), 0o640); err != nil {
		t.Fatal(err)
	}
	fc, err := f.eng.ReadSandboxFile(ctx, sb.ID, "/workspace/src/a.txt", 6, 100)
	if err != nil || string(fc.Data) != "world" || fc.Size != 11 || !fc.EOF {
		t.Errorf("read: %+v %v", fc, err)
	}
	fc, err = f.eng.ReadSandboxFile(ctx, sb.ID, "src/a.txt", 0, 5)
	if err != nil || string(fc.Data) != "hello" || fc.EOF {
		t.Errorf("read part: %+v %v", fc, err)
	}
	ls, err := f.eng.ListSandboxFiles(ctx, sb.ID, delegate.FileListOptions{Depth: 2})
	if err != nil || len(ls.Entries) != 2 || ls.Entries[1].Path != "/workspace/src/a.txt" || ls.Entries[1].Type != "file" || ls.Entries[0].Type != "dir" {
		t.Errorf("list: %+v %v", ls, err)
	}
	for _, tc := range []struct {
		err   error
		field string
	}{
		{f.eng.WriteSandboxFile(ctx, sb.ID, "../etc/x", []byte("x"), 0o644), "path"},
		{f.eng.WriteSandboxFile(ctx, sb.ID, "/etc/passwd", []byte("x"), 0o644), "path"},
		{f.eng.WriteSandboxFile(ctx, sb.ID, "x", []byte("x"), fs.ModeSetuid|0o755), "mode"},
		{errOf(f.eng.ReadSandboxFile(ctx, sb.ID, "a", 0, delegate.MaxFileRead+1)), "length"},
		{errOf(f.eng.ListSandboxFiles(ctx, sb.ID, delegate.FileListOptions{Path: "../.."})), "path"},
	} {
		var fe *delegate.FieldError
		if !errors.As(tc.err, &fe) || fe.Field != tc.field {
			t.Errorf("got %v, want a field error on %s", tc.err, tc.field)
		}
	}
	if _, err := f.eng.ReadSandboxFile(ctx, sb.ID, "missing", 0, 10); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("a missing file: %v", err)
	}
	if _, err := f.eng.ReadSandboxFile(ctx, "sbx-gone", "a", 0, 10); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestKeptSandboxCapacity: past the most kept sandboxes, opening one is
// refused naming the setting and the oldest idle ones.
func TestKeptSandboxCapacity(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{MaxSandboxes: 2})
	ctx := context.Background()
	var first *delegate.Sandbox
	for i := range 2 {
		sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = sb
		}
	}
	_, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if !errors.Is(err, delegate.ErrConflict) || !strings.Contains(err.Error(), "DELEGATE_MAX_SANDBOXES=2") || !strings.Contains(err.Error(), first.ID) {
		t.Fatalf("past the maximum: %v", err)
	}
	f.eng.ReleaseSandbox(ctx, first.ID)
	if _, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{}); err != nil {
		t.Errorf("after a release: %v", err)
	}
}

// TestKeptSandboxSurvivesRestart: a kept sandbox's machine is spared by
// the sweep, and an engine that starts after its keeper died adopts it
// and keeps its timers.
func TestKeptSandboxSurvivesRestart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		dead := func(string) bool { return false }
		f := keptFixture(t, engine.Config{OwnerAlive: dead, CleanupInterval: 20 * time.Millisecond})
		ctx := context.Background()
		sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{IdleTimeout: 1})
		if err != nil {
			t.Fatal(err)
		}
		passTime(100 * time.Millisecond) // 5 sweeps
		if f.backend.Len() != 1 {
			t.Fatal("the sweep destroyed a kept sandbox's machine")
		}
		f.eng.Close()
		second := f.start(f.backend)
		eventually(t, "adopted and paused by the next engine", func() bool {
			got, _ := second.GetSandbox(ctx, sb.ID)
			return got.State == delegate.SandboxPaused
		})
	})
}

// TestKeptCommandsLostInRestart: the commands of a kept sandbox that a
// server left behind when it died (one caught while it was provisioned,
// as an older server recorded it with the machine's id; one whose
// process is gone) are failed by the next server, and the sandbox stays:
// its machine is not destroyed, it counts no running command, and the
// next command runs there.
func TestKeptCommandsLostInRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dead := func(string) bool { return false }
	f := keptFixture(t, engine.Config{OwnerAlive: dead, SandboxTick: time.Hour})
	sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	in := script("sleep 100")
	in.Sandbox = sb.ID
	lost := f.submit(in)
	p := f.started()
	eventually(t, "the command running", func() bool {
		j, _ := f.eng.Get(ctx, lost.ID)
		return j.Status == delegate.StatusRunning
	})
	f.eng.Close()
	p.Sandbox.Forget(p.ID())
	caught := storetest.NewJob("job-caught")
	caught.Manifest, caught.Owner = in, "a-server-that-died"
	if err := f.store.CreateJob(ctx, caught); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.UpdateJob(ctx, caught.ID, func(j *delegate.Job) error {
		j.Status, j.Sandbox, j.SandboxID = delegate.StatusProvisioning, sb.ID, sb.Instance
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	second := f.start(f.backend)
	if j := f.wait(second, lost.ID); j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "sandbox lost after a server restart") {
		t.Fatalf("the command whose process is gone: %s %q", j.Status, j.Error)
	}
	if j := f.wait(second, caught.ID); j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "while the sandbox was being provisioned") {
		t.Fatalf("the command caught provisioning: %s %q", j.Status, j.Error)
	}
	eventually(t, "the sandbox idle, counting no command", func() bool {
		got, err := second.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == delegate.SandboxIdle && got.Running == 0
	})
	if f.backend.Len() != 1 {
		t.Fatalf("the kept sandbox's machine was destroyed (%d machines)", f.backend.Len())
	}
	next, err := second.Submit(ctx, in, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.started().Finish(sandbox.Exit{})
	if j := f.wait(second, next.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("the next command: %s %q", j.Status, j.Error)
	}
}

// TestKeptSandboxMachineLost: a kept sandbox's machine vanishes behind
// the engine's back (the engine knows it from an earlier command): the
// next command fails naming why, never hangs, and the sandbox is gone;
// so is a file call's.
func TestKeptSandboxMachineLost(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"command", "file"} {
		t.Run(via, func(t *testing.T) {
			f := keptFixture(t, engine.Config{SandboxTick: time.Hour})
			ctx := context.Background()
			sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
			if err != nil {
				t.Fatal(err)
			}
			in := script("true")
			in.Sandbox = sb.ID
			first := f.submit(in)
			f.started().Finish(sandbox.Exit{})
			if j := f.wait(f.eng, first.ID); j.Status != delegate.StatusSuccess {
				t.Fatalf("first command: %+v", j)
			}
			if err := f.backend.Destroy(ctx, sb.Instance); err != nil {
				t.Fatal(err)
			}
			if via == "file" {
				err := f.eng.WriteSandboxFile(ctx, sb.ID, "a.txt", []byte("x"), 0o644)
				if !errors.Is(err, delegate.ErrTerminal) || !strings.Contains(err.Error(), "gone") {
					t.Fatalf("file call on a lost machine: %v", err)
				}
			} else {
				second := f.submit(in)
				j := f.wait(f.eng, second.ID)
				if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "gone") {
					t.Fatalf("command on a lost machine: %+v", j)
				}
			}
			// The job's end is recorded first, the sandbox's right after.
			eventually(t, "the sandbox gone", func() bool { return f.sandbox(sb.ID).State == delegate.SandboxGone })
			if got := f.sandbox(sb.ID); !strings.Contains(got.Reason, "machine is gone") || got.Running != 0 {
				t.Errorf("gone: %+v", got)
			}
		})
	}
}

// TestSweepSparesSandboxBeingOpened: the machine of a sandbox that is
// being opened exists on the backend before the sandbox records it; the
// sweep leaves it alone however many sweeps pass (it destroyed it on the
// Proxmox simulator, where a clone takes a second), and a second machine
// of that sandbox is a leftover once the sandbox has its own.
func TestSweepSparesSandboxBeingOpened(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := keptFixture(t, engine.Config{CleanupInterval: 10 * time.Millisecond})
		release := make(chan struct{})
		entered := make(chan string, 1)
		f.backend.CreateHook = func(ctx context.Context, spec sandbox.Spec) error {
			entered <- spec.JobID
			<-release
			return nil
		}
		opened := make(chan error, 1)
		go func() {
			_, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
			opened <- err
		}()
		owner := <-entered
		if !strings.HasPrefix(owner, "sbx-") {
			t.Fatalf("a sandbox's machine is made for %q, want its sandbox id", owner)
		}
		f.backend.CreateHook = nil
		inFlight, err := f.backend.Create(ctx, sandbox.Spec{JobID: owner})
		if err != nil {
			t.Fatal(err)
		}
		passTime(150 * time.Millisecond) // 15 sweeps
		if _, err := f.backend.Recover(ctx, inFlight.ID()); err != nil {
			t.Fatalf("the sweep destroyed the machine of a sandbox being opened: %v", err)
		}
		close(release)
		if err := <-opened; err != nil {
			t.Fatal(err)
		}
		eventually(t, "the second machine destroyed as a leftover", func() bool {
			_, err := f.backend.Recover(ctx, inFlight.ID())
			return errors.Is(err, sandbox.ErrGone)
		})
		if f.backend.Len() != 1 {
			t.Fatalf("%d machines, want the sandbox's one", f.backend.Len())
		}
	})
}
