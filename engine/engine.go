// Package engine runs a job's life on any sandbox backend, once: queue and
// concurrency limit, provision → inject files → exec → follow output →
// collect → destroy, with timeouts, cancellation, recovery after a restart
// and a cleanup loop for sandboxes nobody owns.
//
// An Engine is a coordinator of parts, each with its own state and lock
// (none holds its lock while it calls another):
//
//   - jobWriter (jobs.go): every change of a job goes through it; it wakes
//     waiters and watchers, and tells the parts when a job ends;
//   - progressWriter (progress.go): progress coalesced in memory, stored in
//     batches by one flusher;
//   - Reader (reader.go): the read side, over the store alone;
//   - callbacks (callback.go): the token index and the reports of jobs;
//   - questions (questions.go): questions on jobs, their answers, and the
//     answers' way into the sandboxes;
//   - scheduler (scheduler.go): run slots, the queue, admission;
//   - runner (runner.go): one job's run as ordered provisioning steps,
//     then following the command and settling its end;
//   - maintenance (maintenance.go): recovery, the sweep, the heartbeat
//     watchdog, finishes seen in the store.
//
// Every goroutine runs in one group (group.go), which Close stops and
// waits for; the flusher stops last, once nothing reports any more.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// Config tunes an Engine. Zero values get the defaults of package delegate
// (delegate.DefaultMaxConcurrent...) or the one documented on the field.
type Config struct {
	// Defaults fill what a manifest leaves out; zero fields get
	// delegate.ServerDefaults.
	Defaults delegate.Defaults
	// Maxima cap what a manifest may ask for (zero: no cap of the
	// operator's).
	Maxima Maxima
	// MaxConcurrent jobs run at once; more wait as pending.
	MaxConcurrent int
	// OutputLimit bytes of a job's output are kept.
	OutputLimit int64
	// CleanupInterval between sweeps for orphaned sandboxes.
	CleanupInterval time.Duration
	// ProvisionTimeout bounds creating a sandbox and injecting files.
	ProvisionTimeout time.Duration
	// PollInterval is how often a running job's output is collected and its
	// stored status re-read (another process may have cancelled it). Default 200 ms.
	PollInterval time.Duration
	// Secret resolves a secret name to its value on the server.
	Secret func(name string) (string, bool)
	// CallbackURL is the base URL sandboxes use to reach the callback
	// server (CALLBACK_PUBLIC_URL); empty when there is none.
	CallbackURL string
	// HeartbeatThreshold: a running job with no sign of life for this long
	// is failed ("lost heartbeat").
	HeartbeatThreshold time.Duration
	// ArtifactDir holds artifacts by sha256. ArtifactMaxFile and
	// ArtifactMaxTotal cap one file and one job.
	ArtifactDir      string
	ArtifactMaxFile  int64
	ArtifactMaxTotal int64
	// OpenBackend, for an engine made without a backend, opens one when
	// it needs it: to stop the sandbox of a job it cancels that no live
	// engine drives. Nil: such a job is left to the next server.
	OpenBackend func(ctx context.Context) (sandbox.Backend, error)
	// AdmissionRetry: a job waiting for capacity (see sandbox.Admitter)
	// asks again this often, besides whenever this engine frees room.
	// Default 5 s.
	AdmissionRetry time.Duration
	// OwnerAlive says whether the engine that owns a job is still running;
	// default: same host and its process is alive. Tests inject their own.
	OwnerAlive func(owner string) bool
	Logger     *slog.Logger
	// Observer, if set, hears sandbox starts and job ends (metrics).
	Observer Observer

	// Kept sandboxes (keeper.go): at most MaxSandboxes at once
	// (default delegate.DefaultMaxSandboxes); idle SandboxIdle they are
	// paused, paused SandboxPause they go, SandboxLifetime ends them
	// (defaults delegate.DefaultSandbox*); their timers are checked every
	// SandboxTick (default 5 s).
	MaxSandboxes    int
	SandboxIdle     time.Duration
	SandboxPause    time.Duration
	SandboxLifetime time.Duration
	SandboxTick     time.Duration

	// Workspaces (workspace.go): a dir source must lie under one of
	// WorkspaceRoots (clean absolute paths; none: dir sources are
	// refused); a source holds at most WorkspaceMaxBytes and
	// WorkspaceMaxFiles (defaults workspace.DefaultMaxBytes and
	// DefaultMaxFiles), never more than half the job's memory nor its
	// disk. Git sources are cloned under CloneDir (default: under the
	// temporary directory), reaching public addresses and GitAllow.
	WorkspaceRoots    []string
	WorkspaceMaxBytes int64
	WorkspaceMaxFiles int
	CloneDir          string
	GitAllow          []netip.Prefix
	// Egress, if set, is the server's egress proxy (NewEgress): a job
	// whose network reaches out, on a backend with
	// sandbox.Capabilities.EgressProxy, goes through it alone, with a
	// network of its own (token, policy, log) in the store.
	Egress *Egress
	// DataDir is where the store and the sandboxes write (DELEGATE_DATA_DIR):
	// below MinFree bytes free there (DELEGATE_MIN_FREE; 0: the smaller
	// of 1 GiB and 5% of its file system; < 0: no floor), submissions
	// and new sandboxes are refused. "" : not watched.
	DataDir string
	MinFree int64
	// Retention: finished jobs, ended kept sandboxes and what they keep
	// go this long after they ended (DELEGATE_RETENTION; 0:
	// delegate.DefaultRetention; < 0: kept forever), pruned every
	// PruneInterval (default 1 h).
	Retention     time.Duration
	PruneInterval time.Duration
	// SecretBindings are the operator's NAME_INJECT bindings, by secret:
	// such a secret never enters a job's environment (a placeholder
	// does); the proxy adds it to the job's requests for its host.
	SecretBindings map[string]egress.Binding
}

