package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// forks is the part that checkpoints kept sandboxes, rolls them back and
// forks them (issue 38; delegate.CheckpointService). A checkpoint is the
// backend's (sandbox.Checkpointer), recorded in its sandbox's record (so
// that it is read, filtered by principal, and goes with the sandbox); a
// fork is opened through the keeper's one path for opening sandboxes
// (keeper.open), from the checkpoint, and so gets everything an opened
// sandbox gets afresh: its id, machine, host ids, network and egress
// token, the admission (the server's maximum) and the timers.
type forks struct {
	cfg    Config
	log    *slog.Logger
	data   delegate.Store
	keeper *keeper
	jobs   *jobWriter
	runs   *runs
	opener *opener // the one path every sandbox is opened through
}

// checkpointer is the backend's part of checkpoints, or why there is none.
func (f *forks) checkpointer(memory bool) (sandbox.Backend, error) {
	b, err := f.keeper.backend()
	if err != nil {
		return nil, err
	}
	caps := b.Capabilities()
	if !caps.Checkpoint {
		why := caps.CheckpointMissing
		if why == "" {
			why = "it keeps no checkpoints"
		}
		return nil, fmt.Errorf("the %s backend cannot checkpoint, roll back or fork a sandbox: %s: %w", b.Name(), why, delegate.ErrInvalid)
	}
	if memory {
		why := caps.CheckpointMemoryMissing
		if why == "" {
			why = "it keeps files only"
		}
		return nil, &delegate.FieldError{Field: "memory", Rule: fmt.Sprintf("cannot be true on the %s backend here: %s", b.Name(), why)}
	}
	return b, nil
}

// CheckpointSandbox saves a sandbox's files (see delegate.CheckpointService).
func (f *forks) CheckpointSandbox(ctx context.Context, id string, opts delegate.CheckpointOptions) (*delegate.Checkpoint, error) {
	if err := checkCheckpointName(opts.Name); err != nil {
		return nil, err
	}
	if _, err := f.checkpointer(opts.Memory); err != nil {
		return nil, err
	}
	sb, inst, err := f.keeper.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	if len(sb.Checkpoints) >= delegate.MaxCheckpoints {
		return nil, fmt.Errorf("sandbox %s has %d checkpoints, the most one keeps: delete one first (checkpoint action delete): %w", id, len(sb.Checkpoints), delegate.ErrConflict)
	}
	return f.checkpoint(ctx, sb, inst, opts.Name)
}

// checkpoint makes and records a checkpoint of a live sandbox.
func (f *forks) checkpoint(ctx context.Context, sb *delegate.Sandbox, inst sandbox.Instance, name string) (*delegate.Checkpoint, error) {
	cp, ok := inst.(sandbox.Checkpointer)
	if !ok {
		return nil, fmt.Errorf("sandbox %s cannot be checkpointed (its machine is not a kept one of this backend): %w", sb.ID, delegate.ErrInvalid)
	}
	unlock := f.keeper.machines.lock(sb.ID)
	defer unlock()
	// Its processes, and so its commands, go on across the checkpoint.
	made, err := cp.Checkpoint(ctx)
	if err != nil {
		if errors.Is(err, sandbox.ErrBusy) {
			return nil, fmt.Errorf("%w: %w", err, delegate.ErrConflict)
		}
		if f.keeper.failed(ctx, sb, err) {
			return nil, &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", sb.ID)}
		}
		return nil, fmt.Errorf("checkpoint sandbox %s: %w", sb.ID, err)
	}
	// Its size is known once made: one that takes its principal over
	// the disk quota is not recorded, and deleted (the sandbox's files
	// stay as they are). The store decides where it records it, one
	// checkpoint of the principal's after the other.
	admit, err := diskAdmitter(ctx, f.keeper.ref.get(), f.cfg.Quotas, made.Bytes)
	if err != nil {
		f.forget(ctx, made.ID)
		return nil, err
	}
	var rec delegate.Checkpoint
	_, err = f.data.UpdateSandboxAdmitted(ctx, sb.ID, func(s *delegate.Sandbox) error {
		s.CheckpointSeq++
		rec = delegate.Checkpoint{ID: delegate.CheckpointID(s.ID, s.CheckpointSeq), Name: name, SandboxID: s.ID,
			Instance: made.ID, Bytes: made.Bytes, CreatedAt: made.Created}
		s.Checkpoints = append(s.Checkpoints, rec)
		return nil
	}, admit)
	if err != nil {
		f.forget(ctx, made.ID) // not recorded: not kept either
		return nil, err
	}
	f.log.Info("sandbox checkpointed", "sandbox", sb.ID, "checkpoint", rec.ID, "bytes", rec.Bytes)
	return &rec, nil
}

