package engine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// keeper is the part that keeps sandboxes an agent works in (issue 17):
// it opens them, attaches the commands run in them (each a job), serves
// their files, keeps their timers (idle: paused; paused too long, or
// their lifetime over: destroyed), releases them, and adopts those of an
// engine that died. Every fact a restart needs is in the store, timers
// as times; a per-sandbox lock keeps one change of a sandbox's machine
// (resume, pause, destroy) at a time.
type keeper struct {
	cfg   Config
	log   *slog.Logger
	owner string
	all   delegate.Store // the networks of its sandboxes are in it too
	sbs   delegate.SandboxStore
	ref   *backendRef
	jobs  *jobWriter

	mu    sync.Mutex
	locks map[string]*sync.Mutex // by sandbox id
	// insts are the machines this engine has found (Recover) or made, by
	// sandbox id: a command or file call on a sandbox in use needs no
	// Recover (on Proxmox, a config read) each time. An entry goes when
	// the sandbox ends or a call on it fails.
	insts map[string]sandbox.Instance
	// opening are the sandboxes whose machine is being made: the sweep
	// spares a machine made for one of them.
	opening map[string]struct{}
}

var _ delegate.SandboxService = (*keeper)(nil)

func newKeeper(cfg Config, log *slog.Logger, owner string, store delegate.Store, ref *backendRef, jobs *jobWriter) *keeper {
	return &keeper{cfg: cfg, log: log, owner: owner, all: store, sbs: store, ref: ref, jobs: jobs, locks: map[string]*sync.Mutex{},
		insts: map[string]sandbox.Instance{}, opening: map[string]struct{}{}}
}

// known returns the machine of a sandbox found before, if it is still
// the one the store names.
func (k *keeper) known(sb *delegate.Sandbox) sandbox.Instance {
	k.mu.Lock()
	defer k.mu.Unlock()
	if inst := k.insts[sb.ID]; inst != nil && inst.ID() == sb.Instance {
		return inst
	}
	return nil
}

func (k *keeper) remember(id string, inst sandbox.Instance) {
	k.mu.Lock()
	k.insts[id] = inst
	k.mu.Unlock()
}

// forget drops what is known of a sandbox's machine (it ended, or a call
// on it failed: the next use finds it again, and finds it gone if it is).
func (k *keeper) forget(id string) {
	k.mu.Lock()
	delete(k.insts, id)
	k.mu.Unlock()
}

// lock serializes the changes of one sandbox's machine.
func (k *keeper) lock(id string) func() {
	k.mu.Lock()
	l := k.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		k.locks[id] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
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
func (k *keeper) room(ctx context.Context) error {
	live, err := k.sbs.ListSandboxes(ctx, true, k.cfg.MaxSandboxes+1)
	if err != nil {
		return err
	}
	if len(live) < k.cfg.MaxSandboxes {
		return nil
	}
	var idle []string
	for i := len(live) - 1; i >= 0 && len(idle) < 3; i-- {
		if live[i].State != delegate.SandboxRunning {
			idle = append(idle, fmt.Sprintf("%s (%s since %s)", live[i].ID, live[i].State, live[i].LastUsedAt.Format(time.RFC3339)))
		}
	}
	msg := fmt.Sprintf("%d sandboxes are kept, the most this server keeps (DELEGATE_MAX_SANDBOXES=%d): release one first", len(live), k.cfg.MaxSandboxes)
	if len(idle) > 0 {
		msg += "; the oldest not running: " + strings.Join(idle, ", ")
	}
	return fmt.Errorf("%s: %w", msg, delegate.ErrConflict)
}

// OpenSandbox makes a kept sandbox with no command run yet.
func (k *keeper) OpenSandbox(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
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
	k.mu.Lock()
	k.opening[sb.ID] = struct{}{}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.opening, sb.ID)
		k.mu.Unlock()
	}()
	// Its network, through the egress proxy where the backend has one:
	// its commands share it (and its log), until the sandbox goes.
	jn, err := openNetwork(ctx, k.all, k.cfg, b, sb.ID, m.Network, nil, lifetime)
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
	if err := k.sbs.CreateSandbox(ctx, sb); err != nil {
		b.Destroy(context.WithoutCancel(ctx), inst.ID())
		return nil, err
	}
	k.remember(sb.ID, inst)
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
		JobID: job.ID, Owner: k.owner, Resources: *m.Resources, Template: m.VMTemplate, Network: m.Network,
		CreatedAt: now, LastUsedAt: now, ExpiresAt: expires, IdleTimeout: idle, PauseTimeout: pause}
	if err := k.sbs.CreateSandbox(ctx, sb); err != nil {
		return err
	}
	k.remember(sb.ID, inst)
	return nil
}

