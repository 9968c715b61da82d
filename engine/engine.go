// Package engine runs a job's life on any sandbox backend, once: queue and
// concurrency limit, provision → inject files → exec → follow output →
// collect → destroy, with timeouts, cancellation, recovery after a restart
// and a cleanup loop for sandboxes nobody owns.
//
// An Engine is a coordinator of parts, each with its own state and lock
// (none holds its lock while it calls another). A part that calls another
// does so through a small interface it declares, given at construction
// (New makes them callee first: no part is set after it is made):
//
//   - jobWriter (jobs.go): every change of a job goes through it; it wakes
//     waiters and watchers, and tells the parts when a job ends;
//   - progressWriter (progress.go): progress coalesced in memory, stored in
//     batches by one flusher;
//   - Reader (reader*.go): the read side, over the store alone;
//   - callbacks (callback.go): the token index and the reports of jobs;
//   - questions (questions.go): questions on jobs, their answers, and the
//     answers' way into the sandboxes;
//   - scheduler (scheduler.go): run slots, the queue, admission; it hands
//     a job to the starter, and waits for room on a roomSignal (room.go);
//   - a job's run, in five parts: the starter (start.go: claim, the
//     ordered provisioning steps), the commandBuilder (command.go: argv,
//     inputs, environment), the workspaces (workspace.go: import, changes,
//     clone), the follower (follow.go, tracker.go: output, status lines,
//     timeout, kill) and the finisher (finish.go, artifacts.go: the end
//     settled, the sandbox destroyed or rolled back); runs (runs.go) is
//     the table of the jobs this engine drives;
//   - orphans (cancel.go): a cancelled job that no live engine drives;
//   - kept sandboxes: the keeper (keeper.go: open, attach, release, end),
//     their files (sandbox_files.go), their timers (sandbox_timers.go),
//     and what this engine knows of their machines (machines.go);
//   - maintenance (maintenance.go): recovery, the sweep, the heartbeat
//     watchdog, finishes seen in the store.
//
// Every goroutine runs in one group (group.go), which Close stops and
// waits for; the flusher stops last, once nothing reports any more.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// Engine drives jobs from a store through a backend. It implements
// delegate.JobService; its read side is its Reader's, its kept sandboxes
// its keeper's and their files' (delegate.SandboxService).
type Engine struct {
	*Reader
	*keeper       // delegate.SandboxService
	*sandboxFiles // delegate.SandboxService: the files
	*forks        // delegate.CheckpointService
	*forwarder    // delegate.ForwardService: commands for kept sandboxes, between servers

	cfg   Config
	log   *slog.Logger
	owner string
	life  *group

	backend   *backendRef
	room      *roomSignal
	jobs      *jobWriter
	progress  *progressWriter
	callbacks *callbacks
	questions *questions
	sched     *scheduler
	runs      *runs
	starter   *starter
	orphans   *orphans
	maint     *maintenance
	space     space
	audit     auditor // the audit trail (audit.go)
	leases    *leaser // nil unless Config.Leases
}

var (
	_ delegate.SandboxService    = (*Engine)(nil)
	_ delegate.CheckpointService = (*Engine)(nil)
	_ delegate.ForwardService    = (*Engine)(nil)
)

// errNoBackend: an engine made without a backend (to read jobs) was asked
// to run one.
var errNoBackend = errors.New("this process has no sandbox backend and runs no jobs: submit through delegate serve or delegate run")

