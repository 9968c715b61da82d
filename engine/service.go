package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
)

// The read side of delegate.JobService: what a client may see of a job,
// and when. The adapters render these views; they hold no rules of their own.

var _ delegate.JobService = (*Engine)(nil)

// summaryTaskRunes is how much of a task a job summary shows.
const summaryTaskRunes = 80

// List returns a page of job summaries, newest first.
func (e *Engine) List(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
	if opts.Status != "" && !opts.Status.Valid() {
		return nil, &delegate.FieldError{Field: "status", Rule: fmt.Sprintf("must be one of %s (got %q)", statusNames(), opts.Status)}
	}
	if opts.Limit < 0 || opts.Limit > delegate.MaxPageSize {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxPageSize, opts.Limit)}
	}
	limit := opts.Limit
	if limit == 0 {
		limit = delegate.DefaultPageSize
	}
	jobs, next, err := e.store.ListJobs(ctx, delegate.JobFilter{Status: opts.Status, Limit: limit, Cursor: opts.Cursor})
	if err != nil {
		return nil, err
	}
	page := &delegate.JobPage{Jobs: make([]delegate.JobSummary, 0, len(jobs)), NextCursor: next}
	for _, j := range jobs {
		e.progress.overlay(j)
		page.Jobs = append(page.Jobs, summary(j))
	}
	return page, nil
}

func summary(j *delegate.Job) delegate.JobSummary {
	task := j.Manifest.Task
	if task == "" && j.Manifest.Agent != nil {
		task = j.Manifest.Agent.Command
	}
	if r := []rune(task); len(r) > summaryTaskRunes {
		task = string(r[:summaryTaskRunes-1]) + "…"
	}
	return delegate.JobSummary{
		ID: j.ID, Status: j.Status, AgentType: j.Manifest.AgentType, Task: task, Progress: j.Progress,
		CreatedAt: j.CreatedAt, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, ExitCode: j.ExitCode,
		SandboxKept: sandboxKept(j),
	}
}

// sandboxKept: a finished persistent job whose sandbox has not been released.
func sandboxKept(j *delegate.Job) bool {
	return j.Status.Terminal() && j.Manifest.Lifecycle == delegate.LifecyclePersistent && j.SandboxID != ""
}

func statusNames() string {
	names := make([]string, len(delegate.Statuses))
	for i, s := range delegate.Statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Result returns a finished job's outcome with the end of its output.
func (e *Engine) Result(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
	if opts.OutputTail < 0 {
		return nil, &delegate.FieldError{Field: "max_output_bytes", Rule: fmt.Sprintf("must be positive (got %d)", opts.OutputTail)}
	}
	tail := opts.OutputTail
	if tail == 0 {
		tail = delegate.DefaultOutputTail
	}
	j, err := e.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if !j.Status.Terminal() {
		return nil, fmt.Errorf("job %s is %s: %w: its result is there when it ends", id, j.Status, delegate.ErrNotFinished)
	}
	out, outOffset, err := e.streamTail(ctx, id, delegate.StreamStdout, tail)
	if err != nil {
		return nil, err
	}
	errs, errOffset, err := e.streamTail(ctx, id, delegate.StreamStderr, tail)
	if err != nil {
		return nil, err
	}
	arts, err := e.store.Artifacts(ctx, id)
	if err != nil {
		return nil, err
	}
	if arts == nil {
		arts = []delegate.Artifact{}
	}
	return &delegate.JobResult{
		JobID: j.ID, Status: j.Status, ExitCode: j.ExitCode,
		Output: out, OutputOffset: outOffset, Stderr: errs, StderrOffset: errOffset,
		OutputBytes: j.OutputBytes, OutputTruncated: j.OutputTruncated,
		Error: j.Error, Result: j.Result, OOMKilled: j.OOMKilled, Artifacts: arts,
		StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, Duration: j.Duration(time.Now()),
	}, nil
}

// streamTail reads the end of one stream kept, at most tail bytes, and
// where it starts in that stream.
func (e *Engine) streamTail(ctx context.Context, id string, s delegate.Stream, tail int) ([]byte, int64, error) {
	b, kept, err := e.store.StreamTail(ctx, id, s, tail)
	if err != nil {
		return nil, 0, err
	}
	offset := kept - int64(len(b))
	if offset > 0 {
		b, offset = trimLeadingPartialRune(b, offset)
	}
	return b, offset, nil
}

// trimLeadingPartialRune drops the continuation bytes of a UTF-8 sequence
// that the offset cut in two, and moves the offset past them.
func trimLeadingPartialRune(b []byte, offset int64) ([]byte, int64) {
	for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b, offset = b[1:], offset+1
	}
	return b, offset
}

