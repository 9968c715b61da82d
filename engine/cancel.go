package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// orphans is the part that cancels a job no live engine drives: it takes
// the job over, kills its process (followed to its end like any other)
// or rolls its sandbox back. It keeps no state of its own.
type orphans struct {
	cfg    Config
	log    *slog.Logger
	owner  string
	life   *group
	store  delegate.Store
	ref    *backendRef
	jobs   *jobWriter
	runs   registry
	follow runFollower // the follower, for a job whose command ran
	end    rollbacker  // the finisher, for a sandbox whose command never ran
}

// rollbacker destroys a sandbox whose command never ran (the finisher).
type rollbacker interface{ rollback(jobID, sandboxID string) }

// cancelOrphan cancels a job that no live engine drives (its server died
// or was stopped, and no server has adopted it yet), which nobody else
// would stop: it takes the job over with the compare-and-set recovery
// uses, so that a server starting at that moment leaves it alone, then
// kills its process, collects what it wrote and destroys its sandbox
// itself, as the job's own engine would have. done is false when the job
// is not such an orphan (or cannot be stopped from here): Cancel then
// records the cancellation for the engine that drives it.
func (r *orphans) cancelOrphan(ctx context.Context, id string) (job *delegate.Job, cancelled, done bool, err error) {
	old, err := r.store.GetJob(ctx, id)
	if err != nil {
		return nil, false, true, err
	}
	if old.Status.Terminal() {
		return old, false, true, nil
	}
	if old.Status == delegate.StatusPending || old.Owner == r.owner || (old.Owner != "" && r.cfg.OwnerAlive(old.Owner)) {
		return nil, false, false, nil // nothing to stop yet, or its engine does it
	}
	log := r.log.With("job", id, "sandbox", old.SandboxID, "previous_owner", old.Owner)
	backend, err := r.ref.opened(ctx)
	if err != nil {
		log.Warn("cannot stop the sandbox of a job no server drives; the next server to start will", "err", err)
		return nil, false, false, nil
	}
	if old.Backend != "" && old.Backend != backend.Name() {
		log.Warn("the job ran on another backend; the next server of that backend will stop it", "job_backend", old.Backend, "backend", backend.Name())
		return nil, false, false, nil
	}
	job, err = r.jobs.update(ctx, id, func(j *delegate.Job) error {
		if j.Owner != old.Owner || j.Status.Terminal() {
			return errSkip // adopted by a server meanwhile, or ended
		}
		j.Owner = r.owner
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
	r.stopOrphan(ctx, backend, job)
	job, err = r.store.GetJob(context.WithoutCancel(ctx), id)
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
func (r *orphans) stopOrphan(ctx context.Context, backend sandbox.Backend, job *delegate.Job) {
	if job.ExecID != "" {
		sb, err := backend.Recover(ctx, job.SandboxID)
		var proc sandbox.Process
		if err == nil {
			proc, err = sb.Process(ctx, job.ExecID)
		}
		if err == nil {
			h, _ := r.runs.register(job.ID)
			h.killNow()
			done := make(chan struct{})
			r.life.Go(func() {
				defer close(done)
				defer r.runs.unregister(job.ID)
				r.follow.follow(h, job.ID, sb, proc, job.Manifest, nil)
			})
			select {
			case <-done:
			case <-ctx.Done(): // the engine's Close still waits for it
			}
			return
		}
		r.log.Info("the cancelled job's process is gone", "job", job.ID, "err", err)
	}
	if job.SandboxID != "" {
		r.end.rollback(job.ID, job.SandboxID)
	}
	// Its engine is gone and this one owns the job now: no sandbox for it
	// is still being made, so every one made for it is a leftover.
	infos, err := backend.List(ctx)
	if err != nil {
		r.log.Warn("list sandboxes", "err", err)
		return
	}
	for _, in := range infos {
		if in.JobID == job.ID && in.ID != job.SandboxID {
			r.end.rollback(job.ID, in.ID)
		}
	}
}
