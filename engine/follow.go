package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// follower is the part that follows a running job: it watches its
// process until it ends, is killed or times out, moving its output and
// status lines into the store as it goes (a tracker per job, tracker.go),
// delivers the answers to its questions, beats its heartbeat, and hands
// its end to the finisher. It also re-attaches to a job whose engine died.
type follower struct {
	cfg       Config
	log       *slog.Logger
	life      *group
	store     delegate.Store
	ref       *backendRef
	jobs      *jobWriter
	progress  *progressWriter
	questions *questions
	runs      registry // a re-attached job is registered as this engine's
	end       runEnder
}

// runEnder is what the follower asks of the finisher: a job's end settled
// (or failed), its sandbox destroyed.
type runEnder interface {
	settle(t *tracker, sb sandbox.Instance, exit sandbox.Exit, waitErr error, timedOut bool, endedAt time.Time, known *started)
	finish(id string, status delegate.Status, reason string, facts func(*delegate.Job))
	destroy(sandboxID string, m delegate.Manifest)
}

// backend is the engine's backend (nil for an engine made without one that
// has not needed to open it).
func (r *follower) backend() sandbox.Backend { return r.ref.get() }

// follow watches a running process until it ends, is killed, or times out,
// moving its output and status lines into the store as it goes. Only the
// engine's own end stops it early (the job then goes on, for the next
// engine to re-attach to).
//
// Each tick does a bounded amount of work (see collect), so that a job
// flooding its output or status channel cannot keep the loop from its
// timer: a job is killed at its timeout whatever it writes.
//
// known is what the run that started the job knows of it (nil: the job
// is followed after a restart or a takeover, and read from the store).
func (r *follower) follow(h *run, id string, sb sandbox.Instance, proc sandbox.Process, m delegate.Manifest, known *started) {
	ctx := r.life.ctx
	job := known.stored()
	if job == nil {
		var err error
		if job, err = r.store.GetJob(ctx, id); err != nil {
			r.log.Error("follow job", "job", id, "err", err)
			return
		}
	}
	t, err := r.newTracker(ctx, job, proc, known != nil)
	if err != nil {
		r.log.Error("follow job", "job", id, "err", err)
		return
	}
	r.questions.follow(id, sb)
	defer r.questions.unfollow(id)
	deadline := job.StartedAt.Add(time.Duration(m.TimeoutSeconds()) * time.Second)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	// The supervisor's liveness is the job's heartbeat where the backend
	// watches the process; it is recorded now and then, not on every tick.
	beat := time.NewTicker(max(r.cfg.HeartbeatThreshold/4, r.cfg.PollInterval))
	defer beat.Stop()
	supervised := r.backend().Capabilities().Supervised

	type waited struct {
		exit sandbox.Exit
		err  error
		at   time.Time
	}
	// Wait on a context of its own: at engine shutdown a job being killed
	// is still waited for.
	waitCtx, stopWait := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWait()
	done := make(chan waited, 1)
	r.life.Go(func() {
		exit, err := proc.Wait(waitCtx)
		if err == nil {
			h.exited.Store(true)
		}
		// Its end as its supervisor recorded it: a job that ended while
		// no server ran (this one adopts it) ended then, not now.
		at := time.Now().UTC()
		if err == nil && exit.EndedAt.After(job.StartedAt) && exit.EndedAt.Before(at) {
			at = exit.EndedAt.UTC()
		}
		done <- waited{exit, err, at}
	})

	var (
		timedOut, killing bool
		graceEnd          time.Time
	)
	kill := func() {
		killing = true
		if err := proc.Kill(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("kill job", "job", id, "err", err)
		}
	}
	timeout := func() {
		if timedOut {
			return
		}
		timedOut = true
		r.log.Info("job timed out", "job", id, "timeout", m.TimeoutSeconds())
		kill()
	}
	end := func(w waited) {
		// Its whole output is stored before its end is: retried while the
		// store does not take it (a full disk), the sandbox, which keeps
		// it, kept meanwhile.
		for wait := retryFirst; ; wait = nextWait(wait) {
			t.collect(context.WithoutCancel(ctx), true)
			if t.storeErr == nil {
				break
			}
			if givenUp(t.storeErr) {
				return // another server holds the job: its end is the adopter's
			}
			if !sleepCtx(ctx, wait) {
				r.log.Warn("the server is stopping with the job's output not stored; the next server settles it", "job", id)
				return
			}
		}
		r.end.settle(t, sb, w.exit, w.err, timedOut, w.at, known)
	}
	for {
		select {
		case w := <-done:
			end(w)
			return
		case <-ticker.C:
			if !time.Now().Before(deadline) {
				timeout() // the timer is due too; do not let a busy tick delay it
				continue
			}
			t.collect(ctx, false)
			r.questions.deliver(ctx, id)
			// This engine, or another process (the CLI, a callback
			// received by another server), may have ended it. A job that
			// reported its own completion gets a moment to exit by itself,
			// so that its real exit code is kept; a cancelled one is
			// killed at once.
			if st := h.end.Load(); st != nil && !killing {
				if *st == delegate.StatusCancelled {
					kill()
				} else if graceEnd.IsZero() {
					graceEnd = time.Now().Add(completionGrace)
				} else if time.Now().After(graceEnd) {
					kill()
				}
			}
		case <-beat.C:
			if supervised {
				r.progress.report(id, "", nil, false, r.jobs.lease.wall())
			}
		case <-h.kill:
			kill()
		case <-h.abandon:
			// Another server adopted the job: it follows the process now.
			r.log.Warn("stopped following a job another server holds now", "job", id)
			return
		case <-timer.C:
			timeout()
		case <-ctx.Done():
			// Engine closing: a running job goes on, for the next engine to
			// re-attach to; a job that has ended (or is being killed) is
			// seen to its end, so that its sandbox is not left behind.
			if !killing && graceEnd.IsZero() {
				j, err := r.store.GetJob(context.WithoutCancel(ctx), id)
				if err != nil || !j.Status.Terminal() {
					return
				}
			}
			if !killing {
				kill()
			}
			select {
			case w := <-done:
				end(w)
			case <-time.After(10 * time.Second):
			}
			return
		}
	}
}

