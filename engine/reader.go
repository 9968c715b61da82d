package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// The read side of delegate.JobService: what a client may see of a job,
// and when. The adapters render these views; they hold no rules of their own.

var _ delegate.JobService = (*Engine)(nil)

// Reader is the read side of the job service, over the store alone: it
// needs no backend and starts no goroutine. An Engine reads through one
// (laying the progress it holds in memory over what is stored); a
// process that only reads jobs may use one by itself.
type Reader struct {
	store       delegate.Store
	audit       auditor // RecordApplied's entry
	artifactDir string
	poll        time.Duration // how often Wait reads again without a wake-up
	// unstored is the progress held in memory, not stored yet (nil for a
	// Reader alone: everything is in the store).
	unstored *progressBuffer
	// ends, if set, returns the wait for a job's end: its channel is
	// closed when this process ends the job (with the job as stored) or
	// sees that another process may have, so that Wait wakes at once, and
	// only then; release is called once Wait stops waiting.
	ends func(id string) (end *endWait, release func())
	// ended, if set, reads how a running job's command ended where no
	// live server drives it (Config.PeekEnd): a reader then says it ended.
	ended func(j *delegate.Job) (sandbox.Exit, bool)
}

// NewReader reads jobs from store; artifactDir is the engine's
// Config.ArtifactDir.
func NewReader(store delegate.Store, artifactDir string) *Reader {
	return &Reader{store: store, artifactDir: artifactDir, poll: 4 * 200 * time.Millisecond}
}

// Get returns a job, with the progress it reported that is not stored yet.
func (rd *Reader) Get(ctx context.Context, id string) (*delegate.Job, error) {
	var unstored progressSnapshot
	if rd.unstored != nil {
		unstored = rd.unstored.snapshot(id)
	}
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	unstored.apply(j)
	rd.sayEnded(j)
	return j, nil
}

// Wait blocks until the job is finished or ctx is done, and returns the
// job as it is then. It sees changes made by other processes too.
func (rd *Reader) Wait(ctx context.Context, id string) (*delegate.Job, error) {
	for {
		var (
			end     *endWait
			ended   <-chan struct{}
			release = func() {}
		)
		if rd.ends != nil {
			end, release = rd.ends(id)
			ended = end.c
		}
		// A read of the local store: it must not fail because the caller's
		// wait is up at that very moment.
		job, err := rd.Get(context.WithoutCancel(ctx), id)
		if err != nil || job.Status.Terminal() {
			release()
			return job, err
		}
		select {
		case <-ctx.Done():
			release()
			// The job as it is now: this wait did not wake for the
			// changes on its way.
			if now, err := rd.Get(context.WithoutCancel(ctx), id); err == nil {
				job = now
			}
			return job, nil
		case <-ended:
			if end.job != nil { // this process ended it: as stored then
				release()
				return end.job.Clone(), nil
			}
		case <-time.After(rd.poll):
		}
		release()
	}
}

// overlay lays the progress not stored yet over a job as stored.
func (rd *Reader) overlay(j *delegate.Job) {
	if rd.unstored != nil {
		rd.unstored.overlay(j)
	}
	rd.sayEnded(j)
}

// sayEnded shows a running job that no live server drives, whose command
// its sandbox recorded as ended, as ended: its exit code, and a progress
// that says so.
func (rd *Reader) sayEnded(j *delegate.Job) {
	if rd.ended != nil && j.Status == delegate.StatusRunning {
		if exit, ok := rd.ended(j); ok {
			// Its status stays: only a server records an end (with its
			// output and artifacts); this says what its sandbox recorded.
			code := exit.Code
			j.ExitCode = &code
			at := ""
			if !exit.EndedAt.IsZero() {
				at = " at " + exit.EndedAt.Local().Format(time.DateTime)
			}
			j.Progress = fmt.Sprintf("ended%s with exit code %d while no server ran (as its sandbox recorded); the next server records its end", at, code)
		}
	}
}

