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

// enqueue runs the job when a run slot is free and the backend has room
// for it (see admission.go). A job waiting for a slot is only an id in a
// queue, not a goroutine: thousands may wait, and every goroutine is work
// for the garbage collector (a parked goroutine per pending job once took
// a third of the server's CPU in stack scans). A job waiting for room
// holds no slot.
func (e *Engine) enqueue(id string) { e.queueJob(id, false) }

// queueJob starts the job in a free slot, or queues it (at the front: a
// job that has waited for room already).
func (e *Engine) queueJob(id string, front bool) {
	e.mu.Lock()
	if e.slots > 0 {
		e.slots--
		e.mu.Unlock()
		e.startSlot(id)
		return
	}
	if front {
		e.queue = append([]string{id}, e.queue...)
	} else {
		e.queue = append(e.queue, id)
	}
	e.mu.Unlock()
}

// releaseSlot hands a run slot to the next queued job, or gives it back.
// Once the engine closes, queued jobs stay pending for the next engine.
func (e *Engine) releaseSlot() {
	e.mu.Lock()
	if len(e.queue) > 0 && e.ctx.Err() == nil {
		id := e.queue[0]
		e.queue = e.queue[1:]
		e.mu.Unlock()
		e.startSlot(id)
		return
	}
	e.slots++
	e.mu.Unlock()
}

