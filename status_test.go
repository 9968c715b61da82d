package delegate_test

import (
	"errors"
	"testing"

	"github.com/delegate-dev/delegate"
)

func TestTransition(t *testing.T) {
	const (
		P  = delegate.StatusPending
		Pr = delegate.StatusProvisioning
		R  = delegate.StatusRunning
		S  = delegate.StatusSuccess
		F  = delegate.StatusFailed
		T  = delegate.StatusTimeout
		C  = delegate.StatusCancelled
	)
	allowed := map[[2]delegate.Status]bool{
		{P, Pr}: true, {P, F}: true, {P, C}: true,
		{Pr, R}: true, {Pr, F}: true, {Pr, T}: true, {Pr, C}: true, {Pr, P}: true, // re-queued: its command provably never started
		{R, S}: true, {R, F}: true, {R, T}: true, {R, C}: true,
	}
	// Every pair of statuses, so that a new edge cannot slip in unnoticed.
	for _, from := range delegate.Statuses {
		for _, to := range delegate.Statuses {
			err := delegate.Transition(from, to)
			if want := allowed[[2]delegate.Status{from, to}]; want != (err == nil) {
				t.Errorf("%s -> %s: err %v, want allowed=%v", from, to, err, want)
			}
			if err != nil && from.Terminal() && !errors.Is(err, delegate.ErrTerminal) {
				t.Errorf("%s -> %s: terminal source should give ErrTerminal, got %v", from, to, err)
			}
		}
	}
	if err := delegate.Transition("bogus", R); !errors.Is(err, delegate.ErrInvalidTransition) {
		t.Errorf("unknown status: %v", err)
	}
	for _, s := range []delegate.Status{S, F, T, C} {
		if !s.Terminal() {
			t.Errorf("%s should be terminal", s)
		}
	}
	for _, s := range []delegate.Status{P, Pr, R} {
		if s.Terminal() {
			t.Errorf("%s should not be terminal", s)
		}
	}
}
