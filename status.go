package delegate

import "fmt"

// Status is where a job is in its life. Every change of status goes through
// Transition, so that one table decides what may follow what.
type Status string

const (
	StatusPending      Status = "pending"
	StatusProvisioning Status = "provisioning"
	StatusRunning      Status = "running"
	StatusSuccess      Status = "success"
	StatusFailed       Status = "failed"
	StatusTimeout      Status = "timeout"
	StatusCancelled    Status = "cancelled"
)

// Statuses lists every status in life order.
var Statuses = []Status{StatusPending, StatusProvisioning, StatusRunning, StatusSuccess, StatusFailed, StatusTimeout, StatusCancelled}

// transitions is the state machine. A terminal status has no entry: nothing
// follows it, so a late callback, a racing cancel or a slow provisioning step
// can never bring a finished job back.
var transitions = map[Status][]Status{
	StatusPending: {StatusProvisioning, StatusFailed, StatusCancelled},
	// Back to pending only when its server died before its command
	// started (a start token proves it never did): another adopts it.
	StatusProvisioning: {StatusRunning, StatusFailed, StatusTimeout, StatusCancelled, StatusPending},
	StatusRunning:      {StatusSuccess, StatusFailed, StatusTimeout, StatusCancelled},
}

// Valid reports whether s is one of the known statuses.
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s == StatusSuccess || s == StatusFailed || s == StatusTimeout || s == StatusCancelled
}

// CanTransition reports whether a job in status from may move to status to.
func CanTransition(from, to Status) bool {
	for _, next := range transitions[from] {
		if next == to {
			return true
		}
	}
	return false
}

// Transition checks a change of status. The error wraps ErrInvalidTransition,
// or ErrTerminal when the job had already finished.
func Transition(from, to Status) error {
	if !from.Valid() || !to.Valid() {
		return fmt.Errorf("%w: unknown status %q -> %q", ErrInvalidTransition, from, to)
	}
	if CanTransition(from, to) {
		return nil
	}
	if from.Terminal() {
		return fmt.Errorf("%w: job is already %s", ErrTerminal, from)
	}
	return fmt.Errorf("%w: %s -> %s", ErrInvalidTransition, from, to)
}
