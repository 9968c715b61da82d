package engine

import (
	"context"
	"time"
)

// The end of a job (its last output, its status) is retried until the
// store takes it (a full disk, a store that does not answer), waiting
// retryFirst at first, twice as long each time after, up to retryMax; its
// sandbox is kept meanwhile. Only the engine's own end stops the retries:
// the job is then still running in the store, its sandbox there, and the
// next server settles it.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// sleepCtx waits d, or until ctx ends; it tells whether to go on.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// nextWait is the wait after w.
func nextWait(w time.Duration) time.Duration { return min(2*w, retryMax) }
