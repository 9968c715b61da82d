package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// finisher is the part that ends a job's run: it settles how the process
// ended (its status, exit code, artifacts, workspace changes, network
// log), records the end, and destroys an ephemeral sandbox — or rolls
// back one whose command never ran. It keeps no state of its own.
type finisher struct {
	cfg      Config
	log      *slog.Logger
	life     *group
	store    delegate.Store
	ref      *backendRef
	jobs     *jobWriter
	progress *progressWriter
	tokens   *tokenIndex        // the callback tokens: a job's stops working at its end
	ws       workspaceCollector // its changes and its clone
	// roomFreed: a sandbox is gone, jobs waiting for capacity may fit now.
	roomFreed func()
	space     space // the data dir: a job that failed for lack of room says so
}

// workspaceCollector is what the finisher asks of the workspaces part: a
// job's changes read back before its sandbox goes, and its clone removed.
type workspaceCollector interface {
	collectChanges(ctx context.Context, id string, inst sandbox.Instance, imported *delegate.JobWorkspace)
	removeClone(id string, m delegate.Manifest)
}

// backend is the engine's backend (nil for an engine made without one that
// has not needed to open it).
func (r *finisher) backend() sandbox.Backend { return r.ref.get() }

// settle records how the process ended, collects artifacts, and destroys an
// ephemeral sandbox.
func (r *finisher) settle(t *tracker, sb sandbox.Instance, exit sandbox.Exit, waitErr error, timedOut bool, endedAt time.Time, known *started) {
	id, m := t.id, t.m
	var (
		status = delegate.StatusSuccess
		reason string
		code   *int
	)
	switch {
	case waitErr != nil:
		status, reason = delegate.StatusFailed, r.endReason(waitErr)
	case timedOut || exit.DeadlineExceeded:
		status, reason = delegate.StatusTimeout, fmt.Sprintf("timed out after %ds (manifest.timeout); every process of the job was killed", m.TimeoutSeconds())
	case exit.OOMKilled:
		status, reason = delegate.StatusFailed, fmt.Sprintf("out of memory: killed by the kernel at the %s memory limit (raise resources.memory)", m.Resources.Memory)
	case exit.Reason != "":
		status, reason = delegate.StatusFailed, fmt.Sprintf("the sandbox failed: %s", exit.Reason)
	case exit.Code != 0 && exit.Signal != "":
		status, reason = delegate.StatusFailed, fmt.Sprintf("killed by signal %s (exit code %d)", exit.Signal, exit.Code)
	case exit.Code != 0:
		status, reason = delegate.StatusFailed, fmt.Sprintf("exit code %d", exit.Code)
	}
	if waitErr == nil {
		c := exit.Code
		code = &c
	}
	// So is its network log (its own network's, or its kept sandbox's,
	// which goes on).
	if r.cfg.Egress != nil && (m.Network.Reaches() || m.Sandbox != "") {
		ctx := context.WithoutCancel(r.life.ctx)
		if known != nil {
			if known.net != nil {
				r.cfg.Egress.settle(ctx, known.net.id)
			}
		} else if netID, err := resolveNetwork(ctx, r.store, id); err == nil {
			r.cfg.Egress.settle(ctx, netID)
		}
	}
	// Artifacts are collected before the job is marked finished, so that a
	// client that sees the end also sees them.
	if len(m.Artifacts) > 0 && waitErr == nil {
		r.collectArtifacts(context.WithoutCancel(r.life.ctx), id, m, sb)
	}
	// So are the changes to its workspace, before the sandbox goes.
	if waitErr == nil && (known == nil || known.workspace) {
		var imported *delegate.JobWorkspace
		if known != nil {
			imported = known.imported
		}
		r.ws.collectChanges(context.WithoutCancel(r.life.ctx), id, sb, imported)
	}
	if m.Lifecycle != delegate.LifecyclePersistent {
		r.ws.removeClone(id, m) // its changes' old side is read
	}
	// Output the command wrote within the limit that the sandbox did not
	// keep for the tracker to read (its disk was full, most likely the
	// data dir's): stored as lost, with why, never as complete.
	var lost int64
	if waitErr == nil {
		lost = min(exit.OutputBytes, r.cfg.OutputLimit) - t.next
	}
	lostWhy := ""
	if lost > 0 {
		lostWhy = fmt.Sprintf("the sandbox kept %d of the %d bytes of output the command wrote within the output limit", t.next,
			min(exit.OutputBytes, r.cfg.OutputLimit))
		if r.space.low() {
			lostWhy = fmt.Sprintf("no space left on %s: %s", r.space.dir, lostWhy)
		}
		r.log.Warn("job output lost", "job", id, "lost_bytes", lost, "why", lostWhy)
	}
	// Its end is also its kept sandbox's (if it ran in one): the
	// sandbox's activity is read from its jobs.
	stored := r.finishStored(id, status, t.redact.string(reason), endedAt, r.jobEnded, func(j *delegate.Job) {
		if j.ExitCode == nil { // a completion callback may have reported one
			j.ExitCode = code
		}
		j.OOMKilled = exit.OOMKilled
		if waitErr == nil {
			j.OutputBytes = max(j.OutputBytes, exit.OutputBytes)
			j.OutputTruncated = exit.Truncated || j.OutputBytes > r.cfg.OutputLimit
		}
		if lost > 0 {
			j.OutputLostBytes, j.OutputLost = lost, lostWhy
		}
		if len(exit.CacheMisses) > 0 {
			j.CacheMissed = cacheMissed(exit.CacheMisses)
		}
	})
	// Never before its end is stored: the next server finds the sandbox
	// and settles the job from it.
	if stored {
		r.destroy(sb.ID(), m)
	}
}