// forget deletes the backend's checkpoint id, which no record names.
func (f *forks) forget(ctx context.Context, id string) {
	if b := f.keeper.ref.get(); b != nil {
		if ck, ok := b.(sandbox.CheckpointKeeper); ok {
			if err := ck.DeleteCheckpoint(context.WithoutCancel(ctx), id); err != nil {
				f.log.Warn("delete a checkpoint not recorded", "checkpoint", id, "err", err)
			}
		}
	}
}

// checkCheckpointName refuses a name an agent could not tell apart or
// read back.
func checkCheckpointName(name string) error {
	if len(name) > delegate.MaxCheckpointName {
		return &delegate.FieldError{Field: "name", Rule: fmt.Sprintf("must be at most %d bytes (got %d)", delegate.MaxCheckpointName, len(name))}
	}
	if strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return &delegate.FieldError{Field: "name", Rule: "must be printable text, without control characters"}
	}
	return nil
}

// cancelCommands ends the commands running in a sandbox as cancelled,
// with the reason, before its processes are ended under them.
func (f *forks) cancelCommands(ctx context.Context, id, reason string) {
	jobs, _, err := f.data.ListJobs(ctx, delegate.JobFilter{Sandbox: id, Active: true, Limit: delegate.MaxPageSize})
	if err != nil {
		f.log.Warn("list the commands of a sandbox", "sandbox", id, "err", err)
		return
	}
	for _, j := range jobs {
		_, err := f.jobs.update(context.WithoutCancel(ctx), j.ID, func(j *delegate.Job) error {
			if j.Status.Terminal() {
				return delegate.ErrTerminal
			}
			markCancelled(j)
			j.Error = reason
			return nil
		})
		if err == nil {
			f.runs.stop(j.ID)
		}
	}
}

// find returns the checkpoint an id names, through its sandbox (whose
// principal decides who sees it).
func (f *forks) find(ctx context.Context, field, id string) (*delegate.Sandbox, *delegate.Checkpoint, error) {
	sbID, err := delegate.CheckpointSandbox(field, id)
	if err != nil {
		return nil, nil, err
	}
	sb, err := f.data.GetSandboxUncounted(ctx, sbID)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, nil, delegate.CheckpointNotFound(id)
	}
	if err != nil {
		return nil, nil, err
	}
	i := slices.IndexFunc(sb.Checkpoints, func(c delegate.Checkpoint) bool { return c.ID == id })
	if i < 0 {
		return sb, nil, delegate.CheckpointNotFound(id)
	}
	return sb, &sb.Checkpoints[i], nil
}

// RollbackSandbox brings a sandbox's files back to one of its checkpoints.
func (f *forks) RollbackSandbox(ctx context.Context, id, checkpoint string) (*delegate.Sandbox, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if _, err := f.checkpointer(false); err != nil {
		return nil, err
	}
	owner, cp, err := f.find(ctx, "checkpoint", checkpoint)
	if err != nil {
		return nil, err
	}
	if owner.ID != id {
		return nil, &delegate.FieldError{Field: "checkpoint", Rule: fmt.Sprintf("%s is a checkpoint of sandbox %s, not of %s: a sandbox rolls back to its own checkpoints (fork %s to start a sandbox from it)", checkpoint, owner.ID, id, checkpoint)}
	}
	sb, inst, err := f.keeper.instance(ctx, id, false)
	if err != nil {
		return nil, err
	}
	ck, ok := inst.(sandbox.Checkpointer)
	if !ok {
		return nil, fmt.Errorf("sandbox %s cannot be rolled back (its machine is not a kept one of this backend): %w", id, delegate.ErrInvalid)
	}
	unlock := f.keeper.machines.lock(id)
	defer unlock()
	f.cancelCommands(ctx, id, fmt.Sprintf("the sandbox was rolled back to checkpoint %s: its processes start again from a clean init", checkpoint))
	if err := ck.Rollback(ctx, cp.Instance); err != nil {
		if f.keeper.failed(ctx, sb, err) {
			return nil, &endedError{fmt.Sprintf("sandbox %s is gone (its machine is): open a new one", id)}
		}
		return nil, fmt.Errorf("roll back sandbox %s: %w", id, err)
	}
	f.log.Info("sandbox rolled back", "sandbox", id, "checkpoint", checkpoint)
	return f.data.GetSandbox(ctx, id)
}

