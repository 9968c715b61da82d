package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

var errSkip = errors.New("skip")

// recover adopts the unfinished jobs of engines that are no longer alive:
// pending jobs are queued again, running jobs are re-attached to their
// sandbox if it is still there and failed with a reason otherwise, and jobs
// caught mid-provisioning are failed (their half-made sandbox destroyed).
func (e *Engine) recover(ctx context.Context) error {
	var orphans []*delegate.Job
	cursor := ""
	for {
		jobs, next, err := e.store.ListJobs(ctx, delegate.JobFilter{Active: true, Limit: 200, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if j.Owner != e.owner && (j.Owner == "" || !e.cfg.OwnerAlive(j.Owner)) {
				orphans = append(orphans, j)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	// Oldest first, so that re-queued jobs keep their order.
	for i := len(orphans) - 1; i >= 0; i-- {
		e.adopt(ctx, orphans[i])
	}
	return nil
}

func (e *Engine) adopt(ctx context.Context, old *delegate.Job) {
	job, err := e.update(ctx, old.ID, func(j *delegate.Job) error {
		if j.Owner != old.Owner || j.Status.Terminal() {
			return errSkip // another engine adopted it first, or it ended
		}
		j.Owner = e.owner
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			e.log.Warn("adopt job", "job", old.ID, "err", err)
		}
		return
	}
	log := e.log.With("job", job.ID, "previous_owner", old.Owner)
	switch job.Status {
	case delegate.StatusPending:
		log.Info("re-queued job after restart")
		e.enqueue(job.ID)
	case delegate.StatusProvisioning:
		log.Info("failing job interrupted during provisioning")
		e.finish(job.ID, delegate.StatusFailed, "the server stopped while the sandbox was being provisioned; submit the job again", nil)
		if job.SandboxID != "" {
			e.rollback(job.ID, job.SandboxID)
		}
	case delegate.StatusRunning:
		e.reattach(ctx, job)
	}
}

// reattach follows a running job whose engine died, if its process is
// still there; otherwise it fails the job and removes what is left.
func (e *Engine) reattach(ctx context.Context, job *delegate.Job) {
	log := e.log.With("job", job.ID, "sandbox", job.SandboxID)
	fail := func(err error) {
		log.Warn("job lost with its sandbox", "err", err)
		e.finish(job.ID, delegate.StatusFailed, fmt.Sprintf("sandbox lost after a server restart: %v", err), nil)
		if job.SandboxID != "" {
			e.destroy(job.SandboxID, delegate.Manifest{})
		}
	}
	if job.SandboxID == "" || job.ExecID == "" {
		fail(errors.New("no sandbox was recorded"))
		return
	}
	sb, err := e.backend.Recover(ctx, job.SandboxID)
	if err != nil {
		fail(err)
		return
	}
	proc, err := sb.Process(ctx, job.ExecID)
	if err != nil {
		fail(err)
		return
	}
	log.Info("re-attached to running job")
	r, _ := e.register(job.ID)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer e.unregister(job.ID)
		e.follow(r, job.ID, sb, proc, job.Manifest)
	}()
}

// cleanup adopts jobs of engines that died while this one runs and
// destroys sandboxes no job owns.
func (e *Engine) cleanup(ctx context.Context) {
	if err := e.recover(ctx); err != nil && ctx.Err() == nil {
		e.log.Warn("recover jobs", "err", err)
	}
	e.sweep(ctx)
}

// sweep destroys sandboxes that belong to no live job: the sandbox of a
// finished ephemeral job at once (its destroy was interrupted), one whose
// job is gone or unknown after two sweeps in a row. A sandbox whose job is
// still active is never taken: it may be being provisioned right now,
// before the job records it.
func (e *Engine) sweep(ctx context.Context) {
	infos, err := e.backend.List(ctx)
	if err != nil {
		e.log.Warn("list sandboxes", "err", err)
		return
	}
	unknown := make(map[string]struct{})
	for _, sb := range infos {
		job, err := e.jobOfSandbox(ctx, sb)
		if err != nil {
			e.log.Warn("sweep", "sandbox", sb.ID, "err", err)
			continue
		}
		switch {
		case job != nil && !job.Status.Terminal():
			continue
		case job != nil && e.drives(job.ID):
			continue // finished, and its sandbox is being destroyed right now
		case job != nil && job.Owner != "" && job.Owner != e.owner && e.cfg.OwnerAlive(job.Owner):
			continue // another live engine's: it destroys it (or its sweep does)
		case job != nil && job.Manifest.Lifecycle == delegate.LifecyclePersistent && job.SandboxID == sb.ID:
			continue // kept until release_job
		case job == nil:
			unknown[sb.ID] = struct{}{}
			e.mu.Lock()
			_, again := e.suspect[sb.ID]
			e.mu.Unlock()
			if !again {
				continue
			}
		case job.SandboxID != "" && job.SandboxID != sb.ID:
			// A finished job whose sandbox is another one: this one is a
			// leftover of a failed provisioning attempt.
		}
		e.log.Info("destroying orphaned sandbox", "sandbox", sb.ID, "job", sb.JobID)
		if err := e.backend.Destroy(ctx, sb.ID); err != nil {
			e.log.Warn("destroy orphaned sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	e.mu.Lock()
	e.suspect = unknown
	e.mu.Unlock()
}

// jobOfSandbox finds the job a sandbox belongs to: the one that recorded
// it, else the one it was made for; nil if neither exists.
func (e *Engine) jobOfSandbox(ctx context.Context, sb sandbox.Info) (*delegate.Job, error) {
	jobs, _, err := e.store.ListJobs(ctx, delegate.JobFilter{SandboxID: sb.ID, Limit: 1})
	if err != nil {
		return nil, err
	}
	if len(jobs) == 1 {
		return jobs[0], nil
	}
	if sb.JobID == "" {
		return nil, nil
	}
	job, err := e.store.GetJob(ctx, sb.JobID)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, nil
	}
	return job, err
}

// drives reports whether this engine is driving a job (it has not let go
// of it yet: it may be destroying its sandbox).
func (e *Engine) drives(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[id] != nil
}
