package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// outputChunk is how much output is moved from the sandbox to the store at once.
const outputChunk = 256 << 10

// runner is the part that takes a job through its life in a sandbox:
// provisioning as an ordered list of steps, then following the running
// command, then settling its end (artifacts, status, the sandbox's
// destruction). It keeps a handle per job it drives, under its own lock.
type runner struct {
	cfg       Config
	log       *slog.Logger
	owner     string
	life      *group
	store     delegate.Store
	ref       *backendRef
	jobs      *jobWriter
	progress  *progressWriter
	callbacks *callbacks
	keeper    *keeper // kept sandboxes: the commands run in them
	questions *questions
	// roomFreed is the scheduler's: a sandbox is gone, jobs waiting for
	// capacity may fit now.
	roomFreed func()

	mu   sync.Mutex
	runs map[string]*run // jobs this engine is driving
}

// run is the runner's handle on one job it drives.
type run struct {
	cancel context.CancelFunc // aborts provisioning
	kill   chan struct{}      // closed to kill the running process
	once   sync.Once
	// end is the terminal status the job reached while it still runs (a
	// completion callback, a cancel, here or in another process).
	end atomic.Pointer[delegate.Status]
}

func (r *run) killNow() { r.once.Do(func() { close(r.kill) }) }

// backend is the engine's backend (nil for an engine made without one that
// has not needed to open it).
func (r *runner) backend() sandbox.Backend { return r.ref.get() }

func (r *runner) register(id string) (*run, context.Context) {
	ctx, cancel := context.WithCancel(r.life.ctx)
	h := &run{cancel: cancel, kill: make(chan struct{})}
	r.mu.Lock()
	r.runs[id] = h
	r.mu.Unlock()
	return h, ctx
}

func (r *runner) unregister(id string) {
	r.mu.Lock()
	if h := r.runs[id]; h != nil {
		h.cancel()
		delete(r.runs, id)
	}
	r.mu.Unlock()
}

// handle returns the handle of a job this runner drives, or nil.
func (r *runner) handle(id string) *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// drives reports whether this engine is driving a job (it has not let go
// of it yet: it may be destroying its sandbox).
func (r *runner) drives(id string) bool { return r.handle(id) != nil }

// driven lists the jobs this runner drives.
func (r *runner) driven() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.runs))
	for id := range r.runs {
		ids = append(ids, id)
	}
	return ids
}

// stop aborts a job's provisioning and kills its process, if this runner
// drives it.
func (r *runner) stop(id string) {
	if h := r.handle(id); h != nil {
		h.cancel()
		h.killNow()
	}
}

// ended records that job id has reached a terminal status: its follower
// (if this runner drives it) winds it up.
func (r *runner) ended(id string, st delegate.Status) {
	if h := r.handle(id); h != nil {
		h.end.Store(&st)
	}
}

// run takes a pending job through provisioning to its end. adm is the
// room the backend reserved for it (nil: none was needed).
func (r *runner) run(id string, adm sandbox.Admission) {
	if adm != nil {
		defer adm.Release() // a no-op once Create has used it
	}
	h, ctx := r.register(id)
	defer r.unregister(id)

	var token string
	job, err := r.jobs.update(ctx, id, func(j *delegate.Job) error {
		if j.Status != delegate.StatusPending {
			return delegate.ErrTerminal // cancelled while queued
		}
		token = r.claim(j)
		return nil
	})
	if err != nil {
		if !errors.Is(err, delegate.ErrTerminal) && ctx.Err() == nil {
			r.log.Error("start job", "job", id, "err", err)
		}
		return
	}
	r.drive(ctx, h, &attempt{job: job, adm: adm, token: token})
}