// Engine drives jobs from a store through a backend. It implements
// delegate.JobService; its read side is its Reader's.
type Engine struct {
	*Reader
	*keeper // delegate.SandboxService

	cfg   Config
	log   *slog.Logger
	owner string
	life  *group

	backend   *backendRef
	jobs      *jobWriter
	progress  *progressWriter
	callbacks *callbacks
	questions *questions
	sched     *scheduler
	runner    *runner
	maint     *maintenance
	space     space
}

// errNoBackend: an engine made without a backend (to read jobs) was asked
// to run one.
var errNoBackend = errors.New("this process has no sandbox backend and runs no jobs: submit through delegate serve or delegate run")

// New makes an engine; Start begins work.
func New(store delegate.Store, backend sandbox.Backend, cfg Config) *Engine {
	cfg.Defaults.Fill(delegate.ServerDefaults())
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = delegate.DefaultMaxConcurrent
	}
	if cfg.OutputLimit <= 0 {
		cfg.OutputLimit = delegate.DefaultOutputLimit
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = delegate.DefaultCleanupInterval
	}
	if cfg.ProvisionTimeout <= 0 {
		cfg.ProvisionTimeout = delegate.DefaultProvisionTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.HeartbeatThreshold <= 0 {
		cfg.HeartbeatThreshold = delegate.DefaultHeartbeatThreshold
	}
	if cfg.AdmissionRetry <= 0 {
		cfg.AdmissionRetry = 5 * time.Second
	}
	if cfg.ArtifactMaxFile <= 0 {
		cfg.ArtifactMaxFile = delegate.DefaultArtifactMaxFile
	}
	if cfg.ArtifactMaxTotal <= 0 {
		cfg.ArtifactMaxTotal = delegate.DefaultArtifactMaxTotal
	}
	if cfg.ArtifactDir == "" {
		cfg.ArtifactDir = filepath.Join(os.TempDir(), "delegate-artifacts")
	}
	if cfg.Secret == nil {
		cfg.Secret = EnvSecret
	}
	if cfg.OwnerAlive == nil {
		cfg.OwnerAlive = ownerAlive
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = delegate.DefaultMaxSandboxes
	}
	if cfg.SandboxIdle <= 0 {
		cfg.SandboxIdle = delegate.DefaultSandboxIdle
	}
	if cfg.SandboxPause <= 0 {
		cfg.SandboxPause = delegate.DefaultSandboxPause
	}
	if cfg.SandboxLifetime <= 0 {
		cfg.SandboxLifetime = delegate.DefaultSandboxLifetime
	}
	if cfg.SandboxTick <= 0 {
		cfg.SandboxTick = 5 * time.Second
	}
	if cfg.WorkspaceMaxBytes <= 0 {
		cfg.WorkspaceMaxBytes = workspace.DefaultMaxBytes
	}
	if cfg.WorkspaceMaxFiles <= 0 {
		cfg.WorkspaceMaxFiles = workspace.DefaultMaxFiles
	}
	if cfg.Retention == 0 {
		cfg.Retention = delegate.DefaultRetention
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = time.Hour
	}
	if cfg.CloneDir == "" {
		cfg.CloneDir = filepath.Join(os.TempDir(), "delegate-clones")
	}
	log := cfg.Logger
	owner := newOwner()
	life := newGroup()
	ref := &backendRef{b: backend, open: cfg.OpenBackend}
	jobs := newJobWriter(store)
	progress := newProgressWriter(store, jobs.notify, log)
	read := &Reader{store: store, artifactDir: cfg.ArtifactDir, poll: 4 * cfg.PollInterval, unstored: progress.progressBuffer, ends: jobs.endOf}
	cb := &callbacks{store: store, jobs: jobs, progress: progress, secret: cfg.Secret, tokens: newTokenIndex()}
	keep := newKeeper(cfg, log, owner, store, ref, jobs)
	qs := newQuestions(store, jobs, progress, log, 4*cfg.PollInterval)
	sched := &scheduler{life: life, store: store, backend: ref, jobs: jobs, log: log, retry: cfg.AdmissionRetry,
		slots: cfg.MaxConcurrent, room: make(chan struct{})}
	run := &runner{cfg: cfg, log: log, owner: owner, life: life, store: store, ref: ref, jobs: jobs,
		progress: progress, callbacks: cb, keeper: keep, questions: qs, roomFreed: sched.roomFreed, runs: make(map[string]*run)}
	sched.runner = run
	maint := &maintenance{cfg: cfg, log: log, owner: owner, store: store, ref: ref, jobs: jobs, runner: run,
		sched: sched, read: read, keeper: keep, suspect: make(map[string]struct{})}
	e := &Engine{}
	// A job's end: its follower winds it up, its token stops working,
	// and so does its network (on a goroutine of the engine's life, which
	// Close waits for: a process that closes its store after the engine,
	// such as the CLI's exec, must not have it written to after).
	jobs.ended = func(j *delegate.Job) {
		cb.tokens.forget(j.ID)
		run.ended(j.ID, j.Status)
		if cfg.Egress != nil && ownsNetwork(j) {
			id, kept := j.ID, j.Sandbox
			life.Go(func() { e.endNetwork(id, kept) })
		}
	}
	*e = Engine{Reader: read, keeper: keep, cfg: cfg, log: log, owner: owner, life: life, backend: ref, jobs: jobs,
		progress: progress, callbacks: cb, questions: qs, sched: sched, runner: run, maint: maint,
		space: space{dir: cfg.DataDir, floor: cfg.MinFree}}
	if cfg.Egress != nil {
		// A request an allowlist with ask: true denies is a question on
		// the job.
		cfg.Egress.SetAsk(e.askNetwork)
	}
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
	if err := e.maint.start(ctx, e.life); err != nil {
		return err
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
func (e *Engine) Close() error {
	e.life.stop()
	// Nothing reports any more: store what was reported last.
	e.progress.close()
	// A backend this engine opened for itself (to stop an orphan) is its
	// to close; one it was given belongs to its caller.
	return e.backend.close()
}

// Submit validates a manifest, stores the job as pending and queues it.
// It returns at once.
func (e *Engine) Submit(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	// The manifest as submitted, before defaults: a retry of the same
	// request digests the same even if the server's defaults changed.
	var digest string
	if k := opts.IdempotencyKey; k != "" {
		if len(k) > 200 || strings.ContainsRune(k, 0) {
			return nil, &delegate.FieldError{Field: "idempotency_key", Rule: "must be at most 200 bytes without NUL"}
		}
		digest = m.Digest()
		if job, err := e.store.JobByIdempotencyKey(ctx, k); err == nil {
			return sameRequest(job, k, digest)
		}
	}
	backend := e.backend.get()
	if backend == nil {
		return nil, errNoBackend
	}
	chosenTemplate := m.VMTemplate != ""
	askedNetwork := m.Network
	var kept *delegate.Sandbox
	if m.Sandbox != "" {
		// A command in a kept sandbox: it runs within the sandbox's
		// limits, template and network, and leaves the sandbox be.
		sb, err := e.keeper.commandSandbox(ctx, m.Sandbox)
		if err != nil {
			var fe *delegate.FieldError
			if errors.As(err, &fe) {
				fe.Field = "manifest.sandbox"
			}
			return nil, err
		}
		if sb.State.Terminal() {
			return nil, &delegate.FieldError{Field: "manifest.sandbox", Rule: fmt.Sprintf("sandbox %s is %s (%s): open a new one", sb.ID, sb.State, sb.Reason)}
		}
		if sb.Backend != backend.Name() {
			return nil, &delegate.FieldError{Field: "manifest.sandbox", Rule: fmt.Sprintf("sandbox %s is on the %s backend; this server runs %s", sb.ID, sb.Backend, backend.Name())}
		}
		kept = sb
	}
	m.ApplyDefaults(e.cfg.Defaults)
	if kept != nil {
		res := kept.Resources
		m.Resources, m.VMTemplate, m.Network, m.Lifecycle = &res, kept.Template, kept.Network, delegate.LifecyclePersistent
	} else if err := m.Validate(); err != nil { // the defaults themselves may be bad
		return nil, fmt.Errorf("server defaults: %w", err)
	}
	// After the defaults: a claude job asks for egress by default, and
	// must be refused now, not accepted and failed when it starts. (A
	// kept sandbox has the network it was made with.)
	if kept == nil {
		if err := checkEgress(backend, m, askedNetwork); err != nil {
			return nil, err
		}
	}
	if err := e.cfg.Maxima.check(&m); err != nil {
		return nil, err
	}
	if err := checkNetwork(backend, m.Network, m.Secrets, e.cfg.SecretBindings, "manifest.network"); err != nil {
		return nil, err
	}
	if kept == nil {
		if err := checkTemplate(ctx, backend, m.VMTemplate, chosenTemplate); err != nil {
			return nil, err
		}
	}
	if err := checkResources(ctx, backend, m, e.log); err != nil {
		return nil, err
	}
	if err := e.checkWorkspace(ctx, &m, backend.Capabilities(), backend.Name()); err != nil {
		return nil, err
	}
	for i, name := range m.Secrets {
		if _, ok := e.cfg.Secret(name); !ok {
			return nil, &delegate.FieldError{
				Field: fmt.Sprintf("manifest.secrets[%d]", i),
				Rule:  fmt.Sprintf("no secret %q on the server (set DELEGATE_SECRET_%s where delegate runs, or remove it)", name, name),
			}
		}
	}
	if m.AgentType == delegate.AgentClaude && m.Agent == nil {
		m.Agent = &delegate.AgentConfig{}
	}
	// Last: what is wrong with the manifest is said first.
	if err := e.space.check(); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	job := &delegate.Job{
		ID:        newJobID(),
		Manifest:  m,
		Status:    delegate.StatusPending,
		Progress:  "queued",
		CreatedAt: now,
		UpdatedAt: now,
		Backend:   backend.Name(),
		Owner:     e.owner,

		IdempotencyKey:    opts.IdempotencyKey,
		IdempotencyDigest: digest,
	}
	if kept != nil {
		job.Sandbox = kept.ID
	}
	// A job that can start now (a run slot free, none queued, no room to
	// ask a backend for) is stored claimed, as its run would claim it
	// first: one write less on its way, and no hop through the queue. Its
	// run is registered before it can be seen, so that a cancel stops it.
	var direct *claimed
	if _, admits := backend.(sandbox.Admitter); (kept != nil || !admits) && e.sched.takeSlot() {
		h, rctx := e.runner.register(job.ID)
		direct = &claimed{h: h, ctx: rctx, token: e.runner.claim(job)}
	}
	if err := e.store.CreateJob(ctx, job); err != nil {
		if direct != nil {
			e.runner.unregister(job.ID)
			e.sched.releaseSlot()
		}
		if opts.IdempotencyKey != "" {
			// A concurrent submission with the same key won the race.
			if first, ferr := e.store.JobByIdempotencyKey(ctx, opts.IdempotencyKey); ferr == nil {
				return sameRequest(first, opts.IdempotencyKey, digest)
			}
		}
		return nil, fmt.Errorf("submit: %w", e.space.explain(err))
	}
	e.log.Debug("job submitted", "job", job.ID, "agent", m.AgentType)
	if direct == nil {
		e.sched.enqueue(job.ID)
		return job, nil
	}
	// The run gets its own copy, as stored (files apart).
	direct.job = job.Clone()
	direct.files, direct.job.Manifest.Files = direct.job.Manifest.Files, nil
	e.sched.startClaimed(*direct)
	return job, nil
}

// OpenSandbox opens a kept sandbox (keeper.OpenSandbox), unless the data
// dir is below its floor of free space; a sandbox that could not be made
// for lack of room says so.
func (e *Engine) OpenSandbox(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
	if err := e.space.check(); err != nil {
		return nil, err
	}
	sb, err := e.keeper.OpenSandbox(ctx, spec)
	return sb, e.space.explain(err)
}

// checkEgress refuses a job whose network (asked, or its agent's default)
// the backend cannot give, saying what the host lacks and how to add it.
func checkEgress(backend sandbox.Backend, m delegate.Manifest, asked delegate.Network) error {
	caps := backend.Capabilities()
	if m.Network.Mode != delegate.NetworkEgress || caps.NetworkEgress {
		return nil
	}
	why := caps.NetworkEgressMissing
	if why == "" {
		why = "this backend cannot give a job network access"
	}
	if asked.IsZero() {
		return &delegate.FieldError{Field: "manifest.network", Rule: fmt.Sprintf(
			"a %s job needs network egress by default (its CLI must reach the model's API), which the %s backend cannot give here: %s; "+
				"or set network: none if the job needs no network", m.AgentType, backend.Name(), why)}
	}
	return &delegate.FieldError{Field: "manifest.network", Rule: fmt.Sprintf(
		"egress is not available on the %s backend here: %s; or set network: none", backend.Name(), why)}
}

// sameRequest answers a submission whose idempotency key names job: the
// job itself when the manifest is the one the key was first sent with (or
// when the job predates digests), else an error that says so.
func sameRequest(job *delegate.Job, key, digest string) (*delegate.Job, error) {
	if job.IdempotencyDigest != "" && job.IdempotencyDigest != digest {
		return nil, &delegate.IdempotencyConflictError{Key: key, JobID: job.ID}
	}
	return job, nil
}

// Cancel ends a job that has not finished. It returns the job and whether
// this call cancelled it (false when it had already finished). The engine
// driving the job kills it; a job that no live engine drives, this one
// takes over and stops before Cancel returns (cancelOrphan).
func (e *Engine) Cancel(ctx context.Context, id string) (*delegate.Job, bool, error) {
	if job, cancelled, done, err := e.runner.cancelOrphan(ctx, id); done {
		return job, cancelled, err
	}
	e.progress.flushJob(ctx, id)
	job, err := e.jobs.update(ctx, id, func(j *delegate.Job) error {
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
	e.runner.stop(id)
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

func newJobID() string {
	var b [10]byte
	rand.Read(b[:])
	return "job-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Release destroys the sandbox a persistent job kept. It returns the job
// and whether this call destroyed something (false: already released).
func (e *Engine) Release(ctx context.Context, id string) (*delegate.Job, bool, error) {
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
			j, err = e.jobs.update(ctx, id, func(j *delegate.Job) error {
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
	e.sched.roomFreed()
	j, err = e.jobs.update(ctx, id, func(j *delegate.Job) error {
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
