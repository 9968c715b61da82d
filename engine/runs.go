package engine

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/delegate-dev/delegate"
)

// runs is the table of the jobs this engine drives, a handle each, under
// its own lock: what a cancel, the heartbeat watchdog and the sweep ask
// about a job this engine runs. The starter, the follower of a job
// re-attached after a restart and the orphans part register a job; the
// handle goes when its run lets go of it.
type runs struct {
	life *group

	mu   sync.Mutex
	runs map[string]*run // jobs this engine is driving
}

func newRuns(life *group) *runs { return &runs{life: life, runs: make(map[string]*run)} }

// run is the handle on one job this engine drives.
type run struct {
	cancel context.CancelFunc // aborts provisioning
	kill   chan struct{}      // closed to kill the running process
	once   sync.Once
	// abandon is closed when this engine gives the job up (another server
	// adopted it): its follower stops, its sandbox left to the adopter.
	abandon     chan struct{}
	abandonOnce sync.Once
	// end is the terminal status the job reached while it still runs (a
	// completion callback, a cancel, here or in another process).
	end atomic.Pointer[delegate.Status]
	// exited: its process has ended, and its follower is settling it (its
	// heartbeat is no longer judged: its end is).
	exited atomic.Bool
}

func (r *run) killNow() { r.once.Do(func() { close(r.kill) }) }

func (r *runs) register(id string) (*run, context.Context) {
	ctx, cancel := context.WithCancel(r.life.ctx)
	h := &run{cancel: cancel, kill: make(chan struct{}), abandon: make(chan struct{})}
	r.mu.Lock()
	r.runs[id] = h
	r.mu.Unlock()
	return h, ctx
}

func (r *runs) unregister(id string) {
	r.mu.Lock()
	if h := r.runs[id]; h != nil {
		h.cancel()
		delete(r.runs, id)
	}
	r.mu.Unlock()
}

// handle returns the handle of a job this engine drives, or nil.
func (r *runs) handle(id string) *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// drives reports whether this engine is driving a job (it has not let go
// of it yet: it may be destroying its sandbox).
func (r *runs) drives(id string) bool { return r.handle(id) != nil }

// driven lists the jobs this engine drives.
func (r *runs) driven() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.runs))
	for id := range r.runs {
		ids = append(ids, id)
	}
	return ids
}

// stop aborts a job's provisioning and kills its process, if this engine
// drives it.
func (r *runs) stop(id string) {
	if h := r.handle(id); h != nil {
		h.cancel()
		h.killNow()
	}
}

// abandon stops driving a job without touching its sandbox (another
// server holds it now): its provisioning is aborted, its follower stops.
func (r *runs) abandon(id string) {
	if h := r.handle(id); h != nil {
		h.abandonOnce.Do(func() { close(h.abandon) })
		h.cancel()
	}
}

// ended records that job id has reached a terminal status: its follower
// (if this engine drives it) winds it up.
func (r *runs) ended(id string, st delegate.Status) {
	if h := r.handle(id); h != nil {
		h.end.Store(&st)
	}
}

// registry is what the parts that drive a job (the starter, the follower
// of a re-attached job, the orphans part) ask of the table: a job's
// handle made, and dropped when its run lets go of it.
type registry interface {
	register(id string) (*run, context.Context)
	unregister(id string)
}