// New makes an engine; Start begins work.
func New(store delegate.Store, backend sandbox.Backend, cfg Config) *Engine {
	cfg = cfg.withDefaults()
	log := cfg.Logger
	owner := newOwner()
	life := newGroup()
	ref := &backendRef{b: backend, open: cfg.OpenBackend}
	room := newRoomSignal()
	runs := newRuns(life)
	tokens := newTokenIndex()
	var lease *leaser
	if cfg.Leases != nil {
		name := ""
		if backend != nil {
			name = backend.Name()
		}
		lease = newLeaser(*cfg.Leases, store, log, owner, name, cfg.OwnerAlive)
		lease.giveUp = runs.abandon
		cfg.OwnerAlive = lease.alive // by lease, on the store's clock
	}
	// A job's end: its follower winds it up, its token stops working,
	// and so does its network (on a goroutine of the engine's life, which
	// Close waits for: a process that closes its store after the engine,
	// such as the CLI's exec, must not have it written to after).
	jobs := newJobWriter(store, func(j *delegate.Job) {
		tokens.forget(j.ID)
		runs.ended(j.ID, j.Status)
		lease.release(j)
		if cfg.Egress != nil && ownsNetwork(j) {
			id, kept := j.ID, j.Sandbox
			life.Go(func() { endNetwork(store, cfg.Egress, id, kept) })
		}
	})
	jobs.lease = lease
	progress := newProgressWriter(store, jobs.notify, log)
	read := &Reader{audit: auditor{store: store, log: log}, ended: endedUnseen(cfg, owner), store: store, artifactDir: cfg.ArtifactDir, poll: readPoll(cfg, store), unstored: progress.progressBuffer, ends: jobs.endOf}
	cb := &callbacks{store: store, jobs: jobs, progress: progress, secret: cfg.Secret, tokens: tokens}
	ms := newMachines()
	keep := newKeeper(cfg, log, owner, store, ref, jobs, ms)
	timers := &sandboxTimers{cfg: cfg, log: log, owner: owner, sbs: store, ref: ref, jobs: jobs, machines: ms, keeper: keep}
	qs := newQuestions(store, jobs, progress, log, 4*cfg.PollInterval)
	// A job's run, in parts that call each other through the small
	// interfaces each owns, made callee first: none is set after.
	ws := &workspaces{cfg: cfg, log: log, store: store, progress: progress}
	fin := &finisher{cfg: cfg, log: log, life: life, store: store, ref: ref, jobs: jobs, progress: progress,
		tokens: tokens, ws: ws, roomFreed: room.freed, space: space{dir: cfg.DataDir, floor: cfg.MinFree}}
	fol := &follower{cfg: cfg, log: log, life: life, store: store, ref: ref, jobs: jobs, progress: progress,
		questions: qs, runs: runs, end: fin}
	start := &starter{cfg: cfg, log: log, owner: owner, life: life, store: store, ref: ref, jobs: jobs, progress: progress,
		runs: runs, tokens: cb, kept: keep, ws: ws, cmd: &commandBuilder{cfg: cfg, ref: ref}, follow: fol, end: fin}
	orph := &orphans{cfg: cfg, log: log, owner: owner, life: life, store: store, ref: ref, jobs: jobs,
		runs: runs, follow: fol, end: fin}
	sched := &scheduler{life: life, store: store, backend: ref, jobs: jobs, runner: start, failer: fin, room: room,
		log: log, retry: cfg.AdmissionRetry, slots: cfg.MaxConcurrent}
	maint := &maintenance{cfg: cfg, log: log, owner: owner, store: store, ref: ref, jobs: jobs, runs: runs,
		sched: sched, end: fin, follower: fol, tokens: tokens, read: read, keeper: keep, timers: timers,
		suspect: make(map[string]struct{})}
	fk := &forks{cfg: cfg, log: log, data: store, keeper: keep, jobs: jobs, runs: runs,
		opener: &opener{keeper: keep, space: space{dir: cfg.DataDir, floor: cfg.MinFree}, store: store, quotas: cfg.Quotas, audit: auditor{store: store, log: log}}}
	e := &Engine{Reader: read, keeper: keep, sandboxFiles: &sandboxFiles{keeper: keep}, forks: fk, cfg: cfg, log: log, owner: owner,
		life: life, backend: ref, room: room, jobs: jobs, progress: progress, callbacks: cb, questions: qs, sched: sched,
		runs: runs, starter: start, orphans: orph, maint: maint, space: space{dir: cfg.DataDir, floor: cfg.MinFree},
		audit: auditor{store: store, log: log}, leases: lease, forwarder: newForwarder(lease, store, log)}
	e.forwarder.submitAs = e.Submit
	return e
}

// EnvSecret resolves secret NAME from the server's DELEGATE_SECRET_NAME.
func EnvSecret(name string) (string, bool) { return os.LookupEnv("DELEGATE_SECRET_" + name) }

