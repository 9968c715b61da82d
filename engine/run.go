package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// outputChunk is how much output is moved from the sandbox to the store at once.
const outputChunk = 256 << 10

// enqueue runs the job when a concurrency slot is free.
func (e *Engine) enqueue(id string) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		select {
		case e.sem <- struct{}{}:
		case <-e.ctx.Done():
			return // stays pending; the next engine picks it up
		}
		defer func() { <-e.sem }()
		e.run(id)
	}()
}

func (e *Engine) register(id string) (*run, context.Context) {
	ctx, cancel := context.WithCancel(e.ctx)
	r := &run{cancel: cancel, kill: make(chan struct{})}
	e.mu.Lock()
	e.runs[id] = r
	e.mu.Unlock()
	return r, ctx
}

func (e *Engine) unregister(id string) {
	e.mu.Lock()
	if r := e.runs[id]; r != nil {
		r.cancel()
		delete(e.runs, id)
	}
	e.mu.Unlock()
}

// run takes a pending job through provisioning to its end.
func (e *Engine) run(id string) {
	r, ctx := e.register(id)
	defer e.unregister(id)
	log := e.log.With("job", id)

	job, err := e.update(ctx, id, func(j *delegate.Job) error {
		if j.Status != delegate.StatusPending {
			return delegate.ErrTerminal // cancelled while queued
		}
		j.Status, j.Progress, j.Owner, j.Backend = delegate.StatusProvisioning, "provisioning sandbox", e.owner, e.backend.Name()
		return nil
	})
	if err != nil {
		if !errors.Is(err, delegate.ErrTerminal) && ctx.Err() == nil {
			log.Error("start job", "err", err)
		}
		return
	}
	m := job.Manifest

	pctx, cancelProvision := context.WithTimeout(ctx, e.cfg.ProvisionTimeout)
	sb, proc, err := e.provision(pctx, job)
	cancelProvision()
	if err != nil {
		if e.ctx.Err() != nil && sb == nil {
			return // shutting down mid-provisioning; recovery settles the job
		}
		reason := fmt.Sprintf("provisioning failed: %v", err)
		if e.ctx.Err() != nil {
			reason = "the server stopped while the sandbox was being provisioned; submit the job again"
		} else if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			reason = fmt.Sprintf("provisioning took longer than %s", e.cfg.ProvisionTimeout)
		}
		e.finish(id, delegate.StatusFailed, reason, nil)
		if sb != nil {
			e.destroy(sb.ID(), m)
		}
		return
	}
	log.Info("job running", "sandbox", sb.ID())
	e.follow(r, job.ID, sb.ID(), proc, m)
}

// provision creates the sandbox, writes the files and starts the command.
// It returns the sandbox even on error when there is one to clean up.
func (e *Engine) provision(ctx context.Context, job *delegate.Job) (sandbox.Sandbox, sandbox.Process, error) {
	m := job.Manifest
	spec, err := sandboxSpec(job)
	if err != nil {
		return nil, nil, err
	}
	sb, err := e.backend.Create(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	if _, err := e.update(ctx, job.ID, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job became %s: %w", j.Status, delegate.ErrTerminal)
		}
		j.SandboxID, j.Progress = sb.ID(), "writing files"
		return nil
	}); err != nil {
		return sb, nil, err
	}
	files, err := m.DecodedFiles()
	if err != nil {
		return sb, nil, err
	}
	for _, f := range files {
		if err := sb.WriteFile(ctx, f.Path, f.Data, f.Mode); err != nil {
			return sb, nil, fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	cmd, err := e.command(job)
	if err != nil {
		return sb, nil, err
	}
	proc, err := sb.Exec(ctx, cmd)
	if err != nil {
		return sb, nil, fmt.Errorf("start %s: %w", cmd.Args[0], err)
	}
	if _, err := e.update(ctx, job.ID, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job became %s: %w", j.Status, delegate.ErrTerminal)
		}
		j.Status, j.Progress, j.ExecID, j.StartedAt = delegate.StatusRunning, "running", proc.ID(), time.Now().UTC()
		return nil
	}); err != nil {
		proc.Kill(context.WithoutCancel(ctx))
		return sb, nil, err
	}
	return sb, proc, nil
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
	return sandbox.Spec{
		JobID:       job.ID,
		CPU:         r.CPU,
		MemoryBytes: mem,
		DiskBytes:   disk,
		Template:    job.Manifest.VMTemplate,
	}, nil
}