// Logs reads a job's output from a cursor. While the job runs it is
// readable only in statusMode streaming: the other modes promise nothing
// but the end result, and the output is theirs when the job ends.
func (e *Engine) Logs(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
	size := opts.MaxBytes
	if size < 0 || size > delegate.MaxLogBytes {
		return nil, &delegate.FieldError{Field: "max_bytes", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxLogBytes, size)}
	}
	if size == 0 {
		size = delegate.DefaultLogBytes
	}
	var offset int64
	if opts.Cursor != "" && !opts.Tail {
		n, err := strconv.ParseInt(opts.Cursor, 10, 64)
		if err != nil || n < 0 {
			return nil, &delegate.FieldError{Field: "cursor", Rule: "must be a next_cursor from a previous read of the logs"}
		}
		offset = n
	}
	j, err := e.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if !j.Status.Terminal() && j.Manifest.StatusMode != delegate.StatusModeStreaming {
		return nil, fmt.Errorf("job %s is %s and was submitted with statusMode %s: its output is readable when it ends "+
			"(submit with statusMode streaming to read it while it runs): %w", j.ID, j.Status, j.Manifest.StatusMode, delegate.ErrNotFinished)
	}
	kept, err := e.store.OutputSize(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	if opts.Tail {
		offset = max(0, kept-int64(size))
	}
	pieces, err := e.store.ReadOutput(ctx, j.ID, offset, size)
	if err != nil {
		return nil, err
	}
	b := delegate.JoinOutput(pieces)
	var from int64 // bytes trimmed from the start
	if opts.Tail && offset > 0 {
		b, from = trimLeadingPartialRune(b, 0)
		offset += from
	}
	// Never split a UTF-8 sequence: hold an incomplete tail for the next
	// page, unless this is the end of a finished job's output (then it is
	// what the job wrote last).
	if !j.Status.Terminal() || offset+int64(len(b)) < kept {
		b = trimIncompleteRune(b)
	}
	next := offset + int64(len(b))
	return &delegate.LogPage{
		JobID: j.ID, Status: j.Status, Output: b, Streams: streamsOf(pieces, int(from), b), Offset: offset,
		NextCursor: strconv.FormatInt(next, 10),
		Done:       j.Status.Terminal() && next >= kept,
	}, nil
}

// streamsOf cuts b, the bytes of pieces without the first skip and cut
// at its length, into pieces of the same streams: slices of b.
func streamsOf(pieces []delegate.Output, skip int, b []byte) []delegate.Output {
	var out []delegate.Output
	for _, p := range pieces {
		if len(b) == 0 {
			break
		}
		d := min(skip, len(p.Data))
		skip -= d
		if k := min(len(p.Data)-d, len(b)); k > 0 {
			out = append(out, delegate.Output{Stream: p.Stream, Data: b[:k:k]})
			b = b[k:]
		}
	}
	return out
}

// trimIncompleteRune drops a UTF-8 sequence cut off at the end of b.
func trimIncompleteRune(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < utf8.RuneSelf {
			return b
		}
		if utf8.RuneStart(c) { // a start byte: is its sequence complete?
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// Timeline returns a job's progress history, the newest
// delegate.MaxTimeline entries (Job.TimelineDropped counts the others),
// with those not stored yet. Only statusMode detailed and streaming keep
// one.
func (e *Engine) Timeline(ctx context.Context, id string) ([]delegate.Event, error) {
	m, err := e.store.JobManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.StatusMode == delegate.StatusModeSimple {
		return nil, nil
	}
	evs, err := e.store.Events(ctx, id)
	if err != nil {
		return nil, err
	}
	evs, _ = e.progress.timeline(id, evs)
	return evs, nil
}

// Watch delivers the id of every job this engine changes until ctx ends.
func (e *Engine) Watch(ctx context.Context) <-chan string {
	w := make(chan string, 64)
	e.mu.Lock()
	e.watches[w] = struct{}{}
	e.mu.Unlock()
	go func() {
		<-ctx.Done()
		// notify sends under the same lock: after this no send can happen.
		e.mu.Lock()
		delete(e.watches, w)
		close(w)
		e.mu.Unlock()
	}()
	return w
}
