package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// Progress is coalesced in memory and stored in batches. A job may report
// thousands of lines a second (its status file, callbacks, Claude's
// stream-json); what a reader needs is the latest message, the newest
// timeline entries and a recent sign of life. So every report only
// changes the job's entry here, and a flusher stores the entries of all
// jobs in one transaction, each job at most every progressEvery, and at
// once when the job ends (finish flushes it before the terminal write).
//
// Reads see what is not stored yet: the engine lays the pending entry over
// what the store returns (overlay), so nothing waits for a flush.
//
// Durability: progress may be lost with the process (up to progressEvery
// of it); what must survive — a job's end, its output, its token — is
// written through, before the call that caused it returns.

// progressEvery is how often one job's progress is stored at most.
const progressEvery = 250 * time.Millisecond

// gatherDelay lets reports that arrive together share one transaction.
const gatherDelay = 2 * time.Millisecond

// pending is one job's progress not stored yet: p since the last flush,
// flying what that flush is storing (still laid over reads until it is in).
type pending struct {
	p, flying       delegate.JobProgress
	dirty, inFlight bool
	lastFlush       time.Time
}

type progressBuffer struct {
	mu   sync.Mutex
	jobs map[string]*pending
	wake chan struct{} // a job has something to store
}

func newProgressBuffer() *progressBuffer {
	return &progressBuffer{jobs: make(map[string]*pending), wake: make(chan struct{}, 1)}
}

// report records a sign of life, and perhaps a progress message (kept in
// the timeline when timeline is set) and a result text.
func (b *progressBuffer) report(id, progress string, result *string, timeline bool, now time.Time) {
	b.mu.Lock()
	p := b.entry(id)
	p.p.Heartbeat = now
	if progress != "" {
		p.p.Progress = progress
		if timeline {
			p.addEvents(delegate.Event{Time: now, Message: progress})
		}
	}
	if result != nil {
		r := *result
		p.p.Result = &r
	}
	b.mu.Unlock()
	b.poke()
}

// event adds a timeline entry without changing the job's progress: a
// step of the engine's own, told after the fact.
func (b *progressBuffer) event(id, msg string, now time.Time) {
	b.mu.Lock()
	b.entry(id).addEvents(delegate.Event{Time: now, Message: msg})
	b.mu.Unlock()
	b.poke()
}

// dropped counts timeline entries a job sent that were never kept.
func (b *progressBuffer) dropped(id string, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.entry(id).p.Dropped += n
	b.mu.Unlock()
	b.poke()
}

func (b *progressBuffer) entry(id string) *pending {
	p := b.jobs[id]
	if p == nil {
		p = &pending{}
		b.jobs[id] = p
	}
	p.p.ID = id
	p.dirty = true
	return p
}

// addEvents appends to the pending timeline, keeping the newest
// MaxTimeline and counting the rest.
func (p *pending) addEvents(evs ...delegate.Event) {
	p.p.Events = append(p.p.Events, evs...)
	if over := len(p.p.Events) - delegate.MaxTimeline; over > 0 {
		p.p.Dropped += int64(over)
		p.p.Events = append(p.p.Events[:0], p.p.Events[over:]...)
	}
}