// claim makes a pending job this runner's, to be started now; it returns
// the callback token of a command in a kept sandbox, made here (its hash
// is recorded with the claim).
func (r *runner) claim(j *delegate.Job) (token string) {
	j.Status, j.Progress, j.Owner, j.Backend = delegate.StatusProvisioning, "provisioning sandbox", r.owner, r.backend().Name()
	if j.Manifest.Sandbox != "" {
		// A command in a kept sandbox: this one write also records its
		// sandbox and its callback token, which a fresh job's steps
		// write on their way (see attachSteps). Its machine's id
		// (SandboxID) is recorded once the command runs: a job caught
		// provisioning is rolled back by its SandboxID, which must
		// never be a kept sandbox's machine.
		token, j.TokenHash = newToken()
		j.Sandbox, j.Progress = j.Manifest.Sandbox, "starting the command"
	}
	return token
}

// claimed is a job that Submit stored claimed (claim), in a run slot it
// took, with its run registered before the job could be seen.
type claimed struct {
	h     *run
	ctx   context.Context
	job   *delegate.Job // as stored, its files apart (files)
	token string
	files []delegate.File // the manifest's
}

// runClaimed takes a job that Submit stored claimed through provisioning
// to its end.
func (r *runner) runClaimed(c claimed) {
	defer r.unregister(c.job.ID)
	r.drive(c.ctx, c.h, &attempt{job: c.job, token: c.token, files: c.files, filesKnown: true})
}

// drive takes a claimed job through provisioning to its end.
func (r *runner) drive(ctx context.Context, h *run, a *attempt) {
	id, job := a.job.ID, a.job
	log := r.log.With("job", id)
	pctx, cancelProvision := context.WithTimeout(ctx, r.cfg.ProvisionTimeout)
	if a.token != "" {
		r.indexToken(job)
	}
	err := r.provision(pctx, a)
	cancelProvision()
	if err != nil {
		// The command never ran (or was killed before it was recorded as
		// running), also when the server is stopping: fail the job and
		// roll its sandbox back now, rather than leave both to the next
		// server that starts.
		reason := fmt.Sprintf("provisioning failed: %v", err)
		if r.life.stopping() {
			reason = "the server stopped while the sandbox was being provisioned; submit the job again"
		} else if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			reason = fmt.Sprintf("provisioning took longer than %s", r.cfg.ProvisionTimeout)
		}
		// A sandbox that was started has its end observed, as the store
		// has it (a cancel may have decided it), so that every start the
		// metrics count has an end.
		var observed func(*delegate.Job)
		if a.sb != nil {
			observed = r.jobEnded
		}
		r.finishAt(id, delegate.StatusFailed, reason, time.Now().UTC(), observed, nil)
		r.removeClone(id, job.Manifest)
		switch {
		case a.attached:
			// A kept sandbox's: it stays for the next command (the job's
			// end above counts this one out), unless its machine is gone.
			if sb, gerr := r.keeper.sbs.GetSandboxUncounted(context.WithoutCancel(ctx), job.Manifest.Sandbox); gerr == nil {
				r.keeper.failed(ctx, sb, err)
			}
		case a.kept != "":
			r.keeper.end(context.WithoutCancel(ctx), a.kept, delegate.SandboxGone, "the job that made it failed to start: "+reason)
		case a.sb != nil:
			r.rollback(id, a.sb.ID())
		}
		if a.net != nil && !a.attached && a.kept == "" && r.cfg.Egress != nil {
			r.cfg.Egress.end(context.WithoutCancel(ctx), a.net.id)
		}
		return
	}
	log.Debug("job running", "sandbox", a.sb.ID())
	r.follow(h, job.ID, a.sb, a.proc, job.Manifest, a.known())
}

// attempt is one job's way from pending to running: what the provisioning
// steps have made so far, for the next steps and for a rollback.
type attempt struct {
	job   *delegate.Job
	adm   sandbox.Admission
	sb    sandbox.Instance // made by the first step; rolled back on failure
	token string           // the job's callback token, known only here and in its environment
	proc  sandbox.Process
	// files are the manifest's files when the run was given them
	// (filesKnown); otherwise writeFiles reads them.
	files      []delegate.File
	filesKnown bool
	// attached: sb is a kept sandbox's (manifest.sandbox), which a failure
	// leaves be; kept: the kept sandbox this persistent job made, which a
	// failure ends.
	attached bool
	kept     string
	// maker is the manifest of the job that made the kept sandbox a
	// command runs in (its workspace and caches); nil when opened empty.
	maker *delegate.Manifest
	// net is the job's network through the egress proxy (or its kept
	// sandbox's); nil when its network is not the proxy's.
	net *jobNetwork
	// workspace: the kept sandbox a command runs in may hold a workspace
	// whose changes are collected after the command (its maker had one,
	// or its maker's manifest could not be read).
	workspace bool
}