// GetSandbox describes one.
func (k *keeper) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	return k.sbs.GetSandbox(ctx, id)
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
	unlock := k.lock(id)
	defer unlock()
	k.forget(id)
	sb, err := k.sbs.UpdateSandbox(ctx, id, func(sb *delegate.Sandbox) error {
		sb.State, sb.Reason, sb.EndedAt = state, reason, time.Now().UTC()
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
	unlock := k.lock(id)
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
	inst := k.known(sb)
	if inst == nil {
		inst, err = b.Recover(ctx, sb.Instance)
		if errors.Is(err, sandbox.ErrGone) {
			k.gone(context.WithoutCancel(ctx), sb, "its machine is gone: "+err.Error())
			return sb, nil, &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", id)}
		}
		if err != nil {
			return sb, nil, err
		}
		k.remember(id, inst)
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
		return k.known(sb)
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
	k.forget(sb.ID)
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
	k.forget(sb.ID)
	if !errors.Is(err, sandbox.ErrGone) {
		return false
	}
	k.gone(context.WithoutCancel(ctx), sb, "its machine is gone: "+err.Error())
	return true
}

// ReadSandboxFile reads part of a file of a sandbox's workspace.
func (k *keeper) ReadSandboxFile(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
	if offset < 0 {
		return nil, &delegate.FieldError{Field: "offset", Rule: fmt.Sprintf("must be 0 or more (got %d)", offset)}
	}
	if length <= 0 || length > delegate.MaxFileRead {
		return nil, &delegate.FieldError{Field: "length", Rule: fmt.Sprintf("must be between 1 and %d bytes (got %d): read a larger file in parts, from offset", delegate.MaxFileRead, length)}
	}
	p, err := workspacePath("path", path)
	if err != nil {
		return nil, err
	}
	sb, inst, err := k.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	size := int64(-1)
	if infos, err := inst.ListFiles(ctx, sandbox.ListOptions{Dir: parentDir(p), Depth: 1}); err == nil {
		for _, f := range infos {
			if f.Path == p {
				size = f.Size
			}
		}
	}
	data, err := inst.ReadFile(ctx, p, offset, length)
	if err != nil {
		return nil, k.fileError(ctx, sb, "path", p, err)
	}
	fc := &delegate.FileContent{Data: data, Offset: offset, Size: size}
	fc.EOF = size >= 0 && offset+int64(len(data)) >= size
	if size < 0 {
		fc.EOF = int64(len(data)) < length
	}
	return fc, nil
}

// WriteSandboxFile writes a file of a sandbox's workspace.
func (k *keeper) WriteSandboxFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
	if int64(len(data)) > delegate.MaxFileBytesTotal {
		return &delegate.FieldError{Field: "content", Rule: fmt.Sprintf("must be at most %d MiB", delegate.MaxFileBytesTotal>>20)}
	}
	if mode&^fs.ModePerm != 0 {
		return &delegate.FieldError{Field: "mode", Rule: "must be permissions only, like 0644 or 0755"}
	}
	p, err := workspacePath("path", path)
	if err != nil {
		return err
	}
	sb, inst, err := k.instance(ctx, id, false)
	if err != nil {
		return err
	}
	if err := inst.WriteFile(ctx, p, data, mode); err != nil {
		return k.fileError(ctx, sb, "path", p, err)
	}
	return nil
}

// ListSandboxFiles lists a directory of a sandbox's workspace.
func (k *keeper) ListSandboxFiles(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error) {
	if opts.Depth < 0 || opts.Depth > delegate.MaxFileDepth {
		return nil, &delegate.FieldError{Field: "depth", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxFileDepth, opts.Depth)}
	}
	if opts.Limit < 0 || opts.Limit > delegate.MaxFileLimit {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxFileLimit, opts.Limit)}
	}
	dir := delegate.Workspace
	if opts.Path != "" && opts.Path != delegate.Workspace && opts.Path != "." {
		p, err := workspacePath("path", opts.Path)
		if err != nil {
			return nil, err
		}
		dir = p
	}
	depth, limit := max(opts.Depth, 1), opts.Limit
	if limit == 0 {
		limit = delegate.DefaultFileLimit
	}
	sb, inst, err := k.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	infos, err := inst.ListFiles(ctx, sandbox.ListOptions{Dir: dir, Depth: depth, Limit: limit})
	out := &delegate.FileListing{Entries: []delegate.FileInfo{}, Truncated: errors.Is(err, sandbox.ErrTruncated)}
	if err != nil && !out.Truncated {
		return nil, k.fileError(ctx, sb, "path", dir, err)
	}
	for _, f := range infos {
		out.Entries = append(out.Entries, delegate.FileInfo{Path: f.Path, Type: delegate.FileType(f.Mode), Size: f.Size,
			Mode: f.Mode, ModTime: f.ModTime.UTC().Truncate(time.Millisecond), Link: f.Link})
	}
	return out, nil
}