func (b *progressBuffer) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// take hands over what is due (all of it with force) to be stored, and
// says when the next job becomes due (zero: nothing is waiting). What it
// hands over stays visible to reads until landed.
func (b *progressBuffer) take(now time.Time, force bool) (batch []delegate.JobProgress, next time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, p := range b.jobs {
		if !p.dirty {
			if !p.inFlight && now.Sub(p.lastFlush) >= progressEvery {
				delete(b.jobs, id) // quiet: nothing to hold back any more
			}
			continue
		}
		due := p.lastFlush.Add(progressEvery)
		if force || !now.Before(due) {
			batch = append(batch, p.hand(now))
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return batch, next
}

// hand moves the pending progress to flying.
func (p *pending) hand(now time.Time) delegate.JobProgress {
	p.flying, p.inFlight = p.p, true
	p.p = delegate.JobProgress{}
	p.dirty, p.lastFlush = false, now
	return p.flying
}

// takeJob hands over one job's pending progress, due or not.
func (b *progressBuffer) takeJob(id string) (delegate.JobProgress, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.jobs[id]
	if p == nil || !p.dirty {
		return delegate.JobProgress{}, false
	}
	return p.hand(time.Now()), true
}

// landed says that what was handed over for these jobs is stored.
func (b *progressBuffer) landed(batch []delegate.JobProgress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bp := range batch {
		if p := b.jobs[bp.ID]; p != nil {
			p.flying, p.inFlight = delegate.JobProgress{}, false
		}
	}
}

// overlay lays a job's progress not stored yet over the job as stored.
func (b *progressBuffer) overlay(j *delegate.Job) {
	if j != nil {
		b.snapshot(j.ID).apply(j)
	}
}

// progressSnapshot is a copy of a job's progress not stored yet.
type progressSnapshot []delegate.JobProgress

// snapshot copies what is not stored yet of job id. A reader takes it
// before it reads the store, so that a flush landing in between is seen
// in one or the other (a moment's double count of dropped entries at
// worst, never a step back).
func (b *progressBuffer) snapshot(id string) progressSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.jobs[id]
	if p == nil {
		return nil
	}
	var s progressSnapshot
	if p.inFlight {
		s = append(s, p.flying)
	}
	if p.dirty {
		s = append(s, p.p)
	}
	return s
}

func (s progressSnapshot) apply(j *delegate.Job) {
	if j.Status.Terminal() {
		return
	}
	for i := range s {
		apply(j, &s[i])
	}
}

func apply(j *delegate.Job, p *delegate.JobProgress) {
	if p.Progress != "" {
		j.Progress = p.Progress
	}
	if p.Result != nil {
		j.Result = *p.Result
	}
	if p.Heartbeat.After(j.LastHeartbeat) {
		j.LastHeartbeat = p.Heartbeat
	}
	j.TimelineDropped += p.Dropped
}

// timeline lays the timeline entries not stored yet after the stored
// ones, keeping the newest MaxTimeline, and returns how many more that
// drops.
func (b *progressBuffer) timeline(id string, stored []delegate.Event) ([]delegate.Event, int64) {
	b.mu.Lock()
	p := b.jobs[id]
	var more []delegate.Event
	if p != nil && p.inFlight {
		more = append(more, p.flying.Events...)
	}
	if p != nil && p.dirty {
		more = append(more, p.p.Events...)
	}
	b.mu.Unlock()
	if len(more) == 0 {
		return stored, 0
	}
	all := append(stored, more...)
	over := max(0, len(all)-delegate.MaxTimeline)
	return all[over:], int64(over)
}

// progressWriter is the part that stores the buffer: one flusher, from
// the engine's making to its Close (even an engine never started — the
// CLI reading jobs — may record some), and flushes of one job on demand.
type progressWriter struct {
	*progressBuffer
	store  delegate.Store
	notify func(id string)
	log    *slog.Logger

	flushMu sync.Mutex    // one flush at a time
	stopped chan struct{} // closed by close once the rest has stopped
	done    chan struct{} // closed when the last progress is stored
	once    sync.Once
	lost    error // why the last progress could not be stored (set before done is closed)
}

func newProgressWriter(store delegate.Store, notify func(string), log *slog.Logger) *progressWriter {
	w := &progressWriter{progressBuffer: newProgressBuffer(), store: store, notify: notify, log: log,
		stopped: make(chan struct{}), done: make(chan struct{})}
	go w.flushLoop() // ended by close, the last thing Engine.Close does
	return w
}

// close stores what is left and stops the flusher. The engine calls it
// once nothing reports any more. It returns why what was reported last
// could not be stored, if it could not.
func (w *progressWriter) close() error {
	w.once.Do(func() { close(w.stopped) })
	<-w.done
	return w.lost
}

// flushLoop stores pending progress until close, then stores what is left.
func (w *progressWriter) flushLoop() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-w.stopped:
			_, w.lost = w.flush(true)
			return
		case <-w.wake:
		case <-timer.C:
		}
		// Let the reports that arrive together go in one transaction.
		select {
		case <-w.stopped:
			_, w.lost = w.flush(true)
			return
		case <-time.After(gatherDelay):
		}
		next, _ := w.flush(false)
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), gatherDelay))
		}
	}
}

// flush stores what is due (everything with force) in one transaction and
// tells watchers; it returns when more will be due, and why the batch
// could not be stored.
func (w *progressWriter) flush(force bool) (time.Time, error) {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	batch, next := w.take(time.Now(), force)
	if len(batch) == 0 {
		return next, nil
	}
	err := w.store.SaveProgress(context.Background(), batch)
	w.landed(batch)
	if err != nil {
		// Progress is not worth stopping for: the next report replaces it.
		w.log.Warn("store progress", "jobs", len(batch), "err", err)
		return next, fmt.Errorf("store the progress of %d jobs: %w", len(batch), err)
	}
	for _, p := range batch {
		w.notify(p.ID)
	}
	return next, nil
}

// flushJob stores a job's pending progress now (before its end is
// written, so that its last messages come before it). Flushes are one at
// a time, so that an older batch never lands after a newer one.
func (w *progressWriter) flushJob(ctx context.Context, id string) {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	p, ok := w.takeJob(id)
	if !ok {
		return
	}
	err := w.store.SaveProgress(ctx, []delegate.JobProgress{p})
	w.landed([]delegate.JobProgress{p})
	if err != nil {
		w.log.Warn("store progress", "job", id, "err", err)
	}
}