// summaryTaskRunes is how much of a task a job summary shows.
const summaryTaskRunes = 80

// List returns a page of job summaries, newest first.
func (rd *Reader) List(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
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
	jobs, next, err := rd.store.ListJobs(ctx, delegate.JobFilter{Status: opts.Status, Limit: limit, Cursor: opts.Cursor})
	if err != nil {
		return nil, err
	}
	page := &delegate.JobPage{Jobs: make([]delegate.JobSummary, 0, len(jobs)), NextCursor: next}
	for _, j := range jobs {
		rd.overlay(j)
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
		ExitReason: delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled), SandboxKept: sandboxKept(j),
		Sandbox: j.Sandbox, Principal: j.Principal,
	}
}

// sandboxKept: a finished persistent job whose sandbox has not been released.
func sandboxKept(j *delegate.Job) bool {
	return j.Status.Terminal() && j.Manifest.Lifecycle == delegate.LifecyclePersistent && j.SandboxID != "" && j.Manifest.Sandbox == ""
}

func statusNames() string {
	names := make([]string, len(delegate.Statuses))
	for i, s := range delegate.Statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Result returns a finished job's outcome with the end of its output.
func (rd *Reader) Result(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
	if opts.OutputTail < 0 {
		return nil, &delegate.FieldError{Field: "max_output_bytes", Rule: fmt.Sprintf("must be positive (got %d)", opts.OutputTail)}
	}
	tail := opts.OutputTail
	if tail == 0 {
		tail = delegate.DefaultOutputTail
	}
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if !j.Status.Terminal() {
		return nil, fmt.Errorf("job %s is %s: %w: its result is there when it ends", id, j.Status, delegate.ErrNotFinished)
	}
	out, outOffset, err := rd.streamTail(ctx, id, delegate.StreamStdout, tail)
	if err != nil {
		return nil, err
	}
	errs, errOffset, err := rd.streamTail(ctx, id, delegate.StreamStderr, tail)
	if err != nil {
		return nil, err
	}
	arts, err := rd.store.Artifacts(ctx, id)
	if err != nil {
		return nil, err
	}
	if arts == nil {
		arts = []delegate.Artifact{}
	}
	changes, err := rd.resultChanges(ctx, j)
	if err != nil {
		return nil, err
	}
	return &delegate.JobResult{
		JobID: j.ID, Status: j.Status, ExitCode: j.ExitCode, ExitReason: delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled),
		Output: out, OutputOffset: outOffset, Stderr: errs, StderrOffset: errOffset,
		OutputBytes: j.OutputBytes, OutputTruncated: j.OutputTruncated,
		OutputLostBytes: j.OutputLostBytes, OutputLost: j.OutputLost, CacheMissed: j.CacheMissed,
		Error: resultError(j), Result: j.Result, OOMKilled: j.OOMKilled, Artifacts: arts, Changes: changes,
		StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, Duration: j.Duration(time.Now()),
		Sandbox: j.Sandbox,
		Network: rd.networkResult(ctx, j),
	}, nil
}

