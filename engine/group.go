package engine

import (
	"context"
	"sync"
	"time"
)

// group is the one way the engine starts goroutines: each runs under the
// engine's life (ctx, cancelled by Close) and Close waits for every one of
// them, so none outlives the engine (TestCloseWaitsForItsGoroutines).
//
// The engine's goroutines and their owners:
//   - in the group, from Start: the maintenance timers (recovery and the
//     sweep, heartbeats, finishes seen in the store, the kept sandboxes'
//     timers) and the prune timer (group.every);
//   - in the group, as work comes: a job's run (the scheduler's slots), the
//     wait on its process and a re-attached or taken-over job's follower,
//     a watch (jobWriter.watch), the end of a job's network;
//   - the progress flusher, the progressWriter's own from New to the last
//     step of Close (progressWriter.close waits for it);
//   - the egress proxy's loops, the Egress's own from NewEgress to
//     Egress.Close (which waits for them);
//   - within one call, and waited for before it returns: the writer of
//     the archive a workspace import streams (workspaces.importWorkspace),
//     the openings of a fork's sandboxes (forks.openForks).
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{ctx: ctx, cancel: cancel}
}

// Go runs fn on a goroutine of the group.
func (g *group) Go(fn func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
}

// every runs fn at each interval until the group stops.
func (g *group) every(interval time.Duration, fn func(context.Context)) {
	g.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-g.ctx.Done():
				return
			case <-t.C:
				fn(g.ctx)
			}
		}
	})
}

// stop cancels the group's life and waits for its goroutines.
func (g *group) stop() {
	g.cancel()
	g.wg.Wait()
}

// stopping reports whether the group is stopping.
func (g *group) stopping() bool { return g.ctx.Err() != nil }
