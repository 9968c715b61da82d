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
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// keeper is the part that keeps sandboxes an agent works in (issue 17):
// it opens them, attaches the commands run in them (each a job), finds
// their machines (resumed if paused) for the commands and the files
// (sandbox_files.go), releases them, and ends them. Every fact a restart
// needs is in the store; what this engine knows of their machines, and
// the per-sandbox locks, are in machines (machines.go), which it shares
// with the timers (sandbox_timers.go).
type keeper struct {
	audit    auditor
	cfg      Config
	log      *slog.Logger
	owner    string
	all      delegate.Store // the networks of its sandboxes are in it too
	sbs      delegate.SandboxStore
	ref      *backendRef
	jobs     *jobWriter
	machines *machines
}

func newKeeper(cfg Config, log *slog.Logger, owner string, store delegate.Store, ref *backendRef, jobs *jobWriter, ms *machines) *keeper {
	return &keeper{audit: auditor{store: store, log: log}, cfg: cfg, log: log, owner: owner, all: store, sbs: store, ref: ref, jobs: jobs, machines: ms}
}

func newSandboxID() string {
	var b [10]byte
	rand.Read(b[:])
	return "sbx-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// backend returns the backend that keeps sandboxes, or why there is none.
func (k *keeper) backend() (sandbox.Backend, error) {
	b := k.ref.get()
	if b == nil {
		return nil, errNoBackend
	}
	if !b.Capabilities().MultiExec {
		return nil, fmt.Errorf("the %s backend keeps no sandbox (it runs one command per sandbox): %w", b.Name(), delegate.ErrInvalid)
	}
	return b, nil
}

// endedError: the sandbox asked for has ended. It is ErrTerminal to
// errors.Is (the kind adapters report), without that error's words,
// which are a job's.
type endedError struct{ msg string }

func (e *endedError) Error() string { return e.msg }
func (e *endedError) Unwrap() error { return delegate.ErrTerminal }

// checkTimeouts refuses a spec asking for longer timers than the
// server's settings, which are the longest a sandbox may have.
func (k *keeper) checkTimeouts(spec delegate.SandboxSpec) error {
	for _, t := range []struct {
		field, setting string
		asked          int
		most           time.Duration
	}{
		{"idle_timeout", "DELEGATE_SANDBOX_IDLE", spec.IdleTimeout, k.cfg.SandboxIdle},
		{"pause_timeout", "DELEGATE_SANDBOX_PAUSE", spec.PauseTimeout, k.cfg.SandboxPause},
		{"lifetime", "DELEGATE_SANDBOX_LIFETIME", spec.Lifetime, k.cfg.SandboxLifetime},
	} {
		if most := int(t.most / time.Second); t.asked > most {
			return &delegate.FieldError{Field: t.field, Rule: fmt.Sprintf("must be at most %d seconds (%s; got %d)", most, t.setting, t.asked)}
		}
	}
	return nil
}

// timeouts are a new sandbox's, from its spec (seconds) or the server's
// defaults.
func (k *keeper) timeouts(spec delegate.SandboxSpec) (idle, pause, lifetime time.Duration) {
	idle, pause, lifetime = k.cfg.SandboxIdle, k.cfg.SandboxPause, k.cfg.SandboxLifetime
	if spec.IdleTimeout > 0 {
		idle = time.Duration(spec.IdleTimeout) * time.Second
	}
	if spec.PauseTimeout > 0 {
		pause = time.Duration(spec.PauseTimeout) * time.Second
	}
	if spec.Lifetime > 0 {
		lifetime = time.Duration(spec.Lifetime) * time.Second
	}
	return idle, pause, lifetime
}

// room refuses a new kept sandbox past the maximum, naming the setting
// and the oldest idle ones.
func (k *keeper) room(ctx context.Context) error { return k.roomFor(ctx, 1) }

// roomFor is room for n sandboxes at once (a fork of n).
func (k *keeper) roomFor(ctx context.Context, n int) error {
	// The server's maximum counts everyone's, whoever asks.
	live, err := k.sbs.ListSandboxes(delegate.AsServer(ctx), true, k.cfg.MaxSandboxes+1)
	if err != nil {
		return err
	}
	if len(live)+n <= k.cfg.MaxSandboxes {
		return nil
	}
	if n > 1 {
		return fmt.Errorf("%d sandboxes are kept and %d more were asked for, past the most this server keeps (DELEGATE_MAX_SANDBOXES=%d): release some first, or ask for fewer: %w",
			len(live), n, k.cfg.MaxSandboxes, delegate.ErrConflict)
	}
	var idle []string
	for i := len(live) - 1; i >= 0 && len(idle) < 3; i-- {
		// Only the asker's own are named (another's ids are not theirs to see).
		if r := delegate.ReaderOf(ctx); live[i].State != delegate.SandboxRunning && (r == "" || live[i].Principal == r) {
			idle = append(idle, fmt.Sprintf("%s (%s since %s)", live[i].ID, live[i].State, live[i].LastUsedAt.Format(time.RFC3339)))
		}
	}
	msg := fmt.Sprintf("%d sandboxes are kept, the most this server keeps (DELEGATE_MAX_SANDBOXES=%d): release one first", len(live), k.cfg.MaxSandboxes)
	if len(idle) > 0 {
		msg += "; the oldest not running: " + strings.Join(idle, ", ")
	}
	return fmt.Errorf("%s: %w", msg, delegate.ErrConflict)
}

// forkOf is what a sandbox being opened starts from: nothing, or a
// checkpoint (a fork: forks.go), with the secrets its network is given
// anew (the source's).
type forkOf struct {
	checkpoint *delegate.Checkpoint
	secrets    []string
}

// open makes a kept sandbox, empty or a fork: one path for both, so that
// a fork gets what any sandbox opened gets afresh. admit (nil: none) is
// its principal's quotas, decided where it is stored: one that loses a
// race with another of the principal's is destroyed, refused.
func (k *keeper) open(ctx context.Context, spec delegate.SandboxSpec, from forkOf, admit delegate.Admit) (*delegate.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := k.checkTimeouts(spec); err != nil {
		return nil, err
	}
	b, err := k.backend()
	if err != nil {
		return nil, err
	}
	if err := k.room(ctx); err != nil {
		return nil, err
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Resources: spec.Resources, VMTemplate: spec.VMTemplate, Network: spec.Network}
	chosen := m.VMTemplate != ""
	m.ApplyDefaults(k.cfg.Defaults)
	if err := k.cfg.Maxima.check(&m); err != nil {
		return nil, err
	}
	if m.Network.Mode == delegate.NetworkEgress && !b.Capabilities().NetworkEgress {
		return nil, &delegate.FieldError{Field: "network", Rule: fmt.Sprintf("egress is not available on the %s backend here (set network: none)", b.Name())}
	}
	if err := checkNetwork(b, m.Network, nil, nil, "network"); err != nil {
		return nil, err
	}
	if err := checkTemplate(ctx, b, m.VMTemplate, chosen); err != nil {
		return nil, err
	}
	idle, pause, lifetime := k.timeouts(spec)
	now := time.Now().UTC()
	sb := &delegate.Sandbox{ID: newSandboxID(), State: delegate.SandboxIdle, Backend: b.Name(), Owner: k.owner,
		Resources: *m.Resources, Template: m.VMTemplate, Network: m.Network,
		CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(lifetime), IdleTimeout: idle, PauseTimeout: pause}
	s, err := sandboxSpec(&delegate.Job{ID: sb.ID, Manifest: m})
	if err != nil {
		return nil, err
	}
	s.MultiExec, s.Expires = true, sb.ExpiresAt
	if from.checkpoint != nil {
		s.From, sb.From = from.checkpoint.Instance, from.checkpoint.ID
	}
	defer k.machines.opening(sb.ID)()
	// Its network, through the egress proxy where the backend has one:
	// its commands share it (and its log), until the sandbox goes.
	jn, err := openNetwork(ctx, k.all, k.cfg, b, sb.ID, m.Network, from.secrets, lifetime)
	if err != nil {
		return nil, fmt.Errorf("open a sandbox: its network: %w", err)
	}
	s.Egress = jn.spec()
	inst, err := b.Create(ctx, s)
	if err != nil {
		if jn != nil {
			k.cfg.Egress.end(context.WithoutCancel(ctx), jn.id)
		}
		return nil, fmt.Errorf("open a sandbox: %w", err)
	}
	sb.Instance = inst.ID()
	if err := k.all.CreateSandboxAdmitted(ctx, sb, admit); err != nil {
		b.Destroy(context.WithoutCancel(ctx), inst.ID())
		if jn != nil {
			k.cfg.Egress.end(context.WithoutCancel(ctx), jn.id)
		}
		return nil, err
	}
	k.machines.remember(sb.ID, inst)
	k.log.Info("sandbox opened", "sandbox", sb.ID, "instance", sb.Instance, "lifetime", lifetime)
	k.jobs.wake()
	return sb, nil
}

// kept records sandbox id, which a persistent job made (and names): it
// runs the job's command now.
func (k *keeper) kept(ctx context.Context, id string, job *delegate.Job, inst sandbox.Instance, expires time.Time) error {
	idle, pause, _ := k.timeouts(delegate.SandboxSpec{})
	now := time.Now().UTC()
	m := job.Manifest
	sb := &delegate.Sandbox{ID: id, State: delegate.SandboxRunning, Backend: k.ref.get().Name(), Instance: inst.ID(),
		JobID: job.ID, Owner: k.owner, Principal: job.Principal, Resources: *m.Resources, Template: m.VMTemplate, Network: m.Network,
		CreatedAt: now, LastUsedAt: now, ExpiresAt: expires, IdleTimeout: idle, PauseTimeout: pause}
	if err := k.sbs.CreateSandbox(ctx, sb); err != nil {
		return err
	}
	k.machines.remember(sb.ID, inst)
	return nil
}

// GetSandbox describes one.
func (k *keeper) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	return k.sbs.GetSandbox(ctx, id)
}