// Owner is this engine's identity in the store.
func (e *Engine) Owner() string { return e.owner }

// Start recovers jobs left by engines that have died and starts the
// maintenance timers. It returns once recovery has been decided for every
// job.
func (e *Engine) Start(ctx context.Context) error {
	if e.leases != nil {
		// Registered first: its lease is checked when it adopts.
		if err := e.leases.register(ctx); err != nil {
			return fmt.Errorf("register this server in the store: %w", err)
		}
	}
	if err := e.forwarder.start(ctx); err != nil {
		return err
	}
	if err := e.maint.start(ctx, e.life); err != nil {
		return err
	}
	if e.leases != nil {
		// Apart: adopting (re-attaching to a dead server's jobs) may take
		// a while, and must not delay a renewal.
		e.life.every(e.leases.renewEvery(), e.leases.renew)
		e.life.every(e.leases.renewEvery(), e.maint.adoptDead)
	}
	if e.cfg.Egress != nil {
		// A request an allowlist with ask: true denies is a question on
		// the job: the proxy's questions are taken from it here.
		e.life.Go(func() { e.cfg.Egress.serveAsks(e.life.ctx, e.life.Go, e.askNetwork) })
	}
	// What is past its retention goes in the background: a minute after
	// the start (not in the way of recovery), then every PruneInterval.
	e.life.Go(func() {
		select {
		case <-e.life.ctx.Done():
			return
		case <-time.After(min(time.Minute, e.cfg.PruneInterval)):
		}
		e.prune(e.life.ctx)
		e.life.every(e.cfg.PruneInterval, e.prune)
	})
	return nil
}

// Close stops the engine without touching running jobs: their sandboxes go
// on, and the next engine to start re-attaches to them. Queued jobs stay
// pending and are picked up the same way. The parts stop in the reverse
// order of their start: the goroutines first, the progress flusher last.
// It reports what failed: the last progress not stored, a backend it
// opened that did not close.
func (e *Engine) Close() error {
	e.life.stop()
	// Nothing reports any more: store what was reported last.
	lost := e.progress.close()
	if e.leases != nil {
		// Its lease ended: the other servers adopt its jobs now, not
		// when the lease would have run out.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.leases.stop(ctx)
		cancel()
	}
	// A backend this engine opened for itself (to stop an orphan) is its
	// to close; one it was given belongs to its caller.
	return errors.Join(lost, e.backend.close())
}

// Cancel ends a job that has not finished. It returns the job and whether
// this call cancelled it (false when it had already finished). The engine
// driving the job kills it; a job that no live engine drives, this one
// takes over and stops before Cancel returns (cancelOrphan).
func (e *Engine) Cancel(ctx context.Context, id string) (*delegate.Job, bool, error) {
	job, cancelled, err := e.cancel(ctx, id)
	if cancelled && err == nil {
		e.audit.Record(ctx, delegate.AuditCancelled, id, "")
	}
	return job, cancelled, err
}

func (e *Engine) cancel(ctx context.Context, id string) (*delegate.Job, bool, error) {
	if job, cancelled, done, err := e.orphans.cancelOrphan(ctx, id); done {
		return job, cancelled, err
	}
	e.progress.flushJob(ctx, id)
	job, err := e.jobs.update(notOwner(ctx), id, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return delegate.ErrTerminal
		}
		markCancelled(j)
		return nil
	})
	if errors.Is(err, delegate.ErrTerminal) {
		job, err = e.store.GetJob(ctx, id)
		return job, false, err
	}
	if err != nil {
		return nil, false, err
	}
	e.log.Info("job cancelled", "job", id)
	e.runs.stop(id)
	return job, true, nil
}

// Callback authenticates a report a job sent with its token and applies
// it (see callbacks.Callback).
func (e *Engine) Callback(ctx context.Context, id, token string, rep delegate.Report) (*delegate.Job, error) {
	return e.callbacks.Callback(ctx, id, token, rep)
}

// Authenticate checks a job's callback token without a report (see
// callbacks.Authenticate).
func (e *Engine) Authenticate(ctx context.Context, id, token string) error {
	return e.callbacks.Authenticate(ctx, id, token)
}

