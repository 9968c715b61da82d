package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// outputChunk is how much output is moved from the sandbox to the store at once.
const outputChunk = 256 << 10

// enqueue runs the job when a concurrency slot is free and the backend
// has room for it (see admission.go). A job waiting for room does not
// hold a slot.
func (e *Engine) enqueue(id string) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			select {
			case e.sem <- struct{}{}:
			case <-e.ctx.Done():
				return // stays pending; the next engine picks it up
			}
			adm, res, room := e.admit(id)
			if res == admitted {
				e.run(id, adm)
				<-e.sem
				e.roomFreed()
				return
			}
			<-e.sem
			if res == admitDrop || !e.waitForRoom(id, room) {
				return
			}
		}
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

// run takes a pending job through provisioning to its end. adm is the
// room the backend reserved for it (nil: none was needed).
func (e *Engine) run(id string, adm sandbox.Admission) {
	if adm != nil {
		defer adm.Release() // a no-op once Create has used it
	}
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
	sb, proc, err := e.provision(pctx, job, adm)
	cancelProvision()
	if err != nil {
		// The command never ran (or was killed before it was recorded as
		// running), also when the server is stopping: fail the job and
		// roll its sandbox back now, rather than leave both to the next
		// server that starts.
		reason := fmt.Sprintf("provisioning failed: %v", err)
		if e.ctx.Err() != nil {
			reason = "the server stopped while the sandbox was being provisioned; submit the job again"
		} else if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			reason = fmt.Sprintf("provisioning took longer than %s", e.cfg.ProvisionTimeout)
		}
		e.finish(id, delegate.StatusFailed, reason, nil)
		if sb != nil {
			e.rollback(id, sb.ID())
		}
		return
	}
	log.Info("job running", "sandbox", sb.ID())
	e.follow(r, job.ID, sb, proc, m)
}

// provision creates the sandbox, writes the files and starts the command.
// It returns the sandbox even on error when there is one to clean up.
func (e *Engine) provision(ctx context.Context, job *delegate.Job, adm sandbox.Admission) (sandbox.Sandbox, sandbox.Process, error) {
	m := job.Manifest
	spec, err := sandboxSpec(job)
	if err != nil {
		return nil, nil, err
	}
	spec.Admission, spec.Progress = adm, e.stepper(ctx, job.ID)
	sb, err := e.createSandbox(ctx, spec)
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
	token, tokenHash := newToken()
	if _, err := e.update(ctx, job.ID, func(j *delegate.Job) error {
		j.TokenHash = tokenHash
		return nil
	}); err != nil {
		return sb, nil, err
	}
	cmd, err := e.command(job, token)
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
		j.Status, j.Progress, j.ExecID = delegate.StatusRunning, "running", proc.ID()
		j.StartedAt = time.Now().UTC()
		j.LastHeartbeat = j.StartedAt
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
		Network:     job.Manifest.Network == delegate.NetworkEgress,
	}, nil
}

