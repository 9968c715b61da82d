package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// starter is the part that takes a job from pending to running: it claims
// it, runs the provisioning steps in order (its network, its sandbox, its
// workspace, its files, its token, its command), and hands the running
// job to the follower — or, when a step fails, fails the job and rolls
// back what the steps made.
type starter struct {
	cfg      Config
	log      *slog.Logger
	owner    string
	life     *group
	store    delegate.Store
	ref      *backendRef
	jobs     *jobWriter
	progress *progressWriter
	runs     registry
	tokens   tokenIndexer      // the callbacks' index of tokens
	kept     keptSandboxes     // the keeper: the commands run in kept sandboxes
	ws       workspaceImporter // the workspaces part
	cmd      commandMaker      // the command builder
	follow   runFollower       // the follower, once the command runs
	end      startFailer       // the finisher, when a step fails
}

// What the starter asks of the other parts, each given at construction.
type (
	// tokenIndexer lets callbacks made with a job's token in.
	tokenIndexer interface{ index(job *delegate.Job) }
	// keptSandboxes (the keeper): the kept sandbox a command runs in, the
	// one a persistent job makes recorded, and either told of a failure or
	// ended when the job fails to start.
	keptSandboxes interface {
		instance(ctx context.Context, id string, command bool) (*delegate.Sandbox, sandbox.Instance, error)
		kept(ctx context.Context, id string, job *delegate.Job, inst sandbox.Instance, expires time.Time) error
		failed(ctx context.Context, sb *delegate.Sandbox, err error) bool
		end(ctx context.Context, id string, state delegate.SandboxState, reason string) (*delegate.Sandbox, bool, error)
	}
	// workspaceImporter (the workspaces part): the import step, and the
	// clone of a job that failed to start.
	workspaceImporter interface {
		importWorkspace(ctx context.Context, a *attempt, step func(msg string)) error
		removeClone(id string, m delegate.Manifest)
	}
	// commandMaker (the command builder): the job's command.
	commandMaker interface {
		command(job *delegate.Job, token string, ws *delegate.Manifest, jn *jobNetwork) (sandbox.Command, error)
	}
	// runFollower (the follower) follows a job once its command runs.
	runFollower interface {
		follow(h *run, id string, sb sandbox.Instance, proc sandbox.Process, m delegate.Manifest, known *started)
	}
	// startFailer (the finisher) ends a job that failed to start, and rolls
	// its sandbox back.
	startFailer interface {
		finishAt(id string, status delegate.Status, reason string, at time.Time, stored func(*delegate.Job), facts func(*delegate.Job))
		jobEnded(j *delegate.Job)
		rollback(jobID, sandboxID string)
	}
)

// backend is the engine's backend (nil for an engine made without one that
// has not needed to open it).
func (r *starter) backend() sandbox.Backend { return r.ref.get() }