// Watch delivers the id of every job this engine changes until ctx ends
// (or the engine closes).
func (e *Engine) Watch(ctx context.Context) <-chan string { return e.jobs.watch(ctx, e.life) }

// Release destroys the sandbox a persistent job kept. It returns the job
// and whether this call destroyed something (false: already released).
func (e *Engine) Release(ctx context.Context, id string) (*delegate.Job, bool, error) {
	j, released, err := e.release(ctx, id)
	if released && err == nil {
		e.audit.Record(ctx, delegate.AuditReleased, id, "the sandbox of the job")
	}
	return j, released, err
}

func (e *Engine) release(ctx context.Context, id string) (*delegate.Job, bool, error) {
	j, err := e.store.GetJob(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if j.Manifest.Lifecycle != delegate.LifecyclePersistent {
		return j, false, fmt.Errorf("job %s is ephemeral: its sandbox is destroyed when it ends: %w", id, delegate.ErrInvalid)
	}
	if !j.Status.Terminal() {
		return j, false, fmt.Errorf("job %s is %s: %w; cancel_job it first, or wait for it to end", id, j.Status, delegate.ErrNotFinished)
	}
	if j.Sandbox != "" {
		// The kept sandbox it made: released as a sandbox is.
		sb, released, err := e.keeper.ReleaseSandbox(ctx, j.Sandbox)
		if err != nil {
			return j, false, err
		}
		if released {
			j, err = e.jobs.update(notOwner(ctx), id, func(j *delegate.Job) error {
				j.Progress = "sandbox released"
				return nil
			})
		}
		_ = sb
		return j, released, err
	}
	if j.SandboxID == "" {
		return j, false, nil
	}
	backend, err := e.backend.opened(ctx)
	if err != nil {
		return j, false, fmt.Errorf("release the sandbox of job %s: %w", id, err)
	}
	if err := backend.Destroy(ctx, j.SandboxID); err != nil {
		return j, false, fmt.Errorf("release the sandbox of job %s: %w", id, err)
	}
	e.room.freed()
	j, err = e.jobs.update(notOwner(ctx), id, func(j *delegate.Job) error {
		j.SandboxID, j.ExecID = "", ""
		j.Progress = "sandbox released"
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	e.log.Info("released sandbox", "job", id)
	return j, true, nil
}

var _ delegate.QuestionService = (*Engine)(nil)

// Ask puts a question on a running job (see delegate.QuestionService).
func (e *Engine) Ask(ctx context.Context, jobID string, q delegate.Question) (*delegate.Question, error) {
	stored, _, err := e.questions.ask(ctx, jobID, q)
	return stored, err
}

// Questions returns a job's questions with their state.
func (e *Engine) Questions(ctx context.Context, jobID string) ([]delegate.Question, error) {
	_, qs, err := e.questions.read(ctx, jobID)
	return qs, err
}

// AwaitAnswer blocks until a question is no longer open, or ctx is done.
func (e *Engine) AwaitAnswer(ctx context.Context, jobID, id string) (*delegate.Question, error) {
	return e.questions.await(ctx, jobID, id)
}

// Answer answers an open question.
func (e *Engine) Answer(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
	q, err := e.questions.answer(ctx, jobID, id, a)
	if err == nil {
		e.audit.Record(ctx, delegate.AuditAnswered, jobID, fmt.Sprintf("question %s: %s", id, q.Answer.Action))
	}
	return q, err
}

// endedUnseen is the Reader's look at how a running job's command ended,
// for a job whose owner is not alive (nil without Config.PeekEnd).
func endedUnseen(cfg Config, owner string) func(j *delegate.Job) (sandbox.Exit, bool) {
	if cfg.PeekEnd == nil {
		return nil
	}
	return func(j *delegate.Job) (sandbox.Exit, bool) {
		if j.Owner == owner || j.SandboxID == "" || j.ExecID == "" || j.Owner != "" && cfg.OwnerAlive(j.Owner) {
			return sandbox.Exit{}, false
		}
		return cfg.PeekEnd(j.SandboxID, j.ExecID)
	}
}
