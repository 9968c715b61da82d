package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestCloseWaitsForItsGoroutines: every goroutine an engine starts (its
// parts' loops and timers, the progress flusher, a job's follower and the
// wait on its process, a watch) has ended when Close returns, a job still
// running and a watch still open: none outlives the engine. The engine
// runs under a profiler label of its own, which its goroutines inherit,
// so that the other tests' goroutines are not counted.
func TestCloseWaitsForItsGoroutines(t *testing.T) {
	t.Parallel()
	label := "goroutine-owner-" + t.Name()
	var eng *engine.Engine
	pprof.Do(context.Background(), pprof.Labels("test", label), func(ctx context.Context) {
		f := newFixture(t, engine.Config{})
		eng = f.eng
		done := f.submit(script("true"))
		f.started().Finish(sandbox.Exit{})
		f.wait(eng, done.ID)
		f.submit(script("sleep"))
		f.started() // left running: Close leaves it to the next engine
		eng.Watch(context.Background())
		if n, _ := engineGoroutines(t, label); n == 0 {
			t.Fatal("no goroutine of the engine found while it runs: the label is not inherited")
		}
	})
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if n, stacks := engineGoroutines(t, label); n != 0 {
		t.Fatalf("%d goroutines of the engine left after Close:\n%s", n, stacks)
	}
}

// engineGoroutines counts the goroutines labelled label that run code of
// package engine (a goroutine of the fake backend's alone is not one).
func engineGoroutines(t *testing.T, label string) (n int, stacks string) {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(rec, `"test":"`+label+`"`) || !strings.Contains(rec, "delegate-dev/delegate/engine.") {
			continue
		}
		var count int // the record's first word: how many goroutines have its stack
		if _, err := fmt.Sscan(rec, &count); err != nil {
			t.Fatalf("a goroutine profile record without its count: %q", rec)
		}
		n += count
		stacks += rec + "\n\n"
	}
	return n, stacks
}
