package engine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

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
		if rule := delegate.TextRule(k, 200); rule != "" {
			return nil, &delegate.FieldError{Field: "idempotency_key", Rule: rule}
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
		if holder, refusal := keptElsewhere(ctx, e.leases, sb, "manifest.sandbox"); refusal != nil {
			if holder == nil {
				return nil, refusal
			}
			// Run by the server that holds it: forwarded there, as
			// submitted (that server applies its defaults).
			return e.forwarder.send(ctx, *holder, m, opts, refusal)
		}
		// Refused now rather than accepted and failed when it starts
		// (its start checks again: submissions may race).
		if sb.Running >= delegate.MaxSandboxCommands {
			return nil, fmt.Errorf("manifest.sandbox: sandbox %s runs %d commands not ended (queued or running), the most one sandbox runs at once "+
				"(%d, a fixed limit, not a setting): wait for one to end (wait_job), or open another sandbox: %w",
				sb.ID, sb.Running, delegate.MaxSandboxCommands, delegate.ErrConflict)
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
	scanned, err := e.checkWorkspace(ctx, &m, backend.Capabilities(), backend.Name())
	if err != nil {
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
	// The principal's quotas are decided where the job is stored, in
	// the transaction that inserts it: two submissions at once cannot
	// both pass on the same use.
	need := quotaNeeds{job: true, sandbox: kept == nil && m.Lifecycle == delegate.LifecyclePersistent}
	if kept == nil && m.Resources != nil {
		need.res = *m.Resources
	}
	admit := admitter(ctx, e.cfg.Quotas, need)
	now := time.Now().UTC()
	id := newJobID()
	if fwd := forwardedOf(ctx); fwd != nil {
		id = fwd.JobID // the sender's choice: it finds the job by it if this answer is lost
	}
	job := &delegate.Job{
		ID:        id,
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
		h, rctx := e.runs.register(job.ID)
		direct = &claimed{h: h, ctx: rctx, token: e.starter.claim(job)}
	}
	if err := e.leases.admit(); err != nil {
		if direct != nil {
			e.runs.unregister(job.ID)
			e.sched.releaseSlot()
		}
		return nil, err
	}
	e.leases.hold(job.ID, job.Epoch)
	detail := string(m.AgentType)
	if kept != nil {
		detail += " in sandbox " + kept.ID
	}
	if fwd := forwardedOf(ctx); fwd != nil {
		detail += ", forwarded by server " + fwd.From
	}
	// Stored with the job where the store can (one commit, not two).
	entry := e.audit.entry(ctx, delegate.AuditSubmitted, job.ID, detail)
	audited, inOne := e.store.(delegate.AuditedJobStore)
	if inOne {
		err = audited.CreateJobAudited(ctx, job, admit, entry)
	} else {
		err = e.store.CreateJobAdmitted(ctx, job, admit)
	}
	if err != nil {
		e.leases.release(job)
		if direct != nil {
			e.runs.unregister(job.ID)
			e.sched.releaseSlot()
		}
		if opts.IdempotencyKey != "" {
			// A concurrent submission with the same key won the race.
			if first, ferr := e.store.JobByIdempotencyKey(ctx, opts.IdempotencyKey); ferr == nil {
				return sameRequest(first, opts.IdempotencyKey, digest)
			}
		}
		if qe := (*delegate.QuotaError)(nil); errors.As(err, &qe) {
			return nil, err // it says what to do
		}
		return nil, fmt.Errorf("submit: %w", e.space.explain(err))
	}
	e.log.Debug("job submitted", "job", job.ID, "agent", m.AgentType)
	if !inOne {
		e.audit.add(ctx, entry)
	}
	if direct == nil {
		e.sched.enqueue(job.ID)
		return job, nil
	}
	// The run gets its own copy, as stored (files apart).
	direct.job = job.Clone()
	direct.files, direct.job.Manifest.Files = direct.job.Manifest.Files, nil
	// Its import starts from the tree just scanned (Rescan checks that
	// a scan now would find the same); a queued job's scans again.
	direct.scanned = scanned
	e.sched.startClaimed(*direct)
	return job, nil
}

// OpenSandbox opens a kept sandbox (keeper.OpenSandbox), unless the data
// dir is below its floor of free space; a sandbox that could not be made
// for lack of room says so.
func (e *Engine) OpenSandbox(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
	return e.forks.opener.open(ctx, spec, forkOf{})
}

// opener admits and opens a kept sandbox, empty or a fork: every one
// goes through it (the floor of free space, the principal's quota, the
// server's maximum, the audit trail).
type opener struct {
	keeper *keeper
	space  space
	store  delegate.Store
	quotas Quotas
	audit  auditor
}

func (o *opener) open(ctx context.Context, spec delegate.SandboxSpec, from forkOf) (*delegate.Sandbox, error) {
	if err := o.space.check(); err != nil {
		return nil, err
	}
	need := quotaNeeds{sandbox: true}
	if spec.Resources != nil {
		need.res = *spec.Resources
	}
	// Checked now, before a machine is made; decided again where the
	// sandbox is stored (another of the principal's may be on its way).
	if err := checkQuota(ctx, o.store, o.quotas, need); err != nil {
		return nil, err
	}
	sb, err := o.keeper.open(ctx, spec, from, admitter(ctx, o.quotas, need))
	if err == nil {
		o.audit.Record(ctx, delegate.AuditOpened, sb.ID, "")
	}
	return sb, o.space.explain(err)
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

func newJobID() string {
	var b [10]byte
	rand.Read(b[:])
	return "job-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// checkRoot checks that a local git source lies under an allowed root,
// as its real path (a link out of the root is outside it).
func (e *Engine) checkRoot(field, dir string) error {
	if len(e.cfg.WorkspaceRoots) == 0 {
		return &delegate.FieldError{Field: field, Rule: "local repositories are not allowed on this server: the operator allows them with DELEGATE_WORKSPACE_ROOTS (a list of directories); or give an https URL"}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return &delegate.FieldError{Field: field, Rule: fmt.Sprintf("cannot be read: %v", err)}
	}
	if rootOf(e.cfg.WorkspaceRoots, dir) == "" || rootOf(e.cfg.WorkspaceRoots, real) == "" {
		return &delegate.FieldError{Field: field, Rule: fmt.Sprintf("%s is not under an allowed root (DELEGATE_WORKSPACE_ROOTS: %s)", dir, strings.Join(e.cfg.WorkspaceRoots, ", "))}
	}
	return nil
}

// checkWorkspace checks a submission's workspace source and caches (m has
// its defaults): the source is scanned (or the git ref asked for), so
// that what cannot be copied is a field error now. It returns a
// directory's tree, for an import that starts at once.
func (e *Engine) checkWorkspace(ctx context.Context, m *delegate.Manifest, caps sandbox.Capabilities, backend string) (*workspace.Tree, error) {
	w := m.Workspace
	if w == nil {
		return nil, nil
	}
	if !caps.Workspaces {
		return nil, &delegate.FieldError{Field: "manifest.workspace", Rule: fmt.Sprintf("the %s backend cannot copy a workspace in", backend)}
	}
	if len(m.Caches) > 0 && !caps.Caches {
		return nil, &delegate.FieldError{Field: "manifest.caches", Rule: fmt.Sprintf("caches are not kept on the %s backend: leave it out", backend)}
	}
	maxBytes, maxFiles, why := e.cfg.workspaceLimits(m)
	if w.Git != "" {
		if workspace.IsLocal(w.Git) {
			if err := e.checkRoot("manifest.workspace.git", w.Git); err != nil {
				return nil, err
			}
		}
		_, _, err := workspace.CheckRef(ctx, workspace.CloneOptions{URL: w.Git, Ref: w.Ref, Dial: e.cfg.gitDial()})
		return nil, gitErr(err)
	}
	root := rootOf(e.cfg.WorkspaceRoots, w.Dir)
	if root == "" {
		if len(e.cfg.WorkspaceRoots) == 0 {
			return nil, &delegate.FieldError{Field: "manifest.workspace.dir", Rule: "directories are not allowed on this server: the operator allows them with DELEGATE_WORKSPACE_ROOTS (a list of directories)"}
		}
		return nil, &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("%s is not under an allowed root (DELEGATE_WORKSPACE_ROOTS: %s)", w.Dir, strings.Join(e.cfg.WorkspaceRoots, ", "))}
	}
	tree, err := workspace.Scan(ctx, w.Dir, workspace.ScanOptions{IncludeIgnored: w.IncludeIgnored, MaxBytes: maxBytes, MaxFiles: maxFiles, Within: root})
	if err != nil {
		return nil, dirErr(err, why)
	}
	// The manifest's files are the job's input, not the project's: they
	// must not shadow a file of it (and never show as changes).
	entries := make(map[string]bool, len(tree.Entries))
	for _, en := range tree.Entries {
		entries[en.Path] = true
	}
	for i, f := range m.Files {
		if p, err := delegate.WorkspacePath(f.Path); err == nil && entries[strings.TrimPrefix(p, delegate.Workspace+"/")] {
			return nil, &delegate.FieldError{Field: fmt.Sprintf("manifest.files[%d].path", i), Rule: fmt.Sprintf("%s is also in the workspace source: change it there, or name another path", f.Path)}
		}
	}
	return tree, nil
}
