package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

var errSkip = errors.New("skip")

// maintenance is the part that keeps the store and the backend true to
// each other while the engine runs: it adopts the jobs of engines that
// died (recovery), destroys sandboxes no job owns (the sweep), fails jobs
// that lost their heartbeat (the watchdog), and notices jobs finished by
// other processes. Each of these is one call (a pass), run on a timer by
// start and callable alone by tests.
type maintenance struct {
	cfg      Config
	log      *slog.Logger
	owner    string
	store    delegate.Store
	ref      *backendRef
	jobs     *jobWriter
	runs     drivenRuns
	sched    requeuer
	end      ender
	follower reattacher
	tokens   interface{ ids() []string } // the callbacks' index of tokens
	read     interface {
		Get(ctx context.Context, id string) (*delegate.Job, error)
	}
	keeper keptMachines
	timers interface{ tick(ctx context.Context) } // the kept sandboxes' timers

	mu      sync.Mutex
	suspect map[string]struct{} // sandboxes found orphaned by the last sweep

	// away is when this server was not running (checkHeartbeats' alone).
	away pauses
}

// heartbeatEvery is the heartbeat checker's period.
func (m *maintenance) heartbeatEvery() time.Duration {
	return max(m.cfg.HeartbeatThreshold/4, 100*time.Millisecond)
}

// What maintenance asks of the other parts, each given at construction.
type (
	// drivenRuns (the table of runs): the jobs this engine drives.
	drivenRuns interface {
		drives(id string) bool
		driven() []string
		handle(id string) *run
	}
	// requeuer (the scheduler) queues an adopted pending job again.
	requeuer interface{ enqueue(id string) }
	// ender (the finisher) fails a job, and rolls back a sandbox whose
	// command never ran.
	ender interface {
		finish(id string, status delegate.Status, reason string, facts func(*delegate.Job))
		rollback(jobID, sandboxID string)
	}
	// reattacher (the follower) follows an adopted running job.
	reattacher interface {
		reattach(ctx context.Context, job *delegate.Job)
	}
	// keptMachines (the keeper): whether a machine is a live kept
	// sandbox's, and a sandbox ended.
	keptMachines interface {
		keeps(ctx context.Context, backend string, info sandbox.Info) bool
		end(ctx context.Context, id string, state delegate.SandboxState, reason string) (*delegate.Sandbox, bool, error)
	}
)

// start recovers jobs left by engines that have died, sweeps, and starts
// the timers. It returns once recovery has been decided for every job.
func (m *maintenance) start(ctx context.Context, life *group) error {
	// Finishes from now on are watched for (see watchFinishes).
	own := m.jobs.own.Load()
	finishes, err := m.store.Finishes(ctx)
	if err != nil {
		return err
	}
	if err := m.recover(ctx); err != nil {
		return fmt.Errorf("recover jobs: %w", err)
	}
	if m.ref.get() != nil {
		m.sweep(ctx)
	}
	life.every(m.cfg.CleanupInterval, m.cleanup)
	m.away.tick(time.Now(), 0) // the checker's clock starts now
	life.every(m.heartbeatEvery(), m.checkHeartbeats)
	poll := m.cfg.PollInterval
	if feed, ok := m.store.(delegate.JobFeed); ok {
		poll = m.cfg.ChangePoll
		life.Go(func() { m.listen(life.ctx, feed) })
	}
	life.every(poll, m.watchFinishes(finishes, own))
	life.every(m.cfg.SandboxTick, m.timers.tick)
	return nil
}

