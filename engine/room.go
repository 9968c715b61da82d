package engine

import "sync"

// roomSignal tells the jobs waiting for capacity that this engine has
// freed room (a job ended, a sandbox was destroyed): a channel closed and
// replaced at each freeing, so that a waiter that took it before it
// asked the backend misses none. The scheduler waits on it; the finisher,
// a release and the scheduler's own runs fire it.
type roomSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newRoomSignal() *roomSignal { return &roomSignal{ch: make(chan struct{})} }

// wait returns the channel the next freeing closes.
func (r *roomSignal) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// freed wakes the jobs waiting for capacity.
func (r *roomSignal) freed() {
	r.mu.Lock()
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}