// startSlot runs a job in the slot the caller holds.
func (e *Engine) startSlot(id string) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if e.ctx.Err() != nil {
			e.releaseSlot() // stays pending; the next engine picks it up
			return
		}
		adm, res, room := e.admit(id)
		if res == admitted {
			e.run(id, adm)
			e.releaseSlot()
			e.roomFreed()
			return
		}
		e.releaseSlot()
		if res == admitDrop || !e.waitForRoom(id, room) {
			return
		}
		e.queueJob(id, true)
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
	log.Debug("job running", "sandbox", sb.ID())
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
	// The files are kept apart from the job: read only here.
	raw, err := e.store.JobFiles(ctx, job.ID)
	if err != nil {
		return sb, nil, err
	}
	withFiles := m
	withFiles.Files = raw
	files, err := withFiles.DecodedFiles()
	if err != nil {
		return sb, nil, err
	}
	for _, f := range files {
		if err := sb.WriteFile(ctx, f.Path, f.Data, f.Mode); err != nil {
			return sb, nil, fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	token, tokenHash := newToken()
	withToken, err := e.update(ctx, job.ID, func(j *delegate.Job) error {
		j.TokenHash = tokenHash
		return nil
	})
	if err != nil {
		return sb, nil, err
	}
	if ent, ok := e.indexJob(withToken, e.foreign.Load()); ok {
		e.tokens.put(job.ID, ent)
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
//
// Each tick does a bounded amount of work (see collect), so that a job
// flooding its output or status channel cannot keep the loop from its
// timer: a job is killed at its timeout whatever it writes.
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
	// watches the process; it is recorded now and then, not on every tick.
	beat := time.NewTicker(max(e.cfg.HeartbeatThreshold/4, e.cfg.PollInterval))
	defer beat.Stop()
	supervised := e.backend.Capabilities().Supervised

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
	go func() {
		exit, err := proc.Wait(waitCtx)
		done <- waited{exit, err, time.Now().UTC()}
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
	timeout := func() {
		if timedOut {
			return
		}
		timedOut = true
		e.log.Info("job timed out", "job", id, "timeout", m.TimeoutSeconds())
		kill()
	}
	end := func(w waited) {
		t.collect(context.WithoutCancel(ctx), true)
		e.settle(t, sb, w.exit, w.err, timedOut, w.at)
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
			// This engine, or another process (the CLI, a callback
			// received by another server), may have ended it. A job that
			// reported its own completion gets a moment to exit by itself,
			// so that its real exit code is kept; a cancelled one is
			// killed at once.
			if st := r.end.Load(); st != nil && !killing {
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
				e.progress.report(id, "", nil, false, time.Now().UTC())
			}
		case <-r.kill:
			kill()
		case <-timer.C:
			timeout()
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
	e      *Engine
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
	return &tracker{e: e, id: job.ID, m: job.Manifest, proc: proc, redact: newRedactor(secrets), kept: kept,
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
	e := t.e
	for moved := 0; final || moved < outputPerTick; {
		outs, err := t.proc.ReadOutput(ctx, t.next, outputChunk)
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("read output", "job", t.id, "err", err)
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
		kept, stored := capOutput(chunk, e.cfg.OutputLimit-t.kept)
		if read != t.read || stored > 0 {
			// The chunk and how far the output was read, in one write.
			if err := e.store.AppendOutput(ctx, t.id, kept, read); err != nil {
				e.log.Warn("store output", "job", t.id, "err", err)
				t.next, t.held = next, held
				return
			}
			if stored > 0 {
				e.notify(t.id) // subscribers of job://{id}/log
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
}

func (t *tracker) timeline() bool { return t.m.StatusMode != delegate.StatusModeSimple }

// statusLines records status lines as progress (the timeline gets each,
// the progress the last), and counts lines skipped unread.
func (t *tracker) statusLines(lines []string, skipped int) {
	now := time.Now().UTC()
	if skipped > 0 {
		if t.timeline() {
			t.e.progress.dropped(t.id, int64(skipped))
		}
		t.e.progress.report(t.id, "", nil, false, now)
	}
	for _, line := range lines {
		t.e.progress.report(t.id, t.redact.string(parseStatusLine(line)), nil, t.timeline(), now)
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
	t.e.progress.report(t.id, progress, result, t.timeline(), time.Now().UTC())
}

// report records a sign of life from a job: a progress message (kept in the
// timeline in statusMode detailed and streaming), and perhaps its result
// text. It is coalesced in memory and stored within progressEvery.
func (e *Engine) report(ctx context.Context, id string, m delegate.Manifest, progress string, result *string) {
	e.progress.report(id, progress, result, m.StatusMode != delegate.StatusModeSimple, time.Now().UTC())
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
func (e *Engine) settle(t *tracker, sb sandbox.Sandbox, exit sandbox.Exit, waitErr error, timedOut bool, endedAt time.Time) {
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
	e.finishAt(id, status, t.redact.string(reason), endedAt, e.jobEnded, func(j *delegate.Job) {
		if j.ExitCode == nil { // a completion callback may have reported one
			j.ExitCode = code
		}
		j.OOMKilled = exit.OOMKilled
		if waitErr == nil {
			j.OutputBytes = max(j.OutputBytes, exit.OutputBytes)
			j.OutputTruncated = exit.Truncated || j.OutputBytes > e.cfg.OutputLimit
		}
	})
	e.destroy(sb.ID(), m)
}

// finish moves the job to a terminal status. If it already is terminal (a
// cancel won the race), the status stays, and only facts (exit code, output
// size) are recorded. The job's pending progress is stored first, and the
// end is stored before finish returns.
func (e *Engine) finish(id string, status delegate.Status, reason string, facts func(*delegate.Job)) {
	e.finishAt(id, status, reason, time.Now().UTC(), nil, facts)
}

// finishAt is finish for a job that ended at a known time (its process
// exited then): its duration does not include what was done after. stored,
// if set, sees the finished job before anyone waiting for it is woken.
func (e *Engine) finishAt(id string, status delegate.Status, reason string, at time.Time, stored func(*delegate.Job), facts func(*delegate.Job)) {
	ctx := context.WithoutCancel(e.ctx)
	e.flushJob(ctx, id)
	j, err := e.updateThen(ctx, id, stored, func(j *delegate.Job) error {
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
		e.log.Error("finish job", "job", id, "err", err)
		return
	}
	e.tokens.forget(id)
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
