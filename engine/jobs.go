package engine

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/delegate-dev/delegate"
)

// jobWriter is the part every change of a job goes through: it writes the
// job through the store (whose transaction enforces the state machine),
// tells the parts that care when a job reaches its end, and wakes the
// waiters and watchers of the job. It holds its own lock only to hand out
// and replace its channels.
type jobWriter struct {
	store delegate.Store

	// ended hears every job this writer (or watchFinishes, for another
	// process) saw reach a terminal status, as stored then (not to be
	// changed). Given at construction.
	ended func(j *delegate.Job)

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	watches map[chan string]struct{}
	// ends has, for each job being waited for, a channel closed when it
	// ends here, or when another process may have changed jobs, and how
	// many waiters hold it: the last to stop waiting removes it.
	ends map[string]*endWait

	// own counts the jobs this engine has finished; foreign moves when the
	// store's finish counter shows that another process finished one
	// (see maintenance.watchFinishes).
	own, foreign atomic.Int64

	// lease, where servers share the store, fences this engine's writes
	// as a job's owner (lease.go); nil: none. Set by New before use.
	lease *leaser
}

func newJobWriter(store delegate.Store, ended func(j *delegate.Job)) *jobWriter {
	return &jobWriter{store: store, ended: ended, changed: make(chan struct{}), watches: make(map[chan string]struct{}), ends: make(map[string]*endWait)}
}

// update changes a stored job and wakes waiters. Every change of status
// this engine makes goes through here, so that the job's end is known to
// its follower and the callback index at once.
func (w *jobWriter) update(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	return w.updateThen(ctx, id, nil, fn)
}

// updateThen is update, with stored (if set) called with the job as
// stored before anyone is told of the change.
func (w *jobWriter) updateThen(ctx context.Context, id string, stored func(*delegate.Job), fn func(*delegate.Job) error) (*delegate.Job, error) {
	var before delegate.Status
	ctx, err := w.lease.fence(ctx, id)
	if err != nil {
		w.lease.refused(id, err)
		return nil, err
	}
	j, err := w.store.UpdateJob(ctx, id, func(j *delegate.Job) error {
		before = j.Status
		return fn(j)
	})
	if err != nil {
		w.lease.refused(id, err)
		return j, err
	}
	if stored != nil {
		stored(j)
	}
	if !before.Terminal() && j.Status.Terminal() {
		w.own.Add(1)
		w.ended(j)
		w.mu.Lock()
		if e, ok := w.ends[id]; ok {
			e.job = j.Clone() // j goes back to the caller, who may change it
			close(e.c)
			delete(w.ends, id)
		}
		w.mu.Unlock()
	}
	w.notify(id)
	return j, nil
}

// endWait is the channel of the waiters for one job's end.
type endWait struct {
	c       chan struct{}
	waiters int
	// job, set before c is closed, is the job as this process stored its
	// end (its waiters need not read it again; terminal, it has no
	// progress unstored); nil when c was closed because another process
	// may have changed jobs. Not to be changed: each waiter clones it.
	job *delegate.Job
}

// endOf returns the wait for job id's end by this process's hand, whose
// channel is also closed when another process may have changed jobs
// (notify("")): a waiter for a job's end reads the job again only then.
// The waiter calls release once it stops waiting on it: a job that had
// ended before (a wait for a finished job) is never closed here, and its
// channel would stay for the server's life.
func (w *jobWriter) endOf(id string) (end *endWait, release func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.ends[id]
	if !ok {
		e = &endWait{c: make(chan struct{})}
		w.ends[id] = e
	}
	e.waiters++
	return e, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if cur := w.ends[id]; cur == e {
			if e.waiters--; e.waiters == 0 {
				delete(w.ends, id)
			}
		}
	}
}

// wake wakes the waiters for any change (not those for a job's end): a
// sandbox changed.
func (w *jobWriter) wake() {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// notify wakes waiters, and tells watchers that job id changed ("": some
// job, changed by another process).
func (w *jobWriter) notify(id string) {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	if id == "" {
		for id, e := range w.ends {
			close(e.c)
			delete(w.ends, id)
		}
		w.mu.Unlock()
		return
	}
	w.tell(id)
	w.mu.Unlock()
}

// heard wakes the waiters for job id's end, and tells watchers, where
// another process changed it (the store's feed told this one).
func (w *jobWriter) heard(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.changed)
	w.changed = make(chan struct{})
	if e, ok := w.ends[id]; ok {
		close(e.c) // job nil: the waiters read it again
		delete(w.ends, id)
	}
	w.tell(id)
}

// tell sends id to every watcher; w.mu is held.
func (w *jobWriter) tell(id string) {
	for c := range w.watches {
		select {
		case c <- id:
		default: // a slow watcher misses a wake-up, not the state: it re-reads
		}
	}
}

// changes returns a channel closed at the next change.
func (w *jobWriter) changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// watch delivers the id of every job changed until ctx or life ends.
func (w *jobWriter) watch(ctx context.Context, g *group) <-chan string {
	c := make(chan string, 64)
	w.mu.Lock()
	w.watches[c] = struct{}{}
	w.mu.Unlock()
	g.Go(func() {
		select {
		case <-ctx.Done():
		case <-g.ctx.Done():
		}
		// notify sends under the same lock: after this no send can happen.
		w.mu.Lock()
		delete(w.watches, c)
		close(c)
		w.mu.Unlock()
	})
	return c
}