// started is what the run that started a job knows of it, which its
// follower would otherwise read from the store again; a job followed
// after a restart or a takeover has none (nil).
type started struct {
	job *delegate.Job // as stored when it began running
	net *jobNetwork   // its network through the proxy; nil if none
	// workspace: its end may have workspace changes to collect.
	workspace bool
}

// known is what the attempt learned, for the job's follower.
func (a *attempt) known() *started {
	return &started{job: a.job, net: a.net, workspace: a.workspace || a.job.Manifest.Workspace != nil}
}

// provisionSteps take a job from pending to running, in order. A new
// stage of provisioning (a workspace to import, an egress policy to
// install) is one more step here, not another branch of run. A step's
// error fails the job ("provisioning failed: …") and rolls the sandbox
// back.
var provisionSteps = []struct {
	name string
	do   func(*runner, context.Context, *attempt) error
}{
	{"open the job's network", (*runner).networkStep},
	{"create the sandbox", (*runner).createStep},
	{"import the workspace", (*runner).importWorkspace},
	{"write the files", (*runner).writeFiles},
	{"issue the callback token", (*runner).issueToken},
	{"start the command", (*runner).startCommand},
}

// attachSteps take a command in a kept sandbox (manifest.sandbox) from
// pending to running: the sandbox is there already.
var attachSteps = []struct {
	name string
	do   func(*runner, context.Context, *attempt) error
}{
	{"attach to the kept sandbox", (*runner).attachStep},
	{"write the files", (*runner).writeFiles},
	{"start the command", (*runner).startCommand},
}

// provision runs the provisioning steps.
func (r *runner) provision(ctx context.Context, a *attempt) error {
	steps := provisionSteps
	if a.job.Manifest.Sandbox != "" {
		steps = attachSteps
	}
	for _, step := range steps {
		if err := step.do(r, ctx, a); err != nil {
			return err
		}
	}
	return nil
}

// attachStep finds the kept sandbox the command runs in (resumed if it
// was paused), counts the command there, and finds what the command
// shares with the sandbox: the workspace of the job that made it, and
// its network. (The job was recorded in the sandbox as it was claimed.)
func (r *runner) attachStep(ctx context.Context, a *attempt) error {
	sb, inst, err := r.keeper.instance(ctx, a.job.Manifest.Sandbox, true)
	if err != nil {
		return err
	}
	a.sb, a.attached = inst, true
	if sb.JobID != "" {
		mm, err := r.store.JobManifest(ctx, sb.JobID)
		if err == nil {
			a.maker = &mm
		}
		a.workspace = err != nil || mm.Workspace != nil
	}
	return r.attachNetwork(ctx, a, sb)
}

