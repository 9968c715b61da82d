// Package engine runs a job's life on any sandbox backend, once: queue and
// concurrency limit, provision → inject files → exec → follow output →
// collect → destroy, with timeouts, cancellation, recovery after a restart
// and a cleanup loop for sandboxes nobody owns.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// Config tunes an Engine. Zero values get the defaults of package delegate
// (delegate.DefaultMaxConcurrent...) or the one documented on the field.
type Config struct {
	// Defaults fill what a manifest leaves out; zero fields get
	// delegate.ServerDefaults.
	Defaults delegate.Defaults
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
}

// Engine drives jobs from a store through a backend.
type Engine struct {
	store   delegate.JobStore
	backend sandbox.Backend
	cfg     Config
	log     *slog.Logger
	owner   string
	slots   int      // free run slots (Config.MaxConcurrent at first); under mu
	queue   []string // jobs waiting for a slot, first in first out; under mu

	ctx    context.Context // the engine's life; cancelled by Close/Detach
	stop   context.CancelFunc
	wg     sync.WaitGroup
	closed chan struct{}

	mu      sync.Mutex
	runs    map[string]*run     // jobs this engine is driving
	changed chan struct{}       // closed and replaced on every job change
	suspect map[string]struct{} // sandboxes found orphaned by the last sweep
	watches map[chan string]struct{}
	room    chan struct{} // closed and replaced when this engine frees room

	progress  *progressBuffer // reports not stored yet
	flushMu   sync.Mutex      // one flush at a time
	flushStop chan struct{}   // closed by Close once the rest has stopped
	flushDone chan struct{}   // closed when the last progress is stored
	closeOnce sync.Once
	tokens    *tokenIndex // callback tokens of running jobs
	// own counts the jobs this engine has finished; foreign moves when the
	// store's finish counter shows that another process finished one
	// (see watchFinishes).
	own, foreign atomic.Int64
}

// run is the engine's handle on one job it drives.
type run struct {
	cancel context.CancelFunc // aborts provisioning
	kill   chan struct{}      // closed to kill the running process
	once   sync.Once
	// end is the terminal status the job reached while it still runs (a
	// completion callback, a cancel, here or in another process).
	end atomic.Pointer[delegate.Status]
}

func (r *run) killNow() { r.once.Do(func() { close(r.kill) }) }

// New makes an engine; Start begins work.
func New(store delegate.JobStore, backend sandbox.Backend, cfg Config) *Engine {
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
	ctx, stop := context.WithCancel(context.Background())
	e := &Engine{
		store: store, backend: backend, cfg: cfg, log: cfg.Logger,
		owner:   newOwner(),
		slots:   cfg.MaxConcurrent,
		ctx:     ctx,
		stop:    stop,
		closed:  make(chan struct{}),
		runs:    make(map[string]*run),
		changed: make(chan struct{}),
		suspect: make(map[string]struct{}),
		watches: make(map[chan string]struct{}),
		room:    make(chan struct{}),

		progress:  newProgressBuffer(),
		flushStop: make(chan struct{}),
		flushDone: make(chan struct{}),
		tokens:    newTokenIndex(),
	}
	// Progress is stored by one flusher from the start: even an engine that
	// is never started (the CLI reading jobs) may record some.
	go e.flushLoop()
	return e
}

// EnvSecret resolves secret NAME from the server's DELEGATE_SECRET_NAME.
func EnvSecret(name string) (string, bool) { return os.LookupEnv("DELEGATE_SECRET_" + name) }

// Owner is this engine's identity in the store.
func (e *Engine) Owner() string { return e.owner }

// Start recovers jobs left by engines that have died and starts the
// cleanup loop. It returns once recovery has been decided for every job.
func (e *Engine) Start(ctx context.Context) error {
	// Finishes from now on are watched for (see watchFinishes).
	own := e.own.Load()
	finishes, err := e.store.Finishes(ctx)
	if err != nil {
		return err
	}
	if err := e.recover(ctx); err != nil {
		return fmt.Errorf("recover jobs: %w", err)
	}
	if e.backend != nil {
		e.sweep(ctx)
	}
	e.every(e.cfg.CleanupInterval, e.cleanup)
	e.every(max(e.cfg.HeartbeatThreshold/4, 100*time.Millisecond), e.checkHeartbeats)
	e.every(e.cfg.PollInterval, e.watchFinishes(finishes, own))
	return nil
}