// run takes a pending job through provisioning to its end. adm is the
// room the backend reserved for it (nil: none was needed).
func (r *starter) run(id string, adm sandbox.Admission) {
	if adm != nil {
		defer adm.Release() // a no-op once Create has used it
	}
	h, ctx := r.runs.register(id)
	defer r.runs.unregister(id)

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

// claim makes a pending job this engine's, to be started now; it returns
// the callback token of a command in a kept sandbox, made here (its hash
// is recorded with the claim).
func (r *starter) claim(j *delegate.Job) (token string) {
	j.Status, j.Progress, j.Owner, j.Backend = delegate.StatusProvisioning, "provisioning sandbox", r.owner, r.backend().Name()
	j.Attempts++
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
	// scanned: the tree of the job's workspace directory as Submit
	// scanned it (nil for any other source).
	scanned *workspace.Tree
}

// runClaimed takes a job that Submit stored claimed through provisioning
// to its end.
func (r *starter) runClaimed(c claimed) {
	defer r.runs.unregister(c.job.ID)
	r.drive(c.ctx, c.h, &attempt{job: c.job, token: c.token, files: c.files, filesKnown: true, scanned: c.scanned})
}

// drive takes a claimed job through provisioning to its end.
func (r *starter) drive(ctx context.Context, h *run, a *attempt) {
	id, job := a.job.ID, a.job
	log := r.log.With("job", id)
	pctx, cancelProvision := context.WithTimeout(ctx, r.cfg.ProvisionTimeout)
	if a.token != "" {
		r.tokens.index(job)
	}
	err := r.provision(pctx, a)
	cancelProvision()
	if err != nil && r.jobs.lease.gaveUp(id) {
		// Another server holds the job now: what was made is its to
		// roll back or retry.
		log.Warn("provisioning given up: another server holds the job", "err", err)
		return
	}
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
			observed = r.end.jobEnded
		}
		r.end.finishAt(id, delegate.StatusFailed, reason, time.Now().UTC(), observed, nil)
		r.ws.removeClone(id, job.Manifest)
		switch {
		case a.attached:
			// A kept sandbox's: it stays for the next command (the job's
			// end above counts this one out), unless its machine is gone.
			if sb, gerr := r.store.GetSandboxUncounted(context.WithoutCancel(ctx), job.Manifest.Sandbox); gerr == nil {
				r.kept.failed(ctx, sb, err)
			}
		case a.kept != "":
			r.kept.end(context.WithoutCancel(ctx), a.kept, delegate.SandboxGone, "the job that made it failed to start: "+reason)
		case a.sb != nil:
			r.end.rollback(id, a.sb.ID())
		}
		if a.net != nil && !a.attached && a.kept == "" && r.cfg.Egress != nil {
			r.cfg.Egress.end(context.WithoutCancel(ctx), a.net.id)
		}
		return
	}
	log.Debug("job running", "sandbox", a.sb.ID())
	r.follow.follow(h, job.ID, a.sb, a.proc, job.Manifest, a.known())
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
	// scanned is the claimed's (importWorkspace starts from it).
	scanned *workspace.Tree
	// imported is the baseline importWorkspace stored, when small
	// enough to keep for the job's end.
	imported *delegate.JobWorkspace
}

// known is what the attempt learned, for the job's follower.
func (a *attempt) known() *started {
	return &started{job: a.job, net: a.net, workspace: a.workspace || a.job.Manifest.Workspace != nil, imported: a.imported}
}

// provisionSteps take a job from pending to running, in order. A new
// stage of provisioning (a workspace to import, an egress policy to
// install) is one more step here, not another branch of run. A step's
// error fails the job ("provisioning failed: …") and rolls the sandbox
// back.
var provisionSteps = []struct {
	name string
	do   func(*starter, context.Context, *attempt) error
}{
	{"open the job's network", (*starter).networkStep},
	{"create the sandbox", (*starter).createStep},
	{"import the workspace", (*starter).importStep},
	{"write the files", (*starter).writeFiles},
	{"issue the callback token", (*starter).issueToken},
	{"start the command", (*starter).startCommand},
}

// attachSteps take a command in a kept sandbox (manifest.sandbox) from
// pending to running: the sandbox is there already.
var attachSteps = []struct {
	name string
	do   func(*starter, context.Context, *attempt) error
}{
	{"attach to the kept sandbox", (*starter).attachStep},
	{"write the files", (*starter).writeFiles},
	{"start the command", (*starter).startCommand},
}