// createStep creates the sandbox and records it on the job.
func (r *runner) createStep(ctx context.Context, a *attempt) error {
	spec, err := sandboxSpec(a.job)
	if err != nil {
		return err
	}
	spec.Admission, spec.Progress, spec.Egress = a.adm, r.stepper(ctx, a.job.ID), a.net.spec()
	// A persistent job's sandbox is kept, for more commands: made to run
	// them where the backend can, with a lifetime. (A local sandbox whose
	// network is a network helper's, not the proxy's, runs one command.)
	keep := a.job.Manifest.Lifecycle == delegate.LifecyclePersistent && r.backend().Capabilities().MultiExec &&
		!(a.job.Manifest.Network.Reaches() && a.net == nil && r.backend().Name() == "local")
	if keep {
		spec.MultiExec, spec.Expires = true, time.Now().Add(r.cfg.SandboxLifetime)
	}
	sb, err := r.createSandbox(ctx, spec)
	if err != nil {
		return err
	}
	a.sb = sb
	keptID := ""
	if keep {
		keptID = newSandboxID()
	}
	// The job names its kept sandbox before the sandbox is recorded: a
	// sandbox's activity is its jobs', and one recorded first would read
	// idle, without its first command, until the job named it.
	_, err = r.jobs.update(ctx, a.job.ID, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job became %s: %w", j.Status, delegate.ErrTerminal)
		}
		j.SandboxID, j.Sandbox, j.Progress = sb.ID(), keptID, "writing files"
		return nil
	})
	if err != nil || !keep {
		return err
	}
	if err := r.keeper.kept(ctx, keptID, a.job, sb, spec.Expires); err != nil {
		return fmt.Errorf("record the kept sandbox: %w", err)
	}
	a.kept = keptID
	return nil
}

// writeFiles writes the manifest's files into the sandbox. They are kept
// apart from the job in the store: read only here, unless Submit handed
// them to the run it started.
func (r *runner) writeFiles(ctx context.Context, a *attempt) error {
	raw := a.files
	if !a.filesKnown {
		var err error
		if raw, err = r.store.JobFiles(ctx, a.job.ID); err != nil {
			return err
		}
	}
	withFiles := a.job.Manifest
	withFiles.Files = raw
	files, err := withFiles.DecodedFiles()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := a.sb.WriteFile(ctx, f.Path, f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	return nil
}

// issueToken makes the job's callback token: its hash is stored and
// indexed, the token itself goes only into the job's environment.
func (r *runner) issueToken(ctx context.Context, a *attempt) error {
	token, tokenHash := newToken()
	withToken, err := r.jobs.update(ctx, a.job.ID, func(j *delegate.Job) error {
		j.TokenHash = tokenHash
		return nil
	})
	if err != nil {
		return err
	}
	r.indexToken(withToken)
	a.token = token
	return nil
}

// indexToken lets callbacks made with the job's token in (job, as
// stored, has the token's hash).
func (r *runner) indexToken(job *delegate.Job) {
	if ent, ok := r.callbacks.indexJob(job, r.jobs.foreign.Load()); ok {
		r.callbacks.tokens.put(job.ID, ent)
	}
}

// startCommand starts the job's command and records the job as running.
func (r *runner) startCommand(ctx context.Context, a *attempt) error {
	ws := &a.job.Manifest
	if a.attached {
		ws = a.maker
	}
	cmd, err := r.command(a.job, a.token, ws, a.net)
	if err != nil {
		return err
	}
	proc, err := a.sb.Exec(ctx, cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", cmd.Args[0], err)
	}
	running, err := r.jobs.update(ctx, a.job.ID, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job became %s: %w", j.Status, delegate.ErrTerminal)
		}
		j.Status, j.Progress, j.SandboxID, j.ExecID = delegate.StatusRunning, "running", a.sb.ID(), proc.ID()
		j.StartedAt = time.Now().UTC()
		j.LastHeartbeat = j.StartedAt
		return nil
	})
	if err != nil {
		proc.Kill(context.WithoutCancel(ctx))
		return err
	}
	a.job, a.proc = running, proc
	return nil
}