// SetSandboxTimers implements delegate.SandboxTimers: a shorter
// lifetime moves ExpiresAt earlier (never later than the one its
// machine was made with, which ends its processes by itself).
func (k *keeper) SetSandboxTimers(ctx context.Context, id string, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
	if spec.Resources != nil || spec.VMTemplate != "" || !spec.Network.IsZero() {
		return nil, &delegate.FieldError{Field: "spec", Rule: "only idle_timeout, pause_timeout and lifetime can be set on a sandbox that is there"}
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := k.checkTimeouts(spec); err != nil {
		return nil, err
	}
	if _, err := k.GetSandbox(ctx, id); err != nil {
		return nil, err // also another's, which the caller may not see
	}
	return k.sbs.UpdateSandbox(ctx, id, func(sb *delegate.Sandbox) error {
		if spec.IdleTimeout > 0 {
			sb.IdleTimeout = time.Duration(spec.IdleTimeout) * time.Second
		}
		if spec.PauseTimeout > 0 {
			sb.PauseTimeout = time.Duration(spec.PauseTimeout) * time.Second
		}
		if spec.Lifetime > 0 {
			if end := sb.CreatedAt.Add(time.Duration(spec.Lifetime) * time.Second); end.Before(sb.ExpiresAt) {
				sb.ExpiresAt = end
			}
		}
		return nil
	})
}

// commandSandbox describes one for a command submitted to it (without
// its count of commands, which reads each).
func (k *keeper) commandSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	return k.sbs.GetSandboxUncounted(ctx, id)
}