// recover adopts the unfinished jobs of engines that are no longer alive:
// pending jobs are queued again, running jobs are re-attached to their
// sandbox if it is still there and failed with a reason otherwise, and jobs
// caught mid-provisioning are failed (their half-made sandbox destroyed).
func (m *maintenance) recover(ctx context.Context) error {
	var orphans []*delegate.Job
	cursor := ""
	for {
		jobs, next, err := m.store.ListJobs(ctx, delegate.JobFilter{Active: true, Limit: 200, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if j.Owner != m.owner && (j.Owner == "" || !m.cfg.OwnerAlive(j.Owner)) {
				orphans = append(orphans, j)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if m.jobs.lease != nil {
		// Servers share the store: adopted through it, at a new epoch.
		m.adoptLeased(ctx, orphans)
		return nil
	}
	// Oldest first, so that re-queued jobs keep their order.
	for i := len(orphans) - 1; i >= 0; i-- {
		m.adopt(ctx, orphans[i])
	}
	return nil
}

func (m *maintenance) adopt(ctx context.Context, old *delegate.Job) {
	job, err := m.jobs.update(ctx, old.ID, func(j *delegate.Job) error {
		if j.Owner != old.Owner || j.Status.Terminal() {
			return errSkip // another engine adopted it first, or it ended
		}
		j.Owner = m.owner
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			m.log.Warn("adopt job", "job", old.ID, "err", err)
		}
		return
	}
	m.resume(ctx, job, old.Owner)
}

// resume takes up a job adopted from an engine that died: queued again,
// re-attached, or failed with why.
func (m *maintenance) resume(ctx context.Context, job *delegate.Job, from string) {
	log := m.log.With("job", job.ID, "previous_owner", from)
	if m.elsewhere(ctx, job, from) {
		return
	}
	switch job.Status {
	case delegate.StatusPending:
		log.Info("re-queued job after restart")
		m.sched.enqueue(job.ID)
	case delegate.StatusProvisioning:
		if m.retry(ctx, job) {
			return
		}
		log.Info("failing job interrupted during provisioning")
		m.end.finish(job.ID, delegate.StatusFailed, m.interrupted(job), nil)
		switch {
		case job.Manifest.Sandbox != "":
			// A command in a kept sandbox: the machine is the sandbox's,
			// which stays; its end above counts the command out there.
		case job.SandboxID != "":
			m.end.rollback(job.ID, job.SandboxID)
			if job.Sandbox != "" {
				m.keeper.end(ctx, job.Sandbox, delegate.SandboxGone, "the job that made it was interrupted while it was provisioned")
			}
		}
	case delegate.StatusRunning:
		m.follower.reattach(ctx, job)
	}
}

// cleanup adopts jobs of engines that died while this one runs and
// destroys sandboxes no job owns.
func (m *maintenance) cleanup(ctx context.Context) {
	if err := m.recover(ctx); err != nil && ctx.Err() == nil {
		m.log.Warn("recover jobs", "err", err)
	}
	m.sweep(ctx)
}

// sweep destroys sandboxes that belong to no live job: the sandbox of a
// finished ephemeral job at once (its destroy was interrupted), one whose
// job is gone or unknown after two sweeps in a row. A sandbox whose job is
// still active is never taken: it may be being provisioned right now,
// before the job records it.
func (m *maintenance) sweep(ctx context.Context) {
	backend := m.ref.get()
	if backend == nil {
		return
	}
	infos, err := backend.List(ctx)
	if err != nil {
		m.log.Warn("list sandboxes", "err", err)
		return
	}
	m.mu.Lock()
	suspect := m.suspect
	m.mu.Unlock()
	unknown := make(map[string]struct{})
	for _, sb := range infos {
		job, err := m.jobOfSandbox(ctx, sb)
		if err != nil {
			m.log.Warn("sweep", "sandbox", sb.ID, "err", err)
			continue
		}
		switch {
		case job != nil && !job.Status.Terminal():
			continue
		case job != nil && m.runs.drives(job.ID):
			continue // finished, and its sandbox is being destroyed right now
		case job != nil && job.Owner != "" && job.Owner != m.owner && m.cfg.OwnerAlive(job.Owner):
			continue // another live engine's: it destroys it (or its sweep does)
		case job != nil && job.Manifest.Lifecycle == delegate.LifecyclePersistent && job.SandboxID == sb.ID && job.Sandbox == "":
			continue // kept until release_job (a persistent job of a backend that keeps no sandbox)
		case m.keeper.keeps(ctx, backend.Name(), sb):
			continue // a kept sandbox's machine: its timers end it
		case job != nil && job.Sandbox != "":
			// The machine of a kept sandbox that has ended: its
			// destroy was interrupted.
		case job == nil:
			unknown[sb.ID] = struct{}{}
			if _, again := suspect[sb.ID]; !again {
				continue
			}
		case job.SandboxID != "" && job.SandboxID != sb.ID:
			// A finished job whose sandbox is another one: this one is a
			// leftover of a failed provisioning attempt.
		}
		m.log.Info("destroying orphaned sandbox", "sandbox", sb.ID, "job", sb.JobID)
		if err := backend.Destroy(ctx, sb.ID); err != nil {
			m.log.Warn("destroy orphaned sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	m.mu.Lock()
	m.suspect = unknown
	m.mu.Unlock()
}

// jobOfSandbox finds the job a sandbox belongs to: the one that recorded
// it, else the one it was made for; nil if neither exists.
func (m *maintenance) jobOfSandbox(ctx context.Context, sb sandbox.Info) (*delegate.Job, error) {
	jobs, _, err := m.store.ListJobs(ctx, delegate.JobFilter{SandboxID: sb.ID, Limit: 1})
	if err != nil {
		return nil, err
	}
	if len(jobs) == 1 {
		return jobs[0], nil
	}
	if sb.JobID == "" {
		return nil, nil
	}
	job, err := m.store.GetJob(ctx, sb.JobID)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, nil
	}
	return job, err
}

// checkHeartbeats fails the running jobs this engine drives whose last sign
// of life is older than the threshold, and destroys their sandboxes. Time
// this server itself did not run (see pauses) does not count: a job that
// wrote its status lines, or ended, while the server was stopped is not
// failed for the silence the server saw; and after such a pause, the
// jobs' channels are read before anything is judged.
func (m *maintenance) checkHeartbeats(ctx context.Context) {
	m.judgeHeartbeats(ctx, time.Now(), m.jobs.lease.wall)
}

// judgeHeartbeats is checkHeartbeats at the checker's tick now (wall
// time), with wall the clock heartbeats are stamped on (the store's where
// servers share it): a test plays the clocks (and m.away's boot clock)
// instead of sleeping through them.
func (m *maintenance) judgeHeartbeats(ctx context.Context, now time.Time, wall func() time.Time) {
	if away := m.away.tick(now, m.heartbeatEvery()); away >= m.heartbeatEvery()/2 {
		if away > m.heartbeatEvery() {
			m.log.Info("the server was not running (stopped, paused or suspended): its jobs' silence then does not count",
				"away", away.Round(time.Millisecond))
		}
		return // the followers read what the channels hold first
	}
	for _, id := range m.runs.driven() {
		if h := m.runs.handle(id); h != nil && h.exited.Load() {
			continue // it ended (exit 0, maybe): its end is being stored
		}
		j, err := m.read.Get(ctx, id)
		if err != nil || j.Status != delegate.StatusRunning {
			continue
		}
		last := j.LastHeartbeat
		if last.IsZero() {
			last = j.StartedAt
		}
		// On the store's clock where servers share it: the heartbeat may
		// have been stamped by another server, whose clock is not ours.
		silent := wall().Sub(last) - m.away.since(last)
		if silent < m.cfg.HeartbeatThreshold {
			continue
		}
		reason := fmt.Sprintf("lost heartbeat: no sign of life for %s (HEARTBEAT_THRESHOLD_SECONDS=%d)",
			silent.Round(time.Second), int(m.cfg.HeartbeatThreshold.Seconds()))
		m.log.Warn("job lost its heartbeat", "job", id, "last", last)
		m.end.finish(id, delegate.StatusFailed, reason, nil)
		if h := m.runs.handle(id); h != nil {
			h.killNow() // the follower kills the process and destroys the sandbox
		}
	}
}

// watchFinishes notices jobs this engine drives that another process has
// finished (a cancel from the CLI, a completion received by another
// server): one cheap read of the store's finish counter per poll, and a
// read of the jobs only when another process has finished one.
func (m *maintenance) watchFinishes(lastStore, lastOwn int64) func(context.Context) {
	return func(ctx context.Context) {
		own := m.jobs.own.Load()
		n, err := m.store.Finishes(ctx)
		if err != nil {
			return
		}
		foreign := n - lastStore - (own - lastOwn)
		lastStore, lastOwn = n, own
		if foreign == 0 {
			return
		}
		m.jobs.foreign.Add(1) // callbacks re-read the status of the jobs they index
		check := make(map[string]bool)
		for _, id := range m.runs.driven() {
			if h := m.runs.handle(id); h != nil && h.end.Load() == nil {
				check[id] = true
			}
		}
		// The callback index also holds jobs that other processes drive:
		// forget those that have ended, so that it holds running jobs only.
		for _, id := range m.tokens.ids() {
			check[id] = true
		}
		for id := range check {
			if j, err := m.store.GetJob(ctx, id); err == nil && j.Status.Terminal() {
				m.jobs.ended(j)
			}
		}
		m.jobs.notify("") // waiters read again
	}
}