// reattach follows a running job whose engine died, if its process is
// still there; otherwise it fails the job and removes what is left.
func (r *runner) reattach(ctx context.Context, job *delegate.Job) {
	log := r.log.With("job", job.ID, "sandbox", job.SandboxID)
	fail := func(err error) {
		log.Warn("job lost with its sandbox", "err", err)
		r.finish(job.ID, delegate.StatusFailed, fmt.Sprintf("sandbox lost after a server restart: %v", err), nil)
		// A kept sandbox's command (or the job that made it): the
		// machine is the sandbox's, whose timers end it (and whose next
		// use finds it gone, if it is); its end above counts the command
		// out there.
		if job.Sandbox == "" && job.SandboxID != "" {
			r.destroy(job.SandboxID, delegate.Manifest{})
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
	h, _ := r.register(job.ID)
	r.life.Go(func() {
		defer r.unregister(job.ID)
		r.follow(h, job.ID, sb, proc, job.Manifest, nil)
	})
}

// stepper reports a backend's provisioning steps as the job's progress,
// and as entries of its timeline (statusMode detailed and streaming), so
// that where a slow start spent its time (a clone, a boot, the guest
// agent) shows afterwards too.
func (r *runner) stepper(ctx context.Context, id string) func(string) {
	return func(step string) {
		step = clip(step)
		now := time.Now().UTC()
		r.log.Debug("provisioning step", "job", id, "step", step)
		j, err := r.jobs.update(ctx, id, func(j *delegate.Job) error {
			if j.Status.Terminal() {
				return delegate.ErrTerminal
			}
			j.Progress = step
			return nil
		})
		if err == nil && j.Manifest.StatusMode != delegate.StatusModeSimple {
			if err := r.store.AddEvent(ctx, id, delegate.Event{Time: now, Message: step}, maxEvents); err != nil {
				r.log.Warn("provisioning step: timeline", "job", id, "err", err)
			}
		}
	}
}

func sandboxSpec(job *delegate.Job) (sandbox.Spec, error) {
	r := job.Manifest.Resources
	mem, err := delegate.ParseSize(r.Memory)
	if err != nil {
		return sandbox.Spec{}, fmt.Errorf("resources.memory: %w", err)
	}
	disk, err := delegate.ParseSize(r.Disk)
	if err != nil {
		return sandbox.Spec{}, fmt.Errorf("resources.disk: %w", err)
	}
	spec := sandbox.Spec{
		JobID:       job.ID,
		CPU:         r.CPU,
		MemoryBytes: mem,
		DiskBytes:   disk,
		Template:    job.Manifest.VMTemplate,
		Network:     job.Manifest.Network.Reaches(),
	}
	for _, c := range job.Manifest.Caches {
		spec.Caches = append(spec.Caches, sandbox.Cache{Name: c, Key: CacheKey(job.Manifest.Workspace)})
	}
	return spec, nil
}

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
func (r *runner) follow(h *run, id string, sb sandbox.Instance, proc sandbox.Process, m delegate.Manifest, known *started) {
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
		done <- waited{exit, err, time.Now().UTC()}
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
		t.collect(context.WithoutCancel(ctx), true)
		r.settle(t, sb, w.exit, w.err, timedOut, w.at, known)
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
				r.progress.report(id, "", nil, false, time.Now().UTC())
			}
		case <-h.kill:
			kill()
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

// tracker moves one running job's output and status lines into the store:
// secrets redacted, output capped, Claude's stream-json read as progress.
type tracker struct {
	r      *runner
	id     string
	m      delegate.Manifest
	proc   sandbox.Process
	redact *redactor
	kept   int64 // output bytes stored
	// next is where the next read of the process's output starts; read
	// is what the store records as consumed (Job.OutputRead), where a
	// restarted engine reads on from (see collectOutput).
	next, read int64
	// held is, per stream, what the redactor holds back (it could be the
	// start of a secret): the output is redacted stream by stream.
	held       [3]heldOutput
	eventsRead int64
	latest     int64 // lines of an overflowed status channel seen (sandbox.LatestEvent)
	events     lineSplitter
	asks       questionScanner
	claude     lineSplitter
}

// heldOutput is the end of one stream the redactor holds back.
type heldOutput struct {
	data []byte
	at   int64 // where data starts in the process's output
	// last: data is the last of the process's output read so far (no
	// byte of another stream came after it), so reading again from at
	// finds it, and nothing after it.
	last bool
}

// What one tick of the follow loop moves at most; the rest waits for the
// next tick (the end of the job drains everything).
const (
	outputPerTick = 4 * outputChunk
	eventsPerTick = 256 << 10
	eventsChunk   = 64 << 10
)

// fresh: the job has just started (nothing of its output is stored yet).
func (r *runner) newTracker(ctx context.Context, job *delegate.Job, proc sandbox.Process, fresh bool) (*tracker, error) {
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
	return &tracker{r: r, id: job.ID, m: job.Manifest, proc: proc, redact: newRedactor(secrets), kept: kept,
		next: job.OutputRead, read: job.OutputRead}, nil
}

// collect pulls what is new, a bounded amount per call; final drains
// everything, and flushes what the redactor held back.
func (t *tracker) collect(ctx context.Context, final bool) {
	t.collectEvents(ctx, final)
	t.collectOutput(ctx, final)
}

// collectOutput moves new output into the store. Each stream is redacted
// on its own (a secret split by output of the other stream is still
// caught), and the streams keep their order, except that what the
// redactor holds back of one stream (the possible start of a secret, a
// few bytes, rarely any) goes on when more of that stream comes, after
// what the other stream wrote meanwhile.
//
// What the store records as read is where a restarted engine reads on
// from: everything before it is stored, except what was held back of a
// stream that the other one has written after since (a restart loses
// those few bytes rather than store the other stream's twice).
func (t *tracker) collectOutput(ctx context.Context, final bool) {
	r := t.r
	for moved := 0; final || moved < outputPerTick; {
		outs, err := t.proc.ReadOutput(ctx, t.next, outputChunk)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("read output", "job", t.id, "err", err)
			}
			return
		}
		// What this read changes, undone if it cannot be stored (the
		// next tick reads it again).
		next, held := t.next, t.held
		n := 0
		var chunk []delegate.Output
		for _, o := range outs {
			chunk = t.redactPiece(chunk, stream(o.Stream), o.Data)
			n += len(o.Data)
		}
		moved += n
		last := n < outputChunk
		if final && last {
			chunk = t.flushHeld(chunk)
		}
		read := t.next
		for _, h := range t.held {
			if len(h.data) > 0 && h.last {
				read = h.at
			}
		}
		kept, stored := capOutput(chunk, r.cfg.OutputLimit-t.kept)
		if read != t.read || stored > 0 {
			// The chunk and how far the output was read, in one write.
			if err := r.store.AppendOutput(ctx, t.id, kept, read); err != nil {
				r.log.Warn("store output", "job", t.id, "err", err)
				t.next, t.held = next, held
				return
			}
			if stored > 0 {
				r.jobs.notify(t.id) // subscribers of job://{id}/log
			}
		}
		t.kept += stored
		t.read = read
		if t.m.AgentType == delegate.AgentClaude {
			t.claudeOutput(chunk, final && last) // all of it, kept or not
		}
		if last {
			return
		}
	}
}