// follow watches a running process until it ends, is killed, or times out,
// moving its output and status lines into the store as it goes. Only the
// engine's own end stops it early (the job then goes on, for the next
// engine to re-attach to).
func (e *Engine) follow(r *run, id string, sb sandbox.Sandbox, proc sandbox.Process, m delegate.Manifest) {
	ctx := e.ctx
	job, err := e.store.GetJob(ctx, id)
	if err != nil {
		e.log.Error("follow job", "job", id, "err", err)
		return
	}
	t, err := e.newTracker(ctx, job, proc)
	if err != nil {
		e.log.Error("follow job", "job", id, "err", err)
		return
	}
	deadline := job.StartedAt.Add(time.Duration(m.TimeoutSeconds()) * time.Second)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	ticker := time.NewTicker(e.cfg.PollInterval)
	defer ticker.Stop()
	// The supervisor's liveness is the job's heartbeat where the backend
	// watches the process; it is written now and then, not on every tick.
	beat := time.NewTicker(max(e.cfg.HeartbeatThreshold/4, e.cfg.PollInterval))
	defer beat.Stop()
	supervised := e.backend.Capabilities().Supervised

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

	var (
		timedOut, killing bool
		graceEnd          time.Time
	)
	kill := func() {
		killing = true
		if err := proc.Kill(context.WithoutCancel(ctx)); err != nil {
			e.log.Warn("kill job", "job", id, "err", err)
		}
	}
	end := func(w waited) {
		t.collect(context.WithoutCancel(ctx), true)
		e.settle(t, sb, w.exit, w.err, timedOut)
	}
	for {
		select {
		case w := <-done:
			end(w)
			return
		case <-ticker.C:
			t.collect(ctx, false)
			// Another process (the CLI, a callback) may have ended it. A job
			// that reported its own completion gets a moment to exit by
			// itself, so that its real exit code is kept; a cancelled one
			// is killed at once.
			if j, err := e.store.GetJob(ctx, id); err == nil && j.Status.Terminal() && !killing {
				if j.Status == delegate.StatusCancelled {
					kill()
				} else if graceEnd.IsZero() {
					graceEnd = time.Now().Add(completionGrace)
				} else if time.Now().After(graceEnd) {
					kill()
				}
			}
		case <-beat.C:
			if supervised {
				e.update(ctx, id, func(j *delegate.Job) error {
					j.LastHeartbeat = time.Now().UTC()
					return nil
				})
			}
		case <-r.kill:
			kill()
		case <-timer.C:
			timedOut = true
			e.log.Info("job timed out", "job", id, "timeout", m.TimeoutSeconds())
			kill()
		case <-ctx.Done():
			// Engine closing: a running job goes on, for the next engine to
			// re-attach to; a job that has ended (or is being killed) is
			// seen to its end, so that its sandbox is not left behind.
			if !killing && graceEnd.IsZero() {
				j, err := e.store.GetJob(context.WithoutCancel(ctx), id)
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
	e          *Engine
	id         string
	m          delegate.Manifest
	proc       sandbox.Process
	redact     *redactor
	kept       int64  // output bytes stored
	read       int64  // output bytes consumed from the process
	pending    []byte // read but held back by the redactor
	eventsRead int64
	events     lineSplitter
	claude     lineSplitter
}

func (e *Engine) newTracker(ctx context.Context, job *delegate.Job, proc sandbox.Process) (*tracker, error) {
	kept, err := e.store.OutputSize(ctx, job.ID)
	if err != nil {
		return nil, err
	}
	var secrets []string
	for _, name := range job.Manifest.Secrets {
		if v, ok := e.cfg.Secret(name); ok {
			secrets = append(secrets, v)
		}
	}
	// After a restart the status channel is read again from the start; the
	// timeline may repeat a little, nothing is lost.
	return &tracker{e: e, id: job.ID, m: job.Manifest, proc: proc, redact: newRedactor(secrets), kept: kept, read: job.OutputRead}, nil
}

// collect pulls what is new; final flushes what the redactor held back.
func (t *tracker) collect(ctx context.Context, final bool) {
	t.collectEvents(ctx, final)
	t.collectOutput(ctx, final)
}

func (t *tracker) collectOutput(ctx context.Context, final bool) {
	e := t.e
	for {
		b, err := t.proc.ReadOutput(ctx, t.read+int64(len(t.pending)), outputChunk)
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("read output", "job", t.id, "err", err)
			}
			return
		}
		last := len(b) < outputChunk
		t.pending = append(t.pending, b...)
		out, used := t.redact.stream(t.pending, final && last)
		if t.m.AgentType == delegate.AgentClaude {
			for _, line := range t.claude.lines(out, final && last) {
				t.claudeLine(ctx, line)
			}
		}
		if room := e.cfg.OutputLimit - t.kept; int64(len(out)) > room {
			out = out[:max(0, room)]
		}
		if len(out) > 0 {
			if err := e.store.AppendOutput(ctx, t.id, out); err != nil {
				e.log.Warn("store output", "job", t.id, "err", err)
				return
			}
		}
		t.kept += int64(len(out))
		t.read += int64(used)
		t.pending = t.pending[used:]
		if used > 0 || len(out) > 0 {
			read, kept := t.read, t.kept
			e.update(ctx, t.id, func(j *delegate.Job) error {
				j.OutputRead = read
				j.OutputBytes = max(j.OutputBytes, kept)
				return nil
			})
		}
		if last {
			return
		}
	}
}

func (t *tracker) collectEvents(ctx context.Context, final bool) {
	for {
		b, err := t.proc.ReadEvents(ctx, t.eventsRead, 64<<10)
		if err != nil || (len(b) == 0 && !final) {
			return
		}
		t.eventsRead += int64(len(b))
		for _, line := range t.events.lines(b, final && len(b) == 0) {
			t.e.report(ctx, t.id, t.m, t.redact.string(parseStatusLine(line)), nil)
		}
		if len(b) == 0 {
			return
		}
	}
}

func (t *tracker) claudeLine(ctx context.Context, line string) {
	progress, result := parseClaudeLine(line)
	if progress == "" && result == nil {
		return
	}
	t.e.report(ctx, t.id, t.m, progress, result)
}

// report records a sign of life from a job: a progress message (kept in the
// timeline in statusMode detailed), and perhaps its result text.
func (e *Engine) report(ctx context.Context, id string, m delegate.Manifest, progress string, result *string) {
	now := time.Now().UTC()
	_, err := e.update(ctx, id, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return delegate.ErrTerminal
		}
		j.LastHeartbeat = now
		if progress != "" {
			j.Progress = progress
		}
		if result != nil {
			j.Result = clipResult(*result)
		}
		return nil
	})
	if err != nil {
		return
	}
	if progress != "" && m.StatusMode != delegate.StatusModeSimple {
		if err := e.store.AddEvent(ctx, id, delegate.Event{Time: now, Message: progress}, maxEvents); err != nil {
			e.log.Warn("store event", "job", id, "err", err)
		}
	}
}

// maxEvents is how many timeline entries a job keeps.
const maxEvents = 200

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
func (e *Engine) settle(t *tracker, sb sandbox.Sandbox, exit sandbox.Exit, waitErr error, timedOut bool) {
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
	// Artifacts are collected before the job is marked finished, so that a
	// client that sees the end also sees them.
	if len(m.Artifacts) > 0 && waitErr == nil {
		e.collectArtifacts(context.WithoutCancel(e.ctx), id, m, sb)
	}
	e.finish(id, status, t.redact.string(reason), func(j *delegate.Job) {
		if j.ExitCode == nil { // a completion callback may have reported one
			j.ExitCode = code
		}
		j.OOMKilled = exit.OOMKilled
		if waitErr == nil {
			j.OutputBytes = max(j.OutputBytes, exit.OutputBytes)
			j.OutputTruncated = exit.Truncated || j.OutputBytes > e.cfg.OutputLimit
		}
	})
	e.jobEnded(id)
	e.destroy(sb.ID(), m)
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
		return
	}
	e.roomFreed()
}