// provision runs the provisioning steps.
func (r *starter) provision(ctx context.Context, a *attempt) error {
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
func (r *starter) attachStep(ctx context.Context, a *attempt) error {
	sb, inst, err := r.kept.instance(ctx, a.job.Manifest.Sandbox, true)
	if err != nil {
		return err
	}
	a.sb, a.attached = inst, true
	if made := makerOf(ctx, r.store, sb); made != "" {
		mm, err := r.store.JobManifest(ctx, made)
		if err == nil {
			a.maker = &mm
		}
		a.workspace = err != nil || mm.Workspace != nil
	}
	return r.attachNetwork(ctx, a, sb)
}

// createStep creates the sandbox and records it on the job.
func (r *starter) createStep(ctx context.Context, a *attempt) error {
	spec, err := sandboxSpec(a.job)
	if err != nil {
		return err
	}
	spec.Admission, spec.Progress, spec.Egress = a.adm, r.stepper(ctx, a.job.ID), a.net.spec()
	if len(spec.Caches) > 0 {
		limit, err := cacheLimit(ctx, r.store, r.cfg.Quotas, a.job.Principal)
		if err != nil {
			r.log.Warn("the room of a job's caches", "job", a.job.ID, "principal", a.job.Principal, "err", err)
		}
		for i := range spec.Caches {
			spec.Caches[i].Limit = limit
		}
	}
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
	if err := r.kept.kept(ctx, keptID, a.job, sb, spec.Expires); err != nil {
		return fmt.Errorf("record the kept sandbox: %w", err)
	}
	a.kept = keptID
	return nil
}

// importStep copies the job's workspace source into its sandbox (the
// workspaces part), its steps said as provisioning steps.
func (r *starter) importStep(ctx context.Context, a *attempt) error {
	return r.ws.importWorkspace(ctx, a, func(msg string) { r.step(ctx, a, msg) })
}

// writeFiles writes the manifest's files into the sandbox. They are kept
// apart from the job in the store: read only here, unless Submit handed
// them to the run it started.
func (r *starter) writeFiles(ctx context.Context, a *attempt) error {
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
func (r *starter) issueToken(ctx context.Context, a *attempt) error {
	token, tokenHash := newToken()
	withToken, err := r.jobs.update(ctx, a.job.ID, func(j *delegate.Job) error {
		j.TokenHash = tokenHash
		return nil
	})
	if err != nil {
		return err
	}
	r.tokens.index(withToken)
	a.token = token
	return nil
}

// startCommand starts the job's command and records the job as running.
func (r *starter) startCommand(ctx context.Context, a *attempt) error {
	ws := &a.job.Manifest
	if a.attached {
		ws = a.maker
	}
	cmd, err := r.cmd.command(a.job, a.token, ws, a.net)
	if err != nil {
		return err
	}
	// Recorded before the command starts, where servers share the store:
	// a job caught provisioning without one provably never ran, and may
	// be provisioned again by another server.
	if r.jobs.lease != nil {
		if err := r.recordStart(ctx, a.job.ID); err != nil {
			return err
		}
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
		j.LastHeartbeat = r.jobs.lease.wall()
		return nil
	})
	if err != nil {
		proc.Kill(context.WithoutCancel(ctx))
		return err
	}
	a.job, a.proc = running, proc
	return nil
}

// stepper reports a backend's provisioning steps as the job's progress,
// and as entries of its timeline (statusMode detailed and streaming), so
// that where a slow start spent its time (a clone, a boot, the guest
// agent) shows afterwards too.
func (r *starter) stepper(ctx context.Context, id string) func(string) {
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
		spec.Caches = append(spec.Caches, sandbox.Cache{Name: c, Key: CacheKey(job.Principal, job.Manifest.Workspace), Owner: job.Principal})
	}
	return spec, nil
}

// step says what provisioning does now: the job's progress, and an entry
// of its timeline (statusMode detailed and streaming), once (stepper
// writes both).
func (r *starter) step(ctx context.Context, a *attempt, msg string) {
	r.stepper(ctx, a.job.ID)(msg)
}

// createSandbox is backend.Create, timed for the observer.
func (r *starter) createSandbox(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	began := time.Now()
	sb, err := r.backend().Create(ctx, spec)
	if err == nil && r.cfg.Observer != nil {
		r.cfg.Observer.SandboxStarted(r.backend().Name(), time.Since(began))
	}
	return sb, err
}

// networkStep opens the job's network, before its sandbox: the sandbox is
// made with it.
func (r *starter) networkStep(ctx context.Context, a *attempt) error {
	m := a.job.Manifest
	jn, err := openNetwork(ctx, r.store, r.cfg, r.backend(), a.job.ID, m.Network, m.Secrets, time.Duration(m.TimeoutSeconds())*time.Second)
	if err != nil {
		return fmt.Errorf("the job's network: %w", err)
	}
	a.net = jn
	return nil
}

// attachNetwork finds the network of the kept sandbox a command runs in,
// for its environment.
func (r *starter) attachNetwork(ctx context.Context, a *attempt, sb *delegate.Sandbox) error {
	if !sb.Network.Reaches() {
		return nil // none was made (openNetwork): no read on a command's way
	}
	n, err := r.store.GetNetwork(ctx, sandboxNetworkID(sb))
	if errors.Is(err, delegate.ErrNotFound) {
		return nil // its network is not the proxy's
	}
	if err != nil {
		return err
	}
	a.net = &jobNetwork{id: n.ID, token: n.Token, inject: n.Inject}
	return nil
}