// redactPiece redacts data, the next output of stream s, after what was
// held back of s, adds what can go on to chunk, and holds back the rest.
func (t *tracker) redactPiece(chunk []delegate.Output, s delegate.Stream, data []byte) []delegate.Output {
	h := &t.held[s]
	prior := len(h.data)
	buf := append(h.data, data...)
	out, used := t.redact.stream(buf, false)
	chunk = delegate.AppendOutput(chunk, s, out)
	switch rest := buf[used:]; {
	case len(rest) == 0:
		h.data = nil
	case used >= prior: // only the end of data is held
		h.data, h.at, h.last = rest, t.next+int64(used-prior), true
	default: // some of what was held still is, and data with it
		h.data, h.at = rest, h.at+int64(used)
	}
	t.next += int64(len(data))
	for i := range t.held {
		if delegate.Stream(i) != s && len(data) > 0 {
			t.held[i].last = false // data came after it
		}
	}
	return chunk
}

// flushHeld adds what is held back to chunk, in the order it was written:
// the output has ended.
func (t *tracker) flushHeld(chunk []delegate.Output) []delegate.Output {
	for {
		first := -1
		for i, h := range t.held {
			if len(h.data) > 0 && (first < 0 || h.at < t.held[first].at) {
				first = i
			}
		}
		if first < 0 {
			return chunk
		}
		out, _ := t.redact.stream(t.held[first].data, true)
		chunk = delegate.AppendOutput(chunk, delegate.Stream(first), out)
		t.held[first].data = nil
	}
}

