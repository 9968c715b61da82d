package engine

import (
	"context"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// outputChunk is how much output is moved from the sandbox to the store at once.
const outputChunk = 256 << 10

// tracker moves one running job's output and status lines into the store:
// secrets redacted, output capped, Claude's stream-json read as progress.
type tracker struct {
	f      *follower
	id     string
	m      delegate.Manifest
	proc   sandbox.Process
	redact *redactor
	kept   int64 // output bytes stored
	// storeErr is why the store did not take the output the last
	// collect read (nil: it took all of it); that output is read again.
	storeErr error
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
	asks       questionScanner
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
	r := t.f
	t.storeErr = nil
	for moved := 0; final || moved < outputPerTick; {
		outs, err := t.proc.ReadOutput(ctx, t.next, outputChunk)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("read output", "job", t.id, "err", err)
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
		kept, stored := capOutput(chunk, r.cfg.OutputLimit-t.kept)
		if read != t.read || stored > 0 {
			// The chunk and how far the output was read, in one write.
			if err := r.appendOutput(ctx, t.id, kept, read); err != nil {
				r.log.Warn("store output", "job", t.id, "err", err)
				t.next, t.held = next, held
				t.storeErr = err
				return
			}
			if stored > 0 {
				r.jobs.notify(t.id) // subscribers of job://{id}/log
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
	asks := questionLinesPerTick // for all the reads below
	for moved := 0; moved < budget; {
		b, err := t.proc.ReadEvents(ctx, t.eventsRead, eventsChunk)
		if err != nil {
			return
		}
		t.eventsRead += int64(len(b))
		moved += len(b)
		lines, skipped := t.events.tail(b, final && len(b) == 0, keep)
		t.statusLines(lines, skipped)
		t.questionLines(ctx, b, final && len(b) == 0, &asks)
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
	if isQuestionLine([]byte(line)) {
		one := 1
		t.asks.take([]byte(line), &one, func(line string) { t.f.questions.statusLine(ctx, t.id, line) })
	}
}

// questionLines asks the questions among the status lines in b. Every
// line is looked at, not only those a flood leaves for the progress (see
// collectEvents): a question must not be lost among them. Each asked
// takes one of budget.
func (t *tracker) questionLines(ctx context.Context, b []byte, final bool, budget *int) {
	t.asks.questions(b, final, budget, func(line string) { t.f.questions.statusLine(ctx, t.id, line) })
}

func (t *tracker) timeline() bool { return t.m.StatusMode != delegate.StatusModeSimple }

// statusLines records status lines as progress (the timeline gets each,
// the progress the last), and counts lines skipped unread.
func (t *tracker) statusLines(lines []string, skipped int) {
	now := time.Now().UTC()
	if skipped > 0 {
		if t.timeline() {
			t.f.progress.dropped(t.id, int64(skipped))
		}
		t.f.progress.report(t.id, "", nil, false, now)
	}
	for _, line := range lines {
		t.f.progress.report(t.id, t.redact.string(parseStatusLine(line)), nil, t.timeline(), now)
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
	t.f.progress.report(t.id, progress, result, t.timeline(), time.Now().UTC())
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
