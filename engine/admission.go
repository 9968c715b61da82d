package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// Admission: a backend with finite room (sandbox.Admitter) is asked for
// room before a job is provisioned. A job that does not fit stays pending,
// its progress saying what it waits for, and gives its run slot back while
// it waits; it is tried again when this engine frees room (a job ended, a
// sandbox was destroyed) or every AdmissionRetry (room freed elsewhere).

// admitResult is what one admission attempt decided.
type admitResult int

const (
	admitted  admitResult = iota // run it (with the reservation, if any)
	admitWait                    // no room now: wait and try again
	admitDrop                    // do not run it: it ended, failed, or the engine closes
)

// admit tries once to reserve room for a pending job. The caller holds a
// run slot. When the job must wait, room is the signal of room freed
// since the attempt began (none is missed between the two).
func (e *Engine) admit(id string) (adm sandbox.Admission, res admitResult, room <-chan struct{}) {
	a, ok := e.backend.(sandbox.Admitter)
	if !ok {
		return nil, admitted, nil
	}
	e.mu.Lock()
	room = e.room
	e.mu.Unlock()
	ctx := e.ctx
	job, err := e.store.GetJob(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Error("admit job", "job", id, "err", err)
		}
		return nil, admitDrop, nil
	}
	if job.Status != delegate.StatusPending {
		return nil, admitDrop, nil // cancelled while it waited
	}
	spec, err := sandboxSpec(job)
	if err != nil {
		e.finish(id, delegate.StatusFailed, fmt.Sprintf("provisioning failed: %v", err), nil)
		return nil, admitDrop, nil
	}
	adm, err = a.Admit(ctx, spec)
	switch {
	case err == nil:
		return adm, admitted, nil
	case ctx.Err() != nil:
		return nil, admitDrop, nil // closing: the job stays pending for the next engine
	case errors.Is(err, sandbox.ErrNoCapacity):
		reason := err.Error()
		var ce *sandbox.CapacityError
		if errors.As(err, &ce) {
			reason = ce.Reason
		}
		e.waiting(ctx, job, "waiting for capacity: "+reason)
		return nil, admitWait, room
	default:
		e.finish(id, delegate.StatusFailed, fmt.Sprintf("provisioning failed: %v", err), nil)
		return nil, admitDrop, nil
	}
}

// waiting records why a pending job waits, once per reason (a retry that
// finds the same shortage changes nothing).
func (e *Engine) waiting(ctx context.Context, job *delegate.Job, msg string) {
	msg = clip(msg)
	if job.Progress == msg {
		return
	}
	e.log.Info("job waits", "job", job.ID, "reason", msg)
	if _, err := e.update(ctx, job.ID, func(j *delegate.Job) error {
		if j.Status != delegate.StatusPending {
			return delegate.ErrTerminal
		}
		j.Progress = msg
		return nil
	}); err != nil {
		return
	}
	if job.Manifest.StatusMode != delegate.StatusModeSimple {
		if err := e.store.AddEvent(ctx, job.ID, delegate.Event{Time: time.Now().UTC(), Message: msg}, maxEvents); err != nil {
			e.log.Warn("store event", "job", job.ID, "err", err)
		}
	}
}

// waitForRoom blocks until room may have been freed, and reports whether
// the job should try again (false: it ended meanwhile, or the engine closes).
func (e *Engine) waitForRoom(id string, room <-chan struct{}) bool {
	retry := time.NewTimer(e.cfg.AdmissionRetry)
	defer retry.Stop()
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		select {
		case <-e.ctx.Done():
			return false
		case <-room:
			return true
		case <-retry.C:
			return true
		case <-changed:
			// Some job changed; if it is this one, it may have been cancelled.
			j, err := e.store.GetJob(e.ctx, id)
			if err != nil || j.Status != delegate.StatusPending {
				return false
			}
		}
	}
}

// roomFreed wakes the jobs waiting for capacity.
func (e *Engine) roomFreed() {
	e.mu.Lock()
	close(e.room)
	e.room = make(chan struct{})
	e.mu.Unlock()
}

// stepper reports a backend's provisioning steps as the job's progress.
func (e *Engine) stepper(ctx context.Context, id string) func(string) {
	return func(step string) {
		step = clip(step)
		e.log.Debug("provisioning step", "job", id, "step", step)
		e.update(ctx, id, func(j *delegate.Job) error {
			if j.Status.Terminal() {
				return delegate.ErrTerminal
			}
			j.Progress = step
			return nil
		})
	}
}
