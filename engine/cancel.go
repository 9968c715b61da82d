package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// cancelOrphan cancels a job that no live engine drives (its server died
// or was stopped, and no server has adopted it yet), which nobody else
// would stop: it takes the job over with the compare-and-set recovery
// uses, so that a server starting at that moment leaves it alone, then
// kills its process, collects what it wrote and destroys its sandbox
// itself, as the job's own engine would have. done is false when the job
// is not such an orphan (or cannot be stopped from here): Cancel then
// records the cancellation for the engine that drives it.
func (e *Engine) cancelOrphan(ctx context.Context, id string) (job *delegate.Job, cancelled, done bool, err error) {
	old, err := e.store.GetJob(ctx, id)
	if err != nil {
		return nil, false, true, err
	}
	if old.Status.Terminal() {
		return old, false, true, nil
	}
	if old.Status == delegate.StatusPending || old.Owner == e.owner || (old.Owner != "" && e.cfg.OwnerAlive(old.Owner)) {
		return nil, false, false, nil // nothing to stop yet, or its engine does it
	}
	log := e.log.With("job", id, "sandbox", old.SandboxID, "previous_owner", old.Owner)
	backend, err := e.backendFor(ctx)
	if err != nil {
		log.Warn("cannot stop the sandbox of a job no server drives; the next server to start will", "err", err)
		return nil, false, false, nil
	}
	if old.Backend != "" && old.Backend != backend.Name() {
		log.Warn("the job ran on another backend; the next server of that backend will stop it", "job_backend", old.Backend, "backend", backend.Name())
		return nil, false, false, nil
	}
	job, err = e.update(ctx, id, func(j *delegate.Job) error {
		if j.Owner != old.Owner || j.Status.Terminal() {
			return errSkip // adopted by a server meanwhile, or ended
		}
		j.Owner = e.owner
		markCancelled(j)
		return nil
	})
	if errors.Is(err, errSkip) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, true, err
	}
	log.Info("job cancelled; no server drives it, stopping its sandbox here")
	e.stopOrphan(ctx, backend, job)
	job, err = e.store.GetJob(context.WithoutCancel(ctx), id)
	return job, true, true, err
}

// markCancelled records a cancellation on a job that has not finished.
func markCancelled(j *delegate.Job) {
	j.Status = delegate.StatusCancelled
	j.Error = "cancelled by request"
	j.Progress = "cancelled"
	j.FinishedAt = time.Now().UTC()
}

// stopOrphan kills the process of a job this engine has just taken over
// and destroys its sandbox. A job that had started its command is
// followed to its end like any other (its last output and exit are
// kept, an ephemeral sandbox destroyed, a persistent one kept for
// release_job); a sandbox that never ran its command is rolled back,
// also one its engine made but had not recorded yet.
func (e *Engine) stopOrphan(ctx context.Context, backend sandbox.Backend, job *delegate.Job) {
	if job.ExecID != "" {
		sb, err := backend.Recover(ctx, job.SandboxID)
		var proc sandbox.Process
		if err == nil {
			proc, err = sb.Process(ctx, job.ExecID)
		}
		if err == nil {
			r, _ := e.register(job.ID)
			r.killNow()
			done := make(chan struct{})
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer close(done)
				defer e.unregister(job.ID)
				e.follow(r, job.ID, sb, proc, job.Manifest)
			}()
			select {
			case <-done:
			case <-ctx.Done(): // the engine's Close still waits for it
			}
			return
		}
		e.log.Info("the cancelled job's process is gone", "job", job.ID, "err", err)
	}
	if job.SandboxID != "" {
		e.rollback(job.ID, job.SandboxID)
	}
	// Its engine is gone and this one owns the job now: no sandbox for it
	// is still being made, so every one made for it is a leftover.
	infos, err := backend.List(ctx)
	if err != nil {
		e.log.Warn("list sandboxes", "err", err)
		return
	}
	for _, in := range infos {
		if in.JobID == job.ID && in.ID != job.SandboxID {
			e.rollback(job.ID, in.ID)
		}
	}
}

// rollback destroys a sandbox whose command never ran (provisioning
// failed, was cancelled or interrupted), whatever the job's lifecycle:
// there is nothing in it to keep.
func (e *Engine) rollback(jobID, sandboxID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 2*time.Minute)
	defer cancel()
	if err := e.backend.Destroy(ctx, sandboxID); err != nil {
		// The job has ended: the cleanup loop will try again.
		e.log.Warn("roll back sandbox", "job", jobID, "sandbox", sandboxID, "err", err)
		return
	}
	e.update(ctx, jobID, func(j *delegate.Job) error {
		if j.SandboxID == sandboxID {
			j.SandboxID, j.ExecID = "", ""
		}
		return nil
	})
	e.log.Info("rolled back sandbox", "job", jobID, "sandbox", sandboxID)
}

// backendFor returns the engine's backend, opening it with
// Config.OpenBackend if the engine was made without one (a command-line
// tool that only needs it to stop an orphaned job).
func (e *Engine) backendFor(ctx context.Context) (sandbox.Backend, error) {
	e.mu.Lock()
	b := e.backend
	e.mu.Unlock()
	if b != nil {
		return b, nil
	}
	if e.cfg.OpenBackend == nil {
		return nil, errors.New("this engine has no sandbox backend")
	}
	b, err := e.cfg.OpenBackend(ctx)
	if err != nil {
		return nil, fmt.Errorf("open the sandbox backend: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.backend == nil {
		e.backend = b
	}
	return e.backend, nil
}
