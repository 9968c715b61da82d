package engine

import (
	"context"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// Observer hears what this engine does, for metrics. It is called on the
// engine's goroutines: its methods must return at once.
//
// The engine calls it from two places only (one line each), so that the
// job's life stays readable: createSandbox in provision, and jobEnded in
// settle.
type Observer interface {
	// SandboxStarted: the backend created a sandbox in d.
	SandboxStarted(backend string, d time.Duration)
	// JobEnded: a job this engine ran has ended in status, after running
	// for ran (from its start to its end).
	JobEnded(backend string, status delegate.Status, ran time.Duration)
}

// createSandbox is backend.Create, timed for the observer.
func (r *runner) createSandbox(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	began := time.Now()
	sb, err := r.backend().Create(ctx, spec)
	if err == nil && r.cfg.Observer != nil {
		r.cfg.Observer.SandboxStarted(r.backend().Name(), time.Since(began))
	}
	return sb, err
}

// jobEnded tells the observer how a job this engine followed ended, as the
// store has it (a cancel or a completion callback may have decided it). It
// is called before anyone waiting for the job is woken, so that whoever
// sees the end also sees it counted.
func (r *runner) jobEnded(j *delegate.Job) {
	if r.cfg.Observer == nil || !j.Status.Terminal() {
		return
	}
	r.cfg.Observer.JobEnded(j.Backend, j.Status, j.Duration(time.Now()))
}