// capOutput returns the first room bytes of chunk (chunk itself is left
// as it is) and how many that is.
func capOutput(chunk []delegate.Output, room int64) ([]delegate.Output, int64) {
	var n int64
	for i, o := range chunk {
		if int64(len(o.Data)) >= room-n {
			kept := append([]delegate.Output(nil), chunk[:i+1]...)
			kept[i].Data = o.Data[:max(0, room-n)]
			return kept, n + int64(len(kept[i].Data))
		}
		n += int64(len(o.Data))
	}
	return chunk, n
}

// claudeOutput reads Claude's stream-json, which is on stdout, as progress.
func (t *tracker) claudeOutput(chunk []delegate.Output, final bool) {
	for _, o := range chunk {
		if o.Stream != delegate.StreamStderr {
			for _, line := range t.claude.lines(o.Data, false) {
				t.claudeLine(line)
			}
		}
	}
	if final {
		for _, line := range t.claude.lines(nil, true) {
			t.claudeLine(line)
		}
	}
}

// stream is the domain's name of a sandbox's stream.
func stream(s sandbox.Stream) delegate.Stream {
	switch s {
	case sandbox.Stdout:
		return delegate.StreamStdout
	case sandbox.Stderr:
		return delegate.StreamStderr
	}
	return delegate.StreamCombined
}

// collectEvents reads the status channel. Under a flood only the newest
// lines matter (the progress is the last one, the timeline keeps the
// newest MaxTimeline): the others are counted, never parsed.
func (t *tracker) collectEvents(ctx context.Context, final bool) {
	keep := 1
	if t.timeline() {
		keep = delegate.MaxTimeline
	}
	budget := eventsPerTick
	if final {
		budget = maxEventsAtEnd
	}
	for moved := 0; moved < budget; {
		b, err := t.proc.ReadEvents(ctx, t.eventsRead, eventsChunk)
		if err != nil {
			return
		}
		t.eventsRead += int64(len(b))
		moved += len(b)
		lines, skipped := t.events.tail(b, final && len(b) == 0, keep)
		t.statusLines(lines, skipped)
		t.questionLines(ctx, b, final && len(b) == 0)
		if len(b) == 0 {
			t.collectLatest(ctx)
			return
		}
	}
}

// maxEventsAtEnd bounds what is read of the status channel when the job
// has ended (the local backend keeps at most 1 MiB of it anyway).
const maxEventsAtEnd = 8 << 20

// collectLatest reads the latest line of a status channel that overflowed
// (sandbox.LatestEvent): lines past its cap are not kept, the latest is.
func (t *tracker) collectLatest(ctx context.Context) {
	le, ok := t.proc.(sandbox.LatestEvent)
	if !ok {
		return
	}
	line, count, err := le.LatestEvent(ctx)
	if err != nil || count <= t.latest {
		return
	}
	skipped := count - t.latest - 1
	t.latest = count
	t.statusLines([]string{line}, int(skipped))
	if isQuestionLine([]byte(line)) {
		one := 1
		t.asks.take([]byte(line), &one, func(line string) { t.r.questions.statusLine(ctx, t.id, line) })
	}
}

// questionLines asks the questions among the status lines in b. Every
// line is looked at, not only those a flood leaves for the progress (see
// collectEvents): a question must not be lost among them.
func (t *tracker) questionLines(ctx context.Context, b []byte, final bool) {
	t.asks.questions(b, final, func(line string) { t.r.questions.statusLine(ctx, t.id, line) })
}

func (t *tracker) timeline() bool { return t.m.StatusMode != delegate.StatusModeSimple }

// statusLines records status lines as progress (the timeline gets each,
// the progress the last), and counts lines skipped unread.
func (t *tracker) statusLines(lines []string, skipped int) {
	now := time.Now().UTC()
	if skipped > 0 {
		if t.timeline() {
			t.r.progress.dropped(t.id, int64(skipped))
		}
		t.r.progress.report(t.id, "", nil, false, now)
	}
	for _, line := range lines {
		t.r.progress.report(t.id, t.redact.string(parseStatusLine(line)), nil, t.timeline(), now)
	}
}