// workspacePath resolves a path of the workspace (relative to it, or
// absolute inside it), naming the field when it leaves it.
func workspacePath(field, p string) (string, error) {
	abs, err := delegate.WorkspacePath(p)
	if err != nil {
		return "", &delegate.FieldError{Field: field, Rule: err.Error()}
	}
	return abs, nil
}

func parentDir(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return delegate.Workspace
}

// fileError names the path of a file operation the backend refused: a
// missing file, a link out, not a regular file (the backend's words).
func (k *keeper) fileError(ctx context.Context, sb *delegate.Sandbox, field, p string, err error) error {
	if k.failed(ctx, sb, err) {
		return &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", sb.ID)}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &delegate.NotFoundError{Resource: "file", ID: p, Of: "the sandbox"}
	}
	return &delegate.FieldError{Field: field, Rule: err.Error()}
}

// tick keeps the timers of the sandboxes this engine keeps, and adopts
// those of engines that died: idle past its idle timeout, a sandbox is
// paused (or, on a backend that cannot pause, it goes); paused past its
// pause timeout, or past its lifetime, it goes.
func (k *keeper) tick(ctx context.Context) {
	b := k.ref.get()
	if b == nil {
		return
	}
	live, err := k.sbs.ListSandboxes(ctx, true, delegate.MaxPageSize)
	if err != nil {
		k.log.Warn("list sandboxes", "err", err)
		return
	}
	now := time.Now()
	for _, sb := range live {
		if sb.Backend != b.Name() {
			continue
		}
		if sb.Owner != k.owner {
			if sb.Owner != "" && k.cfg.OwnerAlive(sb.Owner) {
				continue // another live engine keeps its timers
			}
			adopted, err := k.sbs.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
				if s.Owner != sb.Owner {
					return errSkip
				}
				s.Owner = k.owner
				return nil
			})
			if err != nil {
				continue
			}
			k.log.Info("sandbox adopted", "sandbox", sb.ID, "previous_owner", sb.Owner)
			sb = *adopted
			if _, err := b.Recover(ctx, sb.Instance); errors.Is(err, sandbox.ErrGone) {
				k.gone(ctx, &sb, "its machine did not survive a server restart")
				continue
			}
		}
		switch {
		case !now.Before(sb.ExpiresAt):
			k.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("its lifetime ended at %s", sb.ExpiresAt.Format(time.RFC3339)))
		case sb.State == delegate.SandboxPaused && now.Sub(sb.PausedAt) >= sb.PauseTimeout:
			k.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("paused for %s, its pause timeout", sb.PauseTimeout))
		case sb.State == delegate.SandboxIdle && sb.Running == 0 && now.Sub(sb.LastUsedAt) >= sb.IdleTimeout:
			k.pause(ctx, b, &sb)
		}
	}
}

// pause pauses an idle sandbox, or ends it where its backend cannot.
func (k *keeper) pause(ctx context.Context, b sandbox.Backend, sb *delegate.Sandbox) {
	if !b.Capabilities().Pause {
		k.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("idle for %s, its idle timeout (the %s backend cannot pause)", sb.IdleTimeout, b.Name()))
		return
	}
	unlock := k.lock(sb.ID)
	defer unlock()
	// Still idle? A command may have come since the list was read.
	cur, err := k.sbs.GetSandboxUncounted(ctx, sb.ID)
	if err != nil || cur.State != delegate.SandboxIdle || cur.Running > 0 || time.Since(cur.LastUsedAt) < cur.IdleTimeout {
		return
	}
	inst, err := b.Recover(ctx, cur.Instance)
	if err == nil {
		if pz, ok := inst.(sandbox.Pauser); ok {
			err = pz.Pause(ctx)
		}
	}
	if errors.Is(err, sandbox.ErrGone) {
		k.gone(ctx, cur, "its machine is gone")
		return
	}
	if err != nil {
		k.log.Warn("pause an idle sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	k.sbs.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
		s.State, s.PausedAt = delegate.SandboxPaused, time.Now().UTC()
		return nil
	})
	k.log.Info("sandbox paused", "sandbox", sb.ID, "idle", cur.IdleTimeout)
	k.jobs.wake()
}

// keeps reports whether an instance is the machine of a live sandbox
// (the sweep leaves those alone).
func (k *keeper) keeps(ctx context.Context, backend string, info sandbox.Info) bool {
	k.mu.Lock()
	_, opening := k.opening[info.JobID]
	k.mu.Unlock()
	if opening {
		// Made for a sandbox being opened, which records its machine
		// once Create returns (on Proxmox, after a clone and a boot).
		return true
	}
	sb, err := k.sbs.SandboxOfInstance(ctx, backend, info.ID)
	return err == nil && !sb.State.Terminal()
}