// every runs fn at each interval until the engine closes.
func (e *Engine) every(interval time.Duration, fn func(context.Context)) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-t.C:
				fn(e.ctx)
			}
		}
	}()
}

// Close stops the engine without touching running jobs: their sandboxes go
// on, and the next engine to start re-attaches to them. Queued jobs stay
// pending and are picked up the same way.
func (e *Engine) Close() error {
	e.stop()
	e.wg.Wait()
	// Nothing reports any more: store what was reported last.
	e.closeOnce.Do(func() { close(e.flushStop) })
	<-e.flushDone
	return nil
}

// Submit validates a manifest, stores the job as pending and queues it.
// It returns at once.
func (e *Engine) Submit(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if k := opts.IdempotencyKey; k != "" {
		if len(k) > 200 || strings.ContainsRune(k, 0) {
			return nil, &delegate.FieldError{Field: "idempotency_key", Rule: "must be at most 200 bytes without NUL"}
		}
		if job, err := e.store.JobByIdempotencyKey(ctx, k); err == nil {
			return job, nil
		}
	}
	if m.Network == delegate.NetworkEgress && !e.backend.Capabilities().NetworkEgress {
		return nil, &delegate.FieldError{Field: "manifest.network", Rule: fmt.Sprintf("egress is not available on the %s backend here (set network: none)", e.backend.Name())}
	}
	chosenTemplate := m.VMTemplate != ""
	m.ApplyDefaults(e.cfg.Defaults)
	if err := m.Validate(); err != nil { // the defaults themselves may be bad
		return nil, fmt.Errorf("server defaults: %w", err)
	}
	if err := e.checkTemplate(ctx, m.VMTemplate, chosenTemplate); err != nil {
		return nil, err
	}
	if err := e.checkResources(ctx, m); err != nil {
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
	now := time.Now().UTC()
	job := &delegate.Job{
		ID:        newJobID(),
		Manifest:  m,
		Status:    delegate.StatusPending,
		Progress:  "queued",
		CreatedAt: now,
		UpdatedAt: now,
		Backend:   e.backend.Name(),
		Owner:     e.owner,

		IdempotencyKey: opts.IdempotencyKey,
	}
	if err := e.store.CreateJob(ctx, job); err != nil {
		if opts.IdempotencyKey != "" {
			// A concurrent submission with the same key won the race.
			if first, ferr := e.store.JobByIdempotencyKey(ctx, opts.IdempotencyKey); ferr == nil {
				return first, nil
			}
		}
		return nil, fmt.Errorf("submit: %w", err)
	}
	e.log.Debug("job submitted", "job", job.ID, "agent", m.AgentType)
	e.enqueue(job.ID)
	return job, nil
}

// Get returns a job, with the progress it reported that is not stored yet.
func (e *Engine) Get(ctx context.Context, id string) (*delegate.Job, error) {
	unstored := e.progress.snapshot(id)
	j, err := e.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	unstored.apply(j)
	return j, nil
}

// Cancel ends a job that has not finished. It returns the job and whether
// this call cancelled it (false when it had already finished). The engine
// driving the job kills it; a job that no live engine drives, this one
// takes over and stops before Cancel returns (cancelOrphan).
func (e *Engine) Cancel(ctx context.Context, id string) (*delegate.Job, bool, error) {
	if job, cancelled, done, err := e.cancelOrphan(ctx, id); done {
		return job, cancelled, err
	}
	e.flushJob(ctx, id)
	job, err := e.update(ctx, id, func(j *delegate.Job) error {
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
	e.mu.Lock()
	if r := e.runs[id]; r != nil {
		r.cancel()
		r.killNow()
	}
	e.mu.Unlock()
	return job, true, nil
}

// Wait blocks until the job is finished or ctx is done, and returns the
// job as it is then. It sees changes made by other processes too.
func (e *Engine) Wait(ctx context.Context, id string) (*delegate.Job, error) {
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		// A read of the local store: it must not fail because the caller's
		// wait is up at that very moment.
		job, err := e.Get(context.WithoutCancel(ctx), id)
		if err != nil || job.Status.Terminal() {
			return job, err
		}
		select {
		case <-ctx.Done():
			return job, nil
		case <-changed:
		case <-time.After(4 * e.cfg.PollInterval):
		}
	}
}

// notify wakes waiters, and tells watchers that job id changed ("": some
// job, changed by another process).
func (e *Engine) notify(id string) {
	e.mu.Lock()
	close(e.changed)
	e.changed = make(chan struct{})
	if id == "" {
		e.mu.Unlock()
		return
	}
	for w := range e.watches {
		select {
		case w <- id:
		default: // a slow watcher misses a wake-up, not the state: it re-reads
		}
	}
	e.mu.Unlock()
}

// update changes a stored job and wakes waiters. Every change of status
// this engine makes goes through here, so that the job's end is known to
// its follower and the callback index at once.
func (e *Engine) update(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	return e.updateThen(ctx, id, nil, fn)
}

// updateThen is update, with stored (if set) called with the job as
// stored before anyone is told of the change.
func (e *Engine) updateThen(ctx context.Context, id string, stored func(*delegate.Job), fn func(*delegate.Job) error) (*delegate.Job, error) {
	var before delegate.Status
	j, err := e.store.UpdateJob(ctx, id, func(j *delegate.Job) error {
		before = j.Status
		return fn(j)
	})
	if err != nil {
		return j, err
	}
	if stored != nil {
		stored(j)
	}
	if !before.Terminal() && j.Status.Terminal() {
		e.own.Add(1)
		e.ended(id, j.Status)
	}
	e.notify(id)
	return j, nil
}

// ended records that job id has reached a terminal status: its follower
// (if this engine drives it) winds it up, and callbacks are refused.
func (e *Engine) ended(id string, st delegate.Status) {
	e.tokens.forget(id)
	e.mu.Lock()
	r := e.runs[id]
	e.mu.Unlock()
	if r != nil {
		r.end.Store(&st)
	}
}

// watchFinishes notices jobs this engine drives that another process has
// finished (a cancel from the CLI, a completion received by another
// server): one cheap read of the store's finish counter per poll, and a
// read of the jobs only when another process has finished one.
func (e *Engine) watchFinishes(lastStore, lastOwn int64) func(context.Context) {
	return func(ctx context.Context) {
		own := e.own.Load()
		n, err := e.store.Finishes(ctx)
		if err != nil {
			return
		}
		foreign := n - lastStore - (own - lastOwn)
		lastStore, lastOwn = n, own
		if foreign == 0 {
			return
		}
		e.foreign.Add(1) // callbacks re-read the status of the jobs they index
		check := make(map[string]bool)
		e.mu.Lock()
		for id, r := range e.runs {
			if r.end.Load() == nil {
				check[id] = true
			}
		}
		e.mu.Unlock()
		// The callback index also holds jobs that other processes drive:
		// forget those that have ended, so that it holds running jobs only.
		for _, id := range e.tokens.ids() {
			check[id] = true
		}
		for id := range check {
			if j, err := e.store.GetJob(ctx, id); err == nil && j.Status.Terminal() {
				e.ended(id, j.Status)
			}
		}
		e.notify("") // waiters read again
	}
}

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
	if j.SandboxID == "" {
		return j, false, nil
	}
	if err := e.backend.Destroy(ctx, j.SandboxID); err != nil {
		return j, false, fmt.Errorf("release the sandbox of job %s: %w", id, err)
	}
	e.roomFreed()
	j, err = e.update(ctx, id, func(j *delegate.Job) error {
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