// ListCheckpoints lists a sandbox's checkpoints with the forks made
// from each (those this reader sees).
func (f *forks) ListCheckpoints(ctx context.Context, id string) ([]delegate.Checkpoint, error) {
	if err := delegate.CheckSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	sb, err := f.data.GetSandboxUncounted(ctx, id)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(sb.Checkpoints)
	if len(out) == 0 {
		return out, nil
	}
	all, err := f.data.ListSandboxes(ctx, false, delegate.MaxPageSize)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Forks = nil
		for j := len(all) - 1; j >= 0; j-- {
			if all[j].From == out[i].ID {
				out[i].Forks = append(out[i].Forks, all[j].ID)
			}
		}
	}
	return out, nil
}

// DeleteCheckpoint deletes one: its record, and what the backend keeps
// of it that no fork stands on.
func (f *forks) DeleteCheckpoint(ctx context.Context, checkpoint string) error {
	b, err := f.checkpointer(false)
	if err != nil {
		return err
	}
	sb, cp, err := f.find(ctx, "checkpoint", checkpoint)
	if err != nil {
		return err
	}
	if _, err := f.data.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
		s.Checkpoints = slices.DeleteFunc(s.Checkpoints, func(c delegate.Checkpoint) bool { return c.ID == checkpoint })
		return nil
	}); err != nil && !errors.Is(err, delegate.ErrTerminal) {
		return err
	}
	if ck, ok := b.(sandbox.CheckpointKeeper); ok {
		if err := ck.DeleteCheckpoint(ctx, cp.Instance); err != nil {
			return fmt.Errorf("delete checkpoint %s: %w", checkpoint, err)
		}
	}
	f.log.Info("checkpoint deleted", "sandbox", sb.ID, "checkpoint", checkpoint)
	return nil
}

// ForkSandbox makes spec.Count kept sandboxes from a checkpoint, or from
// a sandbox checkpointed for it at once (its commands go on; a paused one
// is resumed, as any use of it is): one cut, one instant, for all of
// them. Each is opened as open_sandbox opens one (keeper.open), and they
// are opened at once (openForks): a fork that cannot be made releases
// those made, and the call fails.
func (f *forks) ForkSandbox(ctx context.Context, spec delegate.ForkSpec) ([]delegate.Sandbox, error) {
	most := cmp0(f.cfg.MaxForks, delegate.DefaultMaxForks)
	if spec.Count < 1 || spec.Count > most {
		return nil, &delegate.FieldError{Field: "count", Rule: fmt.Sprintf("must be between 1 and %d (DELEGATE_MAX_FORKS; got %d)", most, spec.Count)}
	}
	if _, err := f.checkpointer(spec.Memory); err != nil {
		return nil, err
	}
	var src *delegate.Sandbox
	var cp *delegate.Checkpoint
	switch {
	case strings.HasPrefix(spec.From, delegate.CheckpointPrefix):
		var err error
		if src, cp, err = f.find(ctx, "from", spec.From); err != nil {
			return nil, err
		}
		if src.State.Terminal() {
			return nil, &endedError{fmt.Sprintf("checkpoint %s went with its sandbox %s (%s: %s)", spec.From, src.ID, src.State, src.Reason)}
		}
	default:
		if err := delegate.CheckSandboxID("from", spec.From); err != nil {
			return nil, &delegate.FieldError{Field: "from", Rule: fmt.Sprintf("must be a sandbox id (sbx-…) or a checkpoint id (ckp-…) (got %q)", spec.From)}
		}
		if err := f.keeper.roomFor(ctx, spec.Count); err != nil {
			return nil, err
		}
		var inst sandbox.Instance
		var err error
		if src, inst, err = f.keeper.instance(ctx, spec.From, false); err != nil {
			return nil, err
		}
		if cp, err = f.checkpoint(ctx, src, inst, fmt.Sprintf("fork of %d", spec.Count)); err != nil {
			return nil, err
		}
	}
	if err := f.keeper.roomFor(ctx, spec.Count); err != nil {
		return nil, err
	}
	var secrets []string
	if made := makerOf(ctx, f.data, src); made != "" {
		if j, err := f.data.GetJob(ctx, made); err == nil {
			secrets = j.Manifest.Secrets
		}
	}
	open := delegate.SandboxSpec{Resources: &src.Resources, VMTemplate: src.Template, Network: src.Network,
		IdleTimeout: int(src.IdleTimeout / time.Second), PauseTimeout: int(src.PauseTimeout / time.Second)}
	made, err := f.openForks(ctx, spec, open, forkOf{checkpoint: cp, secrets: secrets})
	if err != nil {
		return nil, err
	}
	f.log.Info("sandbox forked", "from", spec.From, "checkpoint", cp.ID, "count", len(made))
	return made, nil
}

