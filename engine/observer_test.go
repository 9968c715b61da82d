package engine_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// observer records what the engine tells it.
type observer struct {
	mu     sync.Mutex
	starts []string
	ends   []string
	ran    []time.Duration
}

func (o *observer) SandboxStarted(backend string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts = append(o.starts, backend)
}

func (o *observer) JobEnded(backend string, status delegate.Status, ran time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends = append(o.ends, backend+"/"+string(status))
	o.ran = append(o.ran, ran)
}

func (o *observer) seen() ([]string, []string, []time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.starts...), append([]string(nil), o.ends...), append([]time.Duration(nil), o.ran...)
}

func TestObserverHearsStartsAndEnds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		obs := &observer{}
		f := newFixture(t, engine.Config{Observer: obs})
		ctx := context.Background()

		ok := f.submit(script("true"))
		p := f.started()
		passTime(20 * time.Millisecond) // it runs a little while
		p.Finish(sandbox.Exit{Code: 0})
		f.wait(f.eng, ok.ID)

		cancelled := f.submit(script("sleep 100"))
		f.started()
		if _, _, err := f.eng.Cancel(ctx, cancelled.ID); err != nil {
			t.Fatal(err)
		}
		f.wait(f.eng, cancelled.ID)

		// A job cancelled while its sandbox was being created never ran:
		// neither a start nor an end to observe.
		f.backend.CreateHook = func(ctx context.Context, spec sandbox.Spec) error { <-ctx.Done(); return ctx.Err() }
		never := f.submit(script("true"))
		if _, _, err := f.eng.Cancel(ctx, never.ID); err != nil {
			t.Fatal(err)
		}
		f.wait(f.eng, never.ID)

		// The cancelled job's end is observed once its follower has
		// settled it, after Cancel has woken the wait.
		eventually(t, "two job ends observed", func() bool {
			_, ends, _ := obs.seen()
			return len(ends) >= 2
		})
		starts, ends, ran := obs.seen()
		if len(starts) != 2 || starts[0] != "mock" {
			t.Errorf("sandbox starts %v, want two on mock", starts)
		}
		if len(ends) != 2 || ends[0] != "mock/success" || ends[1] != "mock/cancelled" {
			t.Errorf("job ends %v, want mock/success then mock/cancelled", ends)
		}
		// Held 20ms from its Exec; the engine records its start just after
		// Exec returns, so a little less may be counted.
		if ran[0] < 10*time.Millisecond || ran[0] > 5*time.Second {
			t.Errorf("the first job ran %s, want about the 20ms it was held", ran[0])
		}
	})
}
