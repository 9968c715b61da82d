package sandbox

import (
	"context"
	"errors"
)

// ErrNoCapacity: the backend has no room for the sandbox now (every node
// is full). The job is not at fault: it waits and is tried again when
// room may have been freed.
var ErrNoCapacity = errors.New("no capacity")

// Admitter is implemented by a backend whose room is finite and shared,
// such as the memory of a cluster's nodes. The engine admits a job before
// it provisions it, so that a job that does not fit waits as pending
// (without holding a run slot) instead of failing.
type Admitter interface {
	// Admit reserves room for a sandbox of spec and returns the
	// reservation, to be passed to Create in Spec.Admission. An error
	// wrapping ErrNoCapacity means "not now"; its text says what is
	// missing. Any other error is the job's (a template that does not
	// exist...).
	Admit(ctx context.Context, spec Spec) (Admission, error)
}

// Admission is room reserved by Admit.
type Admission interface {
	// Release gives the room back. Once Create has used the reservation
	// (its sandbox now holds the room), Release does nothing; it may be
	// called more than once.
	Release()
}

// CapacityError says what room is missing; errors.Is(err, ErrNoCapacity)
// holds for it.
type CapacityError struct {
	Reason string // e.g. "no online node has 2048 MiB free (pve1: 1024 MiB)"
}

func (e *CapacityError) Error() string { return "no capacity: " + e.Reason }

// Is makes a CapacityError match ErrNoCapacity.
func (e *CapacityError) Is(target error) bool { return target == ErrNoCapacity }