// streamTail reads the end of one stream kept, at most tail bytes, and
// where it starts in that stream.
func (rd *Reader) streamTail(ctx context.Context, id string, s delegate.Stream, tail int) ([]byte, int64, error) {
	b, kept, err := rd.store.StreamTail(ctx, id, s, tail)
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
func (rd *Reader) Logs(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
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
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if !j.Status.Terminal() && j.Manifest.StatusMode != delegate.StatusModeStreaming {
		return nil, fmt.Errorf("job %s is %s and was submitted with statusMode %s: its output is readable when it ends "+
			"(submit with statusMode streaming to read it while it runs): %w", j.ID, j.Status, j.Manifest.StatusMode, delegate.ErrNotFinished)
	}
	kept, err := rd.store.OutputSize(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	if opts.Tail {
		offset = max(0, kept-int64(size))
	}
	pieces, err := rd.store.ReadOutput(ctx, j.ID, offset, size)
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
func (rd *Reader) Timeline(ctx context.Context, id string) ([]delegate.Event, error) {
	m, err := rd.store.JobManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.StatusMode == delegate.StatusModeSimple {
		return nil, nil
	}
	evs, err := rd.store.Events(ctx, id)
	if err != nil {
		return nil, err
	}
	if rd.unstored != nil {
		evs, _ = rd.unstored.timeline(id, evs)
	}
	return evs, nil
}

// Artifacts lists a job's artifacts.
func (rd *Reader) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	return rd.store.Artifacts(ctx, id)
}

// ReadArtifact returns the content of a job's artifact, checked against
// its recorded sha256.
func (rd *Reader) ReadArtifact(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
	// One read by name: a job may keep 10,000 of them, each read in turn
	// (the whole list each time made saving them all quadratic).
	a, err := rd.store.Artifact(ctx, id, name)
	if err != nil && !errors.Is(err, delegate.ErrNotFound) {
		return delegate.Artifact{}, nil, err
	}
	found := err == nil
	var arts []delegate.Artifact
	if !found {
		// Not found: the list says what there is (or the job is unknown).
		if arts, err = rd.store.Artifacts(ctx, id); err != nil {
			return delegate.Artifact{}, nil, err
		}
	}
	if found {
		if a.Skipped != "" || !sha256RE().MatchString(a.SHA256) {
			return a, nil, &delegate.NotFoundError{Resource: "artifact", ID: name, Of: "job " + id, Reason: "not kept: " + a.Skipped}
		}
		data, err := rd.readBlob(ctx, a.SHA256)
		if err != nil {
			return a, nil, fmt.Errorf("artifact %q of job %s: %w", name, id, err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != a.SHA256 {
			return a, nil, fmt.Errorf("artifact %q of job %s is corrupt on disk (sha256 mismatch)", name, id)
		}
		return a, data, nil
	}
	if _, err := rd.store.GetJob(ctx, id); err != nil {
		return delegate.Artifact{}, nil, err
	}
	nf := delegate.ArtifactNotFound(id, name)
	nf.There = artifactNames(arts)
	return delegate.Artifact{}, nil, nf
}

// readBlob reads an artifact's content: from the store where it keeps
// them, else (or where it has not this one: collected into a directory
// before the store kept them) from the artifact directory.
func (rd *Reader) readBlob(ctx context.Context, sum string) ([]byte, error) {
	if blobs, ok := rd.store.(delegate.BlobStore); ok {
		data, err := blobs.Blob(ctx, sum)
		if !errors.Is(err, delegate.ErrNotFound) {
			return data, err
		}
	}
	return os.ReadFile(blobPath(rd.artifactDir, sum))
}

// maxNamesShown bounds the names a not-found error lists.
const maxNamesShown = 20

// artifactNames says which artifacts a job has, for an error about one it
// does not have.
func artifactNames(arts []delegate.Artifact) string {
	if len(arts) == 0 {
		return "the job kept no artifacts"
	}
	names := make([]string, 0, min(len(arts), maxNamesShown))
	for _, a := range arts[:min(len(arts), maxNamesShown)] {
		names = append(names, strconv.Quote(a.Name))
	}
	s := "the job's artifacts: " + strings.Join(names, ", ")
	if len(arts) > maxNamesShown {
		s += fmt.Sprintf(" and %d more", len(arts)-maxNamesShown)
	}
	return s
}

// resultError is a job's error, and that its output is incomplete when
// some of it could not be stored: a result never reads as whole when it
// is not, whatever its status.
func resultError(j *delegate.Job) string {
	if j.OutputLostBytes <= 0 {
		return j.Error
	}
	lost := fmt.Sprintf("output incomplete: %d bytes of it were lost (%s)", j.OutputLostBytes, j.OutputLost)
	if j.Error == "" {
		return lost
	}
	return j.Error + "; " + lost
}
