package sandboxtest

import (
	"context"
	"errors"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// checkpoints: a backend with Capabilities.Checkpoint saves a kept
// instance's files (Checkpointer), brings them back (Rollback), makes
// new instances from them (Spec.From) whose writes are their own, and
// forgets them (CheckpointKeeper); one without says why.
func (s *suite) checkpoints(t *testing.T) {
	caps := s.b.Capabilities()
	if !caps.Checkpoint {
		if caps.CheckpointMissing == "" {
			t.Error("Capabilities: no Checkpoint, and CheckpointMissing does not say why")
		}
		return
	}
	if caps.CheckpointMemoryMissing == "" {
		t.Error("Capabilities: CheckpointMemoryMissing is empty: no backend keeps memory in a checkpoint yet, say what is missing")
	}
	ctx := context.Background()
	src := s.createMulti(t, "job-checkpoint")
	if err := src.WriteFile(ctx, "/workspace/a.txt", []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	cper, ok := src.(sandbox.Checkpointer)
	if !ok {
		t.Fatal("a kept instance of a backend with Checkpoint is no Checkpointer")
	}
	cp, err := cper.Checkpoint(ctx)
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := src.WriteFile(ctx, "/workspace/a.txt", []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(sb sandbox.Instance) string {
		t.Helper()
		data, err := sb.ReadFile(ctx, "/workspace/a.txt", 0, 100)
		if err != nil {
			t.Fatalf("ReadFile in %s: %v", sb.ID(), err)
		}
		return string(data)
	}
	spec := s.spec("job-fork")
	spec.MultiExec, spec.From = true, cp.ID
	fork := s.createWith(t, spec)
	if got := read(fork); got != "before" {
		t.Errorf("a fork reads %q, want the checkpoint's %q", got, "before")
	}
	if err := fork.WriteFile(ctx, "/workspace/a.txt", []byte("fork"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read(src); got != "after" {
		t.Errorf("the source reads %q after the fork wrote", got)
	}
	if err := cper.Rollback(ctx, cp.ID); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	if got := read(src); got != "before" {
		t.Errorf("after Rollback the source reads %q", got)
	}
	if got := read(fork); got != "fork" {
		t.Errorf("the fork reads %q after its source rolled back", got)
	}
	if fc, ok := fork.(sandbox.Checkpointer); ok {
		if err := fc.Rollback(ctx, cp.ID); err == nil {
			t.Error("a fork rolled back to its source's checkpoint")
		}
	}
	ck, ok := s.b.(sandbox.CheckpointKeeper)
	if !ok {
		t.Fatal("a backend with Checkpoint is no CheckpointKeeper")
	}
	if err := ck.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Fatalf("DeleteCheckpoint: %v", err)
	}
	if got := read(fork); got != "fork" {
		t.Errorf("the fork reads %q once its checkpoint is deleted", got)
	}
	spec.JobID = "job-fork-2"
	if _, err := s.b.Create(ctx, spec); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("Create from a deleted checkpoint: %v, want ErrGone", err)
	}
}
