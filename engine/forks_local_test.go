package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestLocalCheckpointFork: checkpoints, rollbacks and forks of kept
// sandboxes on the real local backend, through the engine: a command
// running at a checkpoint goes on, and ends cancelled with the reason at
// a rollback; one writing a workspace file makes a checkpoint a
// conflict; memory is
// refused naming what is missing; forks see the source's files and not
// each other's writes, each with an identity of its own; bad input is
// refused with the field named and nothing changed; a released
// sandbox's checkpoints go with it while its forks keep their files.
func TestLocalCheckpointFork(t *testing.T) {
	f := newLocal(t)
	f.cfg.MaxForks = 3
	eng := f.engine(t, f.backend(t))
	ctx := context.Background()
	src, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.WriteSandboxFile(ctx, src.ID, "a.txt", []byte("base"), 0o640); err != nil {
		t.Fatal(err)
	}
	read := func(id, path string) (string, error) {
		fc, err := eng.ReadSandboxFile(ctx, id, path, 0, 1000)
		if err != nil {
			return "", err
		}
		return string(fc.Data), nil
	}
	m := script("sleep 300")
	m.Sandbox = src.ID
	running, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, eng, running.ID, delegate.StatusRunning)
	cp, err := eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if cp.Name != "base" || cp.SandboxID != src.ID || !strings.HasPrefix(cp.ID, "ckp-") {
		t.Errorf("checkpoint %+v", cp)
	}
	if j, err := eng.Get(ctx, running.ID); err != nil || j.Status != delegate.StatusRunning {
		t.Errorf("a command running at the checkpoint, after it: %v %v, want it running still", j, err)
	}
	_, err = eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Memory: true})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || fe.Field != "memory" || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("memory: true: %v", err)
	}

	forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 2 || forks[0].ID == forks[1].ID || forks[0].ID == src.ID || forks[0].Instance == forks[1].Instance {
		t.Fatalf("forks %+v", forks)
	}
	for _, fk := range forks {
		if got, err := read(fk.ID, "a.txt"); got != "base" || err != nil {
			t.Errorf("fork %s reads %q %v", fk.ID, got, err)
		}
	}
	if err := eng.WriteSandboxFile(ctx, forks[0].ID, "a.txt", []byte("fork 0"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{src.ID, forks[1].ID} {
		if got, _ := read(id, "a.txt"); got != "base" {
			t.Errorf("%s sees fork 0's write: %q", id, got)
		}
	}
	list, err := eng.ListCheckpoints(ctx, src.ID)
	if err != nil || len(list) != 2 || len(list[1].Forks) != 2 || list[0].ID != cp.ID {
		t.Errorf("the source's checkpoints: %+v %v", list, err)
	}

	// Bad input, each refused with its field, nothing made.
	before, _ := eng.ListSandboxes(ctx, delegate.SandboxListOptions{})
	mine, err := eng.CheckpointSandbox(ctx, forks[0].ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what, field string
		err         error
	}{
		{"count 0", "count", errOf(eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 0}))},
		{"count over the maximum", "count", errOf(eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 4}))},
		{"from what is no id", "from", errOf(eng.ForkSandbox(ctx, delegate.ForkSpec{From: "../x", Count: 1}))},
		{"another sandbox's checkpoint", "checkpoint", errOf(eng.RollbackSandbox(ctx, src.ID, mine.ID))},
		{"a checkpoint id that is none", "checkpoint", errOf(eng.RollbackSandbox(ctx, src.ID, "ckp-x"))},
		{"a long name", "name", errOf(eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Name: strings.Repeat("n", 65)}))},
	} {
		if !errors.As(c.err, &fe) || fe.Field != c.field {
			t.Errorf("%s: %v, want an error of field %s", c.what, c.err, c.field)
		}
	}
	if after, _ := eng.ListSandboxes(ctx, delegate.SandboxListOptions{}); len(after) != len(before) {
		t.Errorf("refused forks made sandboxes: %d, then %d", len(before), len(after))
	}

	// A command holding a workspace file open for writing makes a
	// checkpoint a conflict, naming the file; nothing recorded.
	m = script("exec 3>/workspace/held; echo held >&3; sleep 300")
	m.Sandbox = src.ID
	writer, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, "the writer holds its file", func() bool {
		got, _ := read(src.ID, "held")
		return got == "held\n"
	})
	if _, err := eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{}); !errors.Is(err, delegate.ErrConflict) || !strings.Contains(err.Error(), "/workspace/held open for writing") {
		t.Errorf("a checkpoint while a command writes: %v", err)
	}
	if now, err := eng.ListCheckpoints(ctx, src.ID); err != nil || len(now) != len(list) {
		t.Errorf("after a refused checkpoint the source has %d checkpoints (%v), want %d", len(now), err, len(list))
	}

	// Rollback after the file is gone brings it back; the commands
	// running end cancelled, with the reason.
	m = script("rm -rf /workspace/*")
	m.Sandbox = src.ID
	rm, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitEnd(t, eng, rm.ID)
	if _, err := read(src.ID, "a.txt"); err == nil {
		t.Fatal("a.txt is still there after rm -rf")
	}
	if _, err := eng.RollbackSandbox(ctx, src.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{running.ID, writer.ID} {
		if j := waitEnd(t, eng, id); j.Status != delegate.StatusCancelled || !strings.Contains(j.Error, "rolled back") {
			t.Errorf("a command running at the rollback: %s %q", j.Status, j.Error)
		}
	}
	if got, err := read(src.ID, "a.txt"); got != "base" || err != nil {
		t.Errorf("after the rollback: %q %v", got, err)
	}

	// Released, its checkpoints go; its forks keep their files.
	if _, _, err := eng.ReleaseSandbox(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 1}); !errors.Is(err, delegate.ErrTerminal) {
		t.Errorf("a fork of a released sandbox: %v", err)
	}
	if _, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 1}); err == nil {
		t.Error("a fork of a released sandbox's checkpoint was made")
	}
	if got, err := read(forks[1].ID, "a.txt"); got != "base" || err != nil {
		t.Errorf("fork 1 after its source went: %q %v", got, err)
	}
	for _, fk := range forks {
		if _, _, err := eng.ReleaseSandbox(ctx, fk.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLocalForkDiff: a fork's changes are its sandbox's since the
// original import, not since the fork: jobs diff of a command in a fork
// shows what the source changed before the fork and what the fork
// changed, against the workspace as imported; the source's diff has
// none of the fork's; a fork of a fork goes back to the same import.
func TestLocalForkDiff(t *testing.T) {
	f := newLocal(t)
	root := t.TempDir()
	dir := project(t, root, "p", map[string]string{"a.txt": "one\n", "b.txt": "keep\n"})
	f.cfg.WorkspaceRoots = []string{root}
	eng := f.engine(t, f.backend(t))
	ctx := context.Background()
	m := script("echo two > /workspace/a.txt")
	m.Workspace, m.Lifecycle = &delegate.WorkspaceSource{Dir: dir}, delegate.LifecyclePersistent
	maker, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src := waitEnd(t, eng, maker.ID).Sandbox
	if src == "" {
		t.Fatal("the maker kept no sandbox")
	}
	run := func(sandbox, task string) string {
		t.Helper()
		c := script(task)
		c.Sandbox = sandbox
		j, err := eng.Submit(ctx, c, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if j := waitEnd(t, eng, j.ID); j.Status != delegate.StatusSuccess {
			t.Fatalf("%q in %s: %s %s", task, sandbox, j.Status, j.Error)
		}
		return j.ID
	}
	diff := func(id string) string {
		t.Helper()
		page, err := eng.Diff(ctx, id, delegate.DiffOptions{})
		if err != nil {
			t.Fatalf("diff of %s: %v", id, err)
		}
		return page.Text
	}
	forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: src, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	fk := forks[0].ID
	cmd := run(fk, "echo three > /workspace/b.txt")
	for _, id := range []string{cmd, fk} {
		if got := diff(id); !strings.Contains(got, "-one\n+two\n") || !strings.Contains(got, "-keep\n+three\n") {
			t.Errorf("diff of the fork (%s):\n%s\nwant a.txt one→two (before the fork) and b.txt keep→three, against the import", id, got)
		}
	}
	if got := diff(run(src, "true")); !strings.Contains(got, "-one\n+two\n") || strings.Contains(got, "three") {
		t.Errorf("diff of the source after the fork:\n%s", got)
	}
	// A fork of the fork: the same import still.
	again, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: fk, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := diff(run(again[0].ID, "rm /workspace/a.txt")); !strings.Contains(got, "-one\n") || !strings.Contains(got, "-keep\n+three\n") || strings.Contains(got, "+two") {
		t.Errorf("diff of a fork of the fork:\n%s", got)
	}
	for _, id := range []string{again[0].ID, fk, src} {
		if _, _, err := eng.ReleaseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