// ListSandboxes lists them, newest first.
func (k *keeper) ListSandboxes(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
	if opts.Limit < 0 || opts.Limit > delegate.MaxPageSize {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxPageSize, opts.Limit)}
	}
	return k.sbs.ListSandboxes(ctx, !opts.All, opts.Limit)
}

// ReleaseSandbox destroys one on request.
func (k *keeper) ReleaseSandbox(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
	sb, err := k.GetSandbox(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if sb.State.Terminal() {
		return sb, false, nil
	}
	ended, released, err := k.end(ctx, id, delegate.SandboxReleased, "released on request")
	if err == nil && released {
		k.audit.Record(ctx, delegate.AuditReleased, id, "")
	}
	if err == nil {
		if counted, gerr := k.sbs.GetSandbox(ctx, id); gerr == nil {
			ended = counted // with its count of commands, which end's write leaves out
		}
	}
	return ended, released, err
}

// end destroys a sandbox's machine and records why (released or gone).
// What runs in it dies with it; its jobs end as their processes do.
func (k *keeper) end(ctx context.Context, id string, state delegate.SandboxState, reason string) (*delegate.Sandbox, bool, error) {
	unlock := k.machines.lock(id)
	defer unlock()
	k.machines.forget(id)
	sb, err := k.sbs.UpdateSandbox(ctx, id, func(sb *delegate.Sandbox) error {
		sb.State, sb.Reason, sb.EndedAt = state, reason, time.Now().UTC()
		// Its checkpoints go with its machine (a fork keeps what it
		// stands on).
		sb.Checkpoints = nil
		return nil
	})
	if errors.Is(err, delegate.ErrTerminal) {
		return sb, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	// Recorded first: a destroy that fails now is the sweep's to finish
	// (the instance of a sandbox that has ended belongs to nobody).
	if b := k.ref.get(); b != nil {
		if err := b.Destroy(context.WithoutCancel(ctx), sb.Instance); err != nil {
			k.log.Warn("destroy a sandbox", "sandbox", id, "instance", sb.Instance, "err", err)
		}
	}
	if k.cfg.Egress != nil {
		k.cfg.Egress.end(context.WithoutCancel(ctx), sandboxNetworkID(sb))
	}
	if sb.JobID != "" {
		// The job that made it keeps it no more.
		k.jobs.update(context.WithoutCancel(ctx), sb.JobID, func(j *delegate.Job) error {
			if j.SandboxID == sb.Instance {
				j.SandboxID, j.ExecID = "", ""
			}
			return nil
		})
		// Nor the clone of its git source, which its commands' changes
		// were read against.
		os.RemoveAll(filepath.Join(k.cfg.CloneDir, sb.JobID))
	}
	k.log.Info("sandbox ended", "sandbox", id, "state", state, "reason", reason)
	k.jobs.wake()
	return sb, true, nil
}

// instance finds a live sandbox's machine, resumed if it was paused, and
// marks it used: what every command and file call goes through, so that
// using a paused sandbox is never an error.
func (k *keeper) instance(ctx context.Context, id string, command bool) (*delegate.Sandbox, sandbox.Instance, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, nil, err
	}
	b, err := k.backend()
	if err != nil {
		return nil, nil, err
	}
	unlock := k.machines.lock(id)
	defer unlock()
	if sb, inst := k.use(ctx, b, id, command); inst != nil {
		return sb, inst, nil
	}
	sb, err := k.sbs.GetSandboxUncounted(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State.Terminal() {
		return sb, nil, &endedError{fmt.Sprintf("sandbox %s is %s (%s): open a new one", id, sb.State, sb.Reason)}
	}
	if sb.Backend != b.Name() {
		return sb, nil, fmt.Errorf("sandbox %s is on the %s backend, this server runs %s: %w", id, sb.Backend, b.Name(), delegate.ErrInvalid)
	}
	if command && sb.Running > delegate.MaxSandboxCommands { // this command counts there already
		return sb, nil, fmt.Errorf("sandbox %s runs %d commands, the most one sandbox runs at once: wait for one to end: %w", id, sb.Running-1, delegate.ErrConflict)
	}
	inst := k.machines.known(sb)
	if inst == nil {
		// A local sandbox of another host's server is not this host's to
		// look for (nor to find gone): refused, naming its server. (Only
		// a command is forwarded there, by Submit.)
		if _, refusal := keptElsewhere(ctx, k.jobs.lease, sb, "sandbox_id"); refusal != nil {
			return sb, nil, refusal
		}
		inst, err = b.Recover(ctx, sb.Instance)
		if errors.Is(err, sandbox.ErrGone) {
			k.gone(context.WithoutCancel(ctx), sb, "its machine is gone: "+err.Error())
			return sb, nil, &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", id)}
		}
		if err != nil {
			return sb, nil, err
		}
		k.machines.remember(id, inst)
	}
	if sb.State == delegate.SandboxPaused {
		pz, ok := inst.(sandbox.Pauser)
		if !ok {
			return sb, nil, fmt.Errorf("sandbox %s is paused and its backend cannot resume it", id)
		}
		if err := pz.Resume(ctx); err != nil {
			return sb, nil, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		k.log.Info("sandbox resumed", "sandbox", id)
	}
	sb, err = k.sbs.UpdateSandbox(ctx, id, func(sb *delegate.Sandbox) error {
		if sb.State == delegate.SandboxPaused {
			sb.State, sb.PausedAt = delegate.SandboxIdle, time.Time{}
		}
		sb.LastUsedAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return sb, nil, err
	}
	k.jobs.wake()
	return sb, inst, nil
}

// errNotPlain turns use away from a sandbox that instance must look at
// first.
var errNotPlain = errors.New("not a plain use")

// use is instance's usual case: the sandbox is live, not paused, on this
// backend, with room for a command, and its machine known to this
// engine. A command costs it no write: its job, claimed for the sandbox
// before it comes here, is what makes the sandbox running (and counts
// in Running: room is for the others); a file call restarts its idle
// time, in one write. It returns a nil instance (nothing written) for
// anything else. The caller holds the sandbox's lock.
func (k *keeper) use(ctx context.Context, b sandbox.Backend, id string, command bool) (*delegate.Sandbox, sandbox.Instance) {
	plain := func(sb *delegate.Sandbox) sandbox.Instance {
		if sb.State.Terminal() || sb.State == delegate.SandboxPaused || sb.Backend != b.Name() ||
			(command && sb.Running > delegate.MaxSandboxCommands) {
			return nil
		}
		return k.machines.known(sb)
	}
	if command {
		sb, err := k.sbs.GetSandboxUncounted(ctx, id)
		if err != nil {
			return nil, nil
		}
		if inst := plain(sb); inst != nil {
			return sb, inst
		}
		return nil, nil
	}
	var inst sandbox.Instance
	sb, err := k.sbs.UpdateSandbox(ctx, id, func(sb *delegate.Sandbox) error {
		if inst = plain(sb); inst == nil {
			return errNotPlain
		}
		sb.LastUsedAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return nil, nil
	}
	k.jobs.wake()
	return sb, inst
}

// gone records that a sandbox's machine died by itself.
func (k *keeper) gone(ctx context.Context, sb *delegate.Sandbox, reason string) {
	k.machines.forget(sb.ID)
	if _, err := k.sbs.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
		s.State, s.Reason, s.EndedAt = delegate.SandboxGone, reason, time.Now().UTC()
		return nil
	}); err == nil {
		k.log.Warn("sandbox gone", "sandbox", sb.ID, "reason", reason)
		k.jobs.wake()
	}
}

// failed hears that a call on a sandbox's machine failed: what is known
// of the machine is dropped, and a machine that is gone makes the
// sandbox gone (true).
func (k *keeper) failed(ctx context.Context, sb *delegate.Sandbox, err error) bool {
	k.machines.forget(sb.ID)
	if !errors.Is(err, sandbox.ErrGone) {
		return false
	}
	k.gone(context.WithoutCancel(ctx), sb, "its machine is gone: "+err.Error())
	return true
}

// keeps reports whether an instance is the machine of a live sandbox
// (the sweep leaves those alone).
func (k *keeper) keeps(ctx context.Context, backend string, info sandbox.Info) bool {
	if k.machines.isOpening(info.JobID) {
		// Made for a sandbox being opened, which records its machine
		// once Create returns (on Proxmox, after a clone and a boot).
		return true
	}
	sb, err := k.sbs.SandboxOfInstance(ctx, backend, info.ID)
	return err == nil && !sb.State.Terminal()
}
