package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// scheduler is the part that decides when a job runs: run slots (the
// concurrency limit), a queue of job ids waiting for one, and admission
// (room on a backend with finite capacity). It has its own lock, which it
// never holds while it calls another part.
//
// A job waiting for a slot is only an id in the queue, not a goroutine:
// thousands may wait, and every goroutine is work for the garbage
// collector (a parked goroutine per pending job once took a third of the
// server's CPU in stack scans). A job waiting for room holds no slot.
type scheduler struct {
	life    *group
	store   delegate.Store
	backend *backendRef
	jobs    *jobWriter
	runner  jobRunner
	failer  jobFailer
	room    *roomSignal
	log     *slog.Logger
	retry   time.Duration // Config.AdmissionRetry

	mu    sync.Mutex
	slots int      // free run slots (Config.MaxConcurrent at first)
	queue []string // jobs waiting for a slot, first in first out
}

// jobRunner is what the scheduler hands a job to once it has a run slot
// (and room on the backend): the starter.
type jobRunner interface {
	run(id string, adm sandbox.Admission)
	runClaimed(c claimed)
}

// jobFailer fails a job the scheduler cannot start (the finisher).
type jobFailer interface {
	finish(id string, status delegate.Status, reason string, facts func(*delegate.Job))
}

// enqueue runs the job when a run slot is free and the backend has room
// for it.
func (s *scheduler) enqueue(id string) { s.queueJob(id, false) }

// takeSlot takes a run slot for a job to start at once (startClaimed),
// if one is free and no job waits for one (those go first).
func (s *scheduler) takeSlot() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots == 0 || len(s.queue) > 0 || s.life.stopping() {
		return false
	}
	s.slots--
	return true
}

// startClaimed runs a job stored claimed, in the slot takeSlot gave.
func (s *scheduler) startClaimed(c claimed) {
	s.life.Go(func() {
		s.runner.runClaimed(c)
		s.releaseSlot()
		s.room.freed()
	})
}

// queueJob starts the job in a free slot, or queues it (at the front: a
// job that has waited for room already).
func (s *scheduler) queueJob(id string, front bool) {
	s.mu.Lock()
	if s.slots > 0 {
		s.slots--
		s.mu.Unlock()
		s.startSlot(id)
		return
	}
	if front {
		s.queue = append([]string{id}, s.queue...)
	} else {
		s.queue = append(s.queue, id)
	}
	s.mu.Unlock()
}

// releaseSlot hands a run slot to the next queued job, or gives it back.
// Once the engine closes, queued jobs stay pending for the next engine.
func (s *scheduler) releaseSlot() {
	s.mu.Lock()
	if len(s.queue) > 0 && !s.life.stopping() {
		id := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		s.startSlot(id)
		return
	}
	s.slots++
	s.mu.Unlock()
}

// startSlot runs a job in the slot the caller holds.
func (s *scheduler) startSlot(id string) {
	s.life.Go(func() {
		if s.life.stopping() {
			s.releaseSlot() // stays pending; the next engine picks it up
			return
		}
		adm, res, room := s.admit(id)
		if res == admitted {
			s.runner.run(id, adm)
			s.releaseSlot()
			s.room.freed()
			return
		}
		s.releaseSlot()
		if res == admitDrop || !s.waitForRoom(id, room) {
			return
		}
		s.queueJob(id, true)
	})
}

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
func (s *scheduler) admit(id string) (adm sandbox.Admission, res admitResult, room <-chan struct{}) {
	a, ok := s.backend.get().(sandbox.Admitter)
	if !ok {
		return nil, admitted, nil
	}
	room = s.room.wait()
	ctx := s.life.ctx
	job, err := s.store.GetJob(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("admit job", "job", id, "err", err)
		}
		return nil, admitDrop, nil
	}
	if job.Status != delegate.StatusPending {
		return nil, admitDrop, nil // cancelled while it waited
	}
	if job.Manifest.Sandbox != "" {
		return nil, admitted, nil // a kept sandbox's: no new machine
	}
	spec, err := sandboxSpec(job)
	if err != nil {
		s.failer.finish(id, delegate.StatusFailed, fmt.Sprintf("provisioning failed: %v", err), nil)
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
		s.waiting(job, "waiting for capacity: "+reason)
		return nil, admitWait, room
	default:
		s.failer.finish(id, delegate.StatusFailed, fmt.Sprintf("provisioning failed: %v", err), nil)
		return nil, admitDrop, nil
	}
}

// waiting records why a pending job waits, once per reason (a retry that
// finds the same shortage changes nothing).
func (s *scheduler) waiting(job *delegate.Job, msg string) {
	ctx := s.life.ctx
	msg = clip(msg)
	if job.Progress == msg {
		return
	}
	s.log.Info("job waits", "job", job.ID, "reason", msg)
	if _, err := s.jobs.update(ctx, job.ID, func(j *delegate.Job) error {
		if j.Status != delegate.StatusPending {
			return delegate.ErrTerminal
		}
		j.Progress = msg
		return nil
	}); err != nil {
		return
	}
	if job.Manifest.StatusMode != delegate.StatusModeSimple {
		if err := s.store.AddEvent(ctx, job.ID, delegate.Event{Time: time.Now().UTC(), Message: msg}, maxEvents); err != nil {
			s.log.Warn("store event", "job", job.ID, "err", err)
		}
	}
}

// waitForRoom blocks until room may have been freed, and reports whether
// the job should try again (false: it ended meanwhile, or the engine closes).
func (s *scheduler) waitForRoom(id string, room <-chan struct{}) bool {
	retry := time.NewTimer(s.retry)
	defer retry.Stop()
	for {
		changed := s.jobs.changes()
		select {
		case <-s.life.ctx.Done():
			return false
		case <-room:
			return true
		case <-retry.C:
			return true
		case <-changed:
			// Some job changed; if it is this one, it may have been cancelled.
			j, err := s.store.GetJob(s.life.ctx, id)
			if err != nil || j.Status != delegate.StatusPending {
				return false
			}
		}
	}
}