// forksAtOnce bounds the forks of one call being opened at the same
// time. Each is a whole sandbox (the local backend's: a slot, cgroups,
// mounts, an init; Proxmox's: a warm VM and the files put in through its
// agent), whose making waits on the kernel, processes and the network
// as much as it computes: opened one after another, a fork of 4 took
// 4 times one. DELEGATE_MAX_FORKS is 8 by default.
const forksAtOnce = 8

// openForks opens spec.Count forks, at most forksAtOnce at a time, each
// through the one path for opening sandboxes (opener.open: the floor of
// free space, the principal's quotas, decided atomically per sandbox
// where it is stored, the server's maximum, the audit trail). If one
// fails, none is opened after it, every one made is released (its
// machine destroyed, its network ended) and the error names the fork
// that failed and why (the first to fail, in order, with how many
// others did).
func (f *forks) openForks(ctx context.Context, spec delegate.ForkSpec, open delegate.SandboxSpec, from forkOf) ([]delegate.Sandbox, error) {
	made := make([]*delegate.Sandbox, spec.Count)
	errs := make([]error, spec.Count)
	var failed atomic.Bool
	var wg sync.WaitGroup
	slots := make(chan struct{}, forksAtOnce)
	for i := range spec.Count {
		slots <- struct{}{}
		if failed.Load() {
			<-slots
			break // one failed: the call fails, no more are made
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if made[i], errs[i] = f.opener.open(ctx, ownSpec(open), from); errs[i] != nil {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	first, others := -1, 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		if first < 0 {
			first = i
		} else {
			others++
		}
	}
	if first < 0 { // each was opened (none is skipped but after a failure)
		out := make([]delegate.Sandbox, spec.Count)
		for i, sb := range made {
			out[i] = *sb
		}
		return out, nil
	}
	why := errs[first].Error()
	for _, sb := range made {
		if sb != nil {
			f.keeper.end(context.WithoutCancel(ctx), sb.ID, delegate.SandboxReleased, "its fork failed: "+why)
		}
	}
	more := ""
	if others > 0 {
		more = fmt.Sprintf(" (and %d more of them failed)", others)
	}
	return nil, fmt.Errorf("fork %s (%d of %d)%s: %w", spec.From, first+1, spec.Count, more, errs[first])
}

// ownSpec is a copy of spec that shares nothing with it: opening a
// sandbox writes its defaults into the spec's resources, and the forks
// of one call are opened at once (a data race on one Resources before).
func ownSpec(spec delegate.SandboxSpec) delegate.SandboxSpec {
	if spec.Resources != nil {
		r := *spec.Resources
		spec.Resources = &r
	}
	spec.Network.Allow = slices.Clone(spec.Network.Allow)
	return spec
}

// makerOf is the job that made a sandbox; for a fork, the one that made
// the sandbox it was forked from (a fork of a fork: further back). A fork
// starts from its source's files, so its changes are computed against the
// same import (jobs diff of a fork shows its changes since the original
// import, not since the fork), and its commands get the same workspace
// source and caches. "" for a sandbox opened empty, or a source gone from
// the store.
func makerOf(ctx context.Context, store delegate.SandboxStore, sb *delegate.Sandbox) string {
	for range maxForkDepth {
		if sb.JobID != "" || sb.From == "" {
			return sb.JobID
		}
		id, err := delegate.CheckpointSandbox("from", sb.From)
		if err != nil {
			return ""
		}
		if sb, err = store.GetSandboxUncounted(ctx, id); err != nil {
			return ""
		}
	}
	return ""
}

// maxForkDepth bounds the forks of forks makerOf follows back.
const maxForkDepth = 64

func cmp0(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