// follow watches a running process until it ends, is killed, or times out,
// moving its output into the store as it goes. Only the engine's own end
// stops it early (the job then goes on, for the next engine to re-attach).
func (e *Engine) follow(r *run, id, sandboxID string, proc sandbox.Process, m delegate.Manifest) {
	ctx := e.ctx
	job, err := e.store.GetJob(ctx, id)
	if err != nil {
		e.log.Error("follow job", "job", id, "err", err)
		return
	}
	kept := e.keptOutput(ctx, id)
	deadline := job.StartedAt.Add(time.Duration(m.Timeout) * time.Second)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	ticker := time.NewTicker(e.cfg.PollInterval)
	defer ticker.Stop()

	type waited struct {
		exit sandbox.Exit
		err  error
	}
	// Wait on a context of its own: at engine shutdown a job being killed
	// is still waited for.
	waitCtx, stopWait := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWait()
	done := make(chan waited, 1)
	go func() {
		exit, err := proc.Wait(waitCtx)
		done <- waited{exit, err}
	}()

	var timedOut, killing bool
	kill := func() {
		killing = true
		if err := proc.Kill(context.WithoutCancel(ctx)); err != nil {
			e.log.Warn("kill job", "job", id, "err", err)
		}
	}
	for {
		select {
		case w := <-done:
			kept = e.pullOutput(context.WithoutCancel(ctx), id, proc, kept)
			e.settle(id, m, sandboxID, w.exit, w.err, timedOut)
			return
		case <-ticker.C:
			kept = e.pullOutput(ctx, id, proc, kept)
			// Another process (the CLI, another server) may have cancelled it.
			if j, err := e.store.GetJob(ctx, id); err == nil && j.Status.Terminal() {
				kill()
			}
		case <-r.kill:
			kill()
		case <-timer.C:
			timedOut = true
			e.log.Info("job timed out", "job", id, "timeout", m.Timeout)
			kill()
		case <-ctx.Done():
			// Engine closing: a running job goes on, for the next engine to
			// re-attach to; a job being killed is seen to its end, so that
			// its sandbox is not left behind.
			if !killing {
				return
			}
			select {
			case w := <-done:
				e.pullOutput(context.WithoutCancel(ctx), id, proc, kept)
				e.settle(id, m, sandboxID, w.exit, w.err, timedOut)
			case <-time.After(10 * time.Second):
			}
			return
		}
	}
}

// keptOutput is how many bytes of output the store already holds.
func (e *Engine) keptOutput(ctx context.Context, id string) int64 {
	var n int64
	for {
		b, err := e.store.ReadOutput(ctx, id, n, outputChunk)
		if err != nil || len(b) == 0 {
			return n
		}
		n += int64(len(b))
	}
}

// pullOutput copies new output from the process into the store.
func (e *Engine) pullOutput(ctx context.Context, id string, proc sandbox.Process, kept int64) int64 {
	for kept < e.cfg.OutputLimit {
		b, err := proc.ReadOutput(ctx, kept, int(min(outputChunk, e.cfg.OutputLimit-kept)))
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("read output", "job", id, "err", err)
			}
			return kept
		}
		if len(b) == 0 {
			return kept
		}
		if err := e.store.AppendOutput(ctx, id, b); err != nil {
			e.log.Warn("store output", "job", id, "err", err)
			return kept
		}
		kept += int64(len(b))
		e.update(ctx, id, func(j *delegate.Job) error {
			j.OutputBytes = max(j.OutputBytes, kept)
			return nil
		})
	}
	return kept
}

// settle records how the process ended and destroys an ephemeral sandbox.
func (e *Engine) settle(id string, m delegate.Manifest, sandboxID string, exit sandbox.Exit, waitErr error, timedOut bool) {
	var (
		status = delegate.StatusSuccess
		reason string
		code   *int
	)
	switch {
	case waitErr != nil:
		status, reason = delegate.StatusFailed, fmt.Sprintf("lost the job's process: %v", waitErr)
	case timedOut || exit.DeadlineExceeded:
		status, reason = delegate.StatusTimeout, fmt.Sprintf("timed out after %ds (manifest.timeout); every process of the job was killed", m.Timeout)
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
	e.finish(id, status, reason, func(j *delegate.Job) {
		j.ExitCode = code
		j.OOMKilled = exit.OOMKilled
		if waitErr == nil {
			j.OutputBytes = max(j.OutputBytes, exit.OutputBytes)
			j.OutputTruncated = exit.Truncated || j.OutputBytes > e.cfg.OutputLimit
		}
	})
	e.destroy(sandboxID, m)
}

// finish moves the job to a terminal status. If it already is terminal (a
// cancel won the race), the status stays, and only facts (exit code, output
// size) are recorded.
func (e *Engine) finish(id string, status delegate.Status, reason string, facts func(*delegate.Job)) {
	ctx := context.WithoutCancel(e.ctx)
	j, err := e.update(ctx, id, func(j *delegate.Job) error {
		if facts != nil {
			facts(j)
		}
		if j.Status.Terminal() {
			return nil
		}
		j.Status, j.Error, j.FinishedAt = status, reason, time.Now().UTC()
		j.Progress = string(status)
		return nil
	})
	if err != nil {
		e.log.Error("finish job", "job", id, "err", err)
		return
	}
	e.log.Info("job finished", "job", id, "status", j.Status, "reason", j.Error)
}

// destroy removes an ephemeral job's sandbox; a persistent one is kept.
func (e *Engine) destroy(sandboxID string, m delegate.Manifest) {
	if m.Lifecycle == delegate.LifecyclePersistent {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 2*time.Minute)
	defer cancel()
	if err := e.backend.Destroy(ctx, sandboxID); err != nil {
		// The cleanup loop will try again.
		e.log.Warn("destroy sandbox", "sandbox", sandboxID, "err", err)
	}
}