// cacheMissed says which caches a job had an empty one of, and why, as
// its result tells it (Job.CacheMissed).
func cacheMissed(misses []sandbox.CacheMiss) string {
	parts := make([]string, len(misses))
	for i, m := range misses {
		parts[i] = m.Name + ": " + m.Reason
	}
	return clip(strings.Join(parts, "; "))
}

// endReason says why a job failed whose process's end could not be read:
// for lack of room where the sandbox records it (the data dir, for the
// local backend), that, rather than the backend's words for a supervisor
// that died without a record.
func (r *finisher) endReason(waitErr error) string {
	if isNoSpace(waitErr) || r.space.low() {
		return fmt.Sprintf("no space left on %s: the sandbox could not record how the command ended (%v)", r.space.where(), waitErr)
	}
	return fmt.Sprintf("lost the job's process: %v", waitErr)
}

// finish moves the job to a terminal status. If it already is terminal (a
// cancel won the race), the status stays, and only facts (exit code, output
// size) are recorded. The job's pending progress is stored first, and the
// end is stored before finish returns.
func (r *finisher) finish(id string, status delegate.Status, reason string, facts func(*delegate.Job)) {
	r.finishAt(id, status, reason, time.Now().UTC(), nil, facts)
}

// finishAt is finish for a job that ended at a known time (its process
// exited then): its duration does not include what was done after. stored,
// if set, sees the finished job before anyone waiting for it is woken.
func (r *finisher) finishAt(id string, status delegate.Status, reason string, at time.Time, stored func(*delegate.Job), facts func(*delegate.Job)) {
	r.finishStored(id, status, reason, at, stored, facts)
}

// finishStored is finishAt, retried until the store takes the end (a
// full disk, a store that does not answer), and it tells whether it did:
// false only when the job is gone from the store, or the engine is
// closing (the job is then still running in the store, for the next
// server to settle).
func (r *finisher) finishStored(id string, status delegate.Status, reason string, at time.Time, stored func(*delegate.Job), facts func(*delegate.Job)) bool {
	ctx := context.WithoutCancel(r.life.ctx)
	var (
		j   *delegate.Job
		err error
	)
	for wait, tries := retryFirst, 0; ; wait, tries = nextWait(wait), tries+1 {
		r.progress.flushJob(ctx, id)
		j, err = r.jobs.updateThen(ctx, id, stored, func(j *delegate.Job) error {
			if facts != nil {
				facts(j)
			}
			if j.Status.Terminal() {
				return nil
			}
			j.Status, j.Error, j.FinishedAt = status, reason, at
			j.Progress = string(status)
			return nil
		})
		if err == nil {
			break
		}
		if errors.Is(err, delegate.ErrNotFound) {
			r.log.Error("finish job", "job", id, "err", err)
			return false
		}
		if givenUp(err) {
			return false // another server holds the job: its end is the adopter's to store
		}
		if tries == 0 || wait == retryMax && tries%12 == 0 { // then about once a minute
			r.log.Error("finish job: its end is not stored; trying again, its sandbox kept until it is", "job", id,
				"err", r.space.explain(err), "cause", err)
		}
		if !sleepCtx(r.life.ctx, wait) {
			r.log.Warn("finish job: the server is stopping with the job's end not stored; the next server settles it", "job", id)
			return false
		}
	}
	r.tokens.forget(id)
	r.log.Info("job finished", "job", id, "status", j.Status, "reason", j.Error)
	return true
}

// destroy removes an ephemeral job's sandbox; a persistent one is kept.
func (r *finisher) destroy(sandboxID string, m delegate.Manifest) {
	if m.Lifecycle == delegate.LifecyclePersistent {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.life.ctx), 2*time.Minute)
	defer cancel()
	if err := r.backend().Destroy(ctx, sandboxID); err != nil {
		// The cleanup loop will try again.
		r.log.Warn("destroy sandbox", "sandbox", sandboxID, "err", err)
		return
	}
	r.roomFreed()
}

// rollback destroys a sandbox whose command never ran (provisioning
// failed, was cancelled or interrupted), whatever the job's lifecycle:
// there is nothing in it to keep.
func (r *finisher) rollback(jobID, sandboxID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.life.ctx), 2*time.Minute)
	defer cancel()
	if err := r.backend().Destroy(ctx, sandboxID); err != nil {
		// The job has ended: the cleanup loop will try again.
		r.log.Warn("roll back sandbox", "job", jobID, "sandbox", sandboxID, "err", err)
		return
	}
	r.jobs.update(ctx, jobID, func(j *delegate.Job) error {
		if j.SandboxID == sandboxID {
			j.SandboxID, j.ExecID = "", ""
		}
		return nil
	})
	r.log.Info("rolled back sandbox", "job", jobID, "sandbox", sandboxID)
}

// jobEnded tells the observer how a job this engine followed ended, as the
// store has it (a cancel or a completion callback may have decided it). It
// is called before anyone waiting for the job is woken, so that whoever
// sees the end also sees it counted.
func (r *finisher) jobEnded(j *delegate.Job) {
	if r.cfg.Observer == nil || !j.Status.Terminal() {
		return
	}
	r.cfg.Observer.JobEnded(j.Backend, j.Status, j.Duration(time.Now()))
}
