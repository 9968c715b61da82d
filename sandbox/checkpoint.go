package sandbox

import (
	"context"
	"errors"
	"time"
)

// ErrBusy: a checkpoint was refused, nothing changed, because a process
// of the sandbox holds what the checkpoint would freeze (a file of its
// workspace open for writing); the error names it.
var ErrBusy = errors.New("sandbox busy")

// Checkpoints (issue 38): a kept sandbox's files saved at one instant,
// which the sandbox can go back to (Rollback) and new sandboxes can start
// from (Spec.From: a fork). Files only: a checkpoint keeps no memory, so
// after a rollback, and in a fork, the sandbox's processes start again
// from a clean init (what ran ends; the engine ends the commands it
// knows of as cancelled first, with the reason); across a checkpoint
// they go on.
//
// A backend with Capabilities.Checkpoint makes every instance made with
// Spec.MultiExec a Checkpointer and is itself a CheckpointKeeper; one
// without says why in CheckpointMissing.

// Checkpoint is one saved state of a sandbox's files, as the backend
// keeps it.
type Checkpoint struct {
	// ID is the backend's name for it, which Rollback, Spec.From and
	// DeleteCheckpoint take.
	ID string
	// Bytes is what it holds that its sandbox had not saved before (the
	// size of its own layer), which it costs on the backend's disk or
	// memory.
	Bytes   int64
	Created time.Time
}

// Checkpointer is an Instance whose files can be saved and brought back.
type Checkpointer interface {
	// Checkpoint saves the instance's files as they are now; the
	// instance is quiescent for the cut (paused for it) and its
	// processes go on after it. A paused instance stays paused. One
	// that cannot be cut consistently now (a process holds a file open
	// for writing) is refused with ErrBusy, nothing changed.
	Checkpoint(ctx context.Context) (Checkpoint, error)
	// Rollback brings the instance's files back to checkpoint id (one
	// made of this instance, or the one it was forked from): what was
	// written since is gone; its processes start again from a clean
	// init. A checkpoint the instance cannot reach is refused, nothing
	// changed.
	Rollback(ctx context.Context, id string) error
}

// CheckpointKeeper is a Backend that keeps checkpoints
// (Capabilities.Checkpoint).
type CheckpointKeeper interface {
	// DeleteCheckpoint forgets a checkpoint. What it holds stays while a
	// sandbox or another checkpoint still stands on it (a fork made from
	// it), and goes with the last of them. Deleting what is gone is no
	// error.
	DeleteCheckpoint(ctx context.Context, id string) error
}