func (t *tracker) claudeLine(line string) {
	progress, result := parseClaudeLine(line)
	if progress == "" && result == nil {
		return
	}
	if result != nil { // read from the output, which is redacted already
		r := clipResult(*result)
		result = &r
	}
	t.r.progress.report(t.id, progress, result, t.timeline(), time.Now().UTC())
}

// report records a sign of life from a job: a progress message (kept in the
// timeline in statusMode detailed and streaming), and perhaps its result
// text. It is coalesced in memory and stored within progressEvery.
func (r *runner) report(ctx context.Context, id string, m delegate.Manifest, progress string, result *string) {
	r.progress.report(id, progress, result, m.StatusMode != delegate.StatusModeSimple, time.Now().UTC())
}

// maxEvents is how many timeline entries a job keeps.
const maxEvents = delegate.MaxTimeline

// maxResult caps a job's result text.
const maxResult = 64 << 10

func clipResult(s string) string {
	if len(s) > maxResult {
		s = s[:maxResult]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// settle records how the process ended, collects artifacts, and destroys an
// ephemeral sandbox.
func (r *runner) settle(t *tracker, sb sandbox.Instance, exit sandbox.Exit, waitErr error, timedOut bool, endedAt time.Time, known *started) {
	id, m := t.id, t.m
	var (
		status = delegate.StatusSuccess
		reason string
		code   *int
	)
	switch {
	case waitErr != nil:
		status, reason = delegate.StatusFailed, fmt.Sprintf("lost the job's process: %v", waitErr)
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
		r.collectChanges(context.WithoutCancel(r.life.ctx), id, sb)
	}
	if m.Lifecycle != delegate.LifecyclePersistent {
		r.removeClone(id, m) // its changes' old side is read
	}
	// Its end is also its kept sandbox's (if it ran in one): the
	// sandbox's activity is read from its jobs.
	r.finishAt(id, status, t.redact.string(reason), endedAt, r.jobEnded, func(j *delegate.Job) {
		if j.ExitCode == nil { // a completion callback may have reported one
			j.ExitCode = code
		}
		j.OOMKilled = exit.OOMKilled
		if waitErr == nil {
			j.OutputBytes = max(j.OutputBytes, exit.OutputBytes)
			j.OutputTruncated = exit.Truncated || j.OutputBytes > r.cfg.OutputLimit
		}
	})
	r.destroy(sb.ID(), m)
}

// stored is the job as its run stored it last; nil if unknown.
func (s *started) stored() *delegate.Job {
	if s == nil {
		return nil
	}
	return s.job
}

// finish moves the job to a terminal status. If it already is terminal (a
// cancel won the race), the status stays, and only facts (exit code, output
// size) are recorded. The job's pending progress is stored first, and the
// end is stored before finish returns.
func (r *runner) finish(id string, status delegate.Status, reason string, facts func(*delegate.Job)) {
	r.finishAt(id, status, reason, time.Now().UTC(), nil, facts)
}

// finishAt is finish for a job that ended at a known time (its process
// exited then): its duration does not include what was done after. stored,
// if set, sees the finished job before anyone waiting for it is woken.
func (r *runner) finishAt(id string, status delegate.Status, reason string, at time.Time, stored func(*delegate.Job), facts func(*delegate.Job)) {
	ctx := context.WithoutCancel(r.life.ctx)
	r.progress.flushJob(ctx, id)
	j, err := r.jobs.updateThen(ctx, id, stored, func(j *delegate.Job) error {
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
	if err != nil {
		r.log.Error("finish job", "job", id, "err", err)
		return
	}
	r.callbacks.tokens.forget(id)
	r.log.Info("job finished", "job", id, "status", j.Status, "reason", j.Error)
}

// destroy removes an ephemeral job's sandbox; a persistent one is kept.
func (r *runner) destroy(sandboxID string, m delegate.Manifest) {
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
