package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/delegate-dev/delegate"
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
	// The text opens with a "goroutine profile: total N" line, glued to
	// the first record: without it, that record's first word is its count.
	text := buf.String()
	if strings.HasPrefix(text, "goroutine profile:") {
		_, text, _ = strings.Cut(text, "\n")
	}
	for _, rec := range strings.Split(text, "\n\n") {
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

// failingProgress is a store that cannot store progress once fail is set.
type failingProgress struct {
	delegate.Store
	fail atomic.Bool
}

func (s *failingProgress) SaveProgress(ctx context.Context, batch []delegate.JobProgress) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	return s.Store.SaveProgress(ctx, batch)
}

// TestCloseReportsLostProgress: what a job reported last that Close could
// not store is Close's error, not only a line of the log. (In a bubble:
// no time passes between the reports and Close, so that the second is
// still waiting for its turn, progressEvery after the first, when Close
// stores it.)
func TestCloseReportsLostProgress(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		store := &failingProgress{Store: f.store}
		eng := engine.New(store, f.backend, f.cfg)
		if err := eng.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		job, err := eng.Submit(context.Background(), script("work"), delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := f.started()
		awaitJob(t, eng, job.ID, "running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning })
		store.fail.Store(true)
		for _, msg := range []string{"a third", "half way"} {
			if _, err := eng.Callback(context.Background(), job.ID, tokenOf(t, p), delegate.Report{Kind: delegate.ReportStatus, Progress: msg}); err != nil {
				t.Fatal(err)
			}
		}
		if err := eng.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("Close: %v, want the progress it could not store", err)
		}
	})
}