// completionGrace is how long a job that reported its completion may take
// to exit on its own before it is killed.
const completionGrace = 5 * time.Second

// fresh: the job has just started (nothing of its output is stored yet).
func (r *follower) newTracker(ctx context.Context, job *delegate.Job, proc sandbox.Process, fresh bool) (*tracker, error) {
	var kept int64
	if !fresh {
		var err error
		if kept, err = r.store.OutputSize(ctx, job.ID); err != nil {
			return nil, err
		}
	}
	var secrets []string
	for _, name := range job.Manifest.Secrets {
		if v, ok := r.cfg.Secret(name); ok {
			secrets = append(secrets, v)
		}
	}
	// After a restart the status channel is read again from the start; the
	// timeline may repeat a little, nothing is lost.
	return &tracker{f: r, id: job.ID, m: job.Manifest, proc: proc, redact: newRedactor(secrets), kept: kept,
		next: job.OutputRead, read: job.OutputRead}, nil
}

// reattach follows a running job whose engine died, if its process is
// still there; otherwise it fails the job and removes what is left.
func (r *follower) reattach(ctx context.Context, job *delegate.Job) {
	log := r.log.With("job", job.ID, "sandbox", job.SandboxID)
	fail := func(err error) {
		log.Warn("job lost with its sandbox", "err", err)
		r.end.finish(job.ID, delegate.StatusFailed, fmt.Sprintf("sandbox lost after a server restart: %v", err), nil)
		// A kept sandbox's command (or the job that made it): the
		// machine is the sandbox's, whose timers end it (and whose next
		// use finds it gone, if it is); its end above counts the command
		// out there.
		if job.Sandbox == "" && job.SandboxID != "" {
			r.end.destroy(job.SandboxID, delegate.Manifest{})
		}
	}
	if job.SandboxID == "" || job.ExecID == "" {
		fail(errors.New("no sandbox was recorded"))
		return
	}
	sb, err := r.backend().Recover(ctx, job.SandboxID)
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
	h, _ := r.runs.register(job.ID)
	r.life.Go(func() {
		defer r.runs.unregister(job.ID)
		r.follow(h, job.ID, sb, proc, job.Manifest, nil)
	})
}

// started is what the run that started a job knows of it, which its
// follower would otherwise read from the store again; a job followed
// after a restart or a takeover has none (nil).
type started struct {
	job *delegate.Job // as stored when it began running
	net *jobNetwork   // its network through the proxy; nil if none
	// workspace: its end may have workspace changes to collect.
	workspace bool
	// imported: the baseline of its own import, as stored (nil when not
	// kept: the store has it).
	imported *delegate.JobWorkspace
}

// stored is the job as its run stored it last; nil if unknown.
func (s *started) stored() *delegate.Job {
	if s == nil {
		return nil
	}
	return s.job
}
