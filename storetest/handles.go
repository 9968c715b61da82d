package storetest

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// testConcurrentHandles: writes to the same jobs from two handles at once
// (two servers sharing the store) lose nothing and wait on each other in
// no circle: read-modify-writes of one job take turns (no lost update),
// appends of output stay whole and end to end, two batches of progress
// naming the same jobs in opposite orders both land (a store that locks
// rows must lock them in one order), timelines number their entries
// without a gap or a clash, and of two cancels one wins.
func testConcurrentHandles(t *testing.T, open Open) {
	ctx := context.Background()
	handles := []delegate.Store{open(), open()}
	create(t, handles[0], NewJob("a"), NewJob("b"), NewJob("c"))
	const rounds = 25
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for w := range 4 { // counters: read, add one, write
		wg.Go(func() {
			for i := range rounds {
				_, err := handles[(w+i)%2].UpdateJob(ctx, "a", func(j *delegate.Job) error {
					n, _ := strconv.Atoi(j.ExecID)
					j.ExecID = strconv.Itoa(n + 1)
					return nil
				})
				if err != nil {
					fail(fmt.Errorf("update: %w", err))
				}
			}
		})
	}
	for w, c := range []byte{'x', 'y'} { // appenders: chunks of 10 bytes
		wg.Go(func() {
			for i := range rounds {
				if err := handles[(w+i)%2].AppendOutput(ctx, "a", []delegate.Output{{Stream: delegate.StreamStdout, Data: bytes.Repeat([]byte{c}, 10)}}, 0); err != nil {
					fail(fmt.Errorf("append: %w", err))
				}
			}
		})
	}
	for w, order := range [][]string{{"a", "b"}, {"b", "a"}} { // progress, in both orders
		wg.Go(func() {
			for i := range rounds {
				batch := make([]delegate.JobProgress, 0, 2)
				for _, id := range order {
					batch = append(batch, delegate.JobProgress{ID: id, Progress: fmt.Sprint("step ", i), Heartbeat: time.Now(),
						Events: []delegate.Event{{Time: time.Now(), Message: fmt.Sprintf("w%d %d", w, i)}}})
				}
				if err := handles[(w+i)%2].SaveProgress(ctx, batch); err != nil {
					fail(fmt.Errorf("progress: %w", err))
				}
			}
		})
	}
	wg.Go(func() { // one entry at a time
		for i := range rounds {
			if err := handles[i%2].AddEvent(ctx, "b", delegate.Event{Time: time.Now(), Message: fmt.Sprint("event ", i)}, delegate.MaxTimeline); err != nil {
				fail(fmt.Errorf("event: %w", err))
			}
		}
	})
	cancels := make(chan bool, 2)
	for _, h := range handles {
		wg.Go(func() {
			_, err := h.UpdateJob(ctx, "c", func(j *delegate.Job) error {
				if j.Status.Terminal() {
					return delegate.ErrTerminal
				}
				j.Status = delegate.StatusCancelled
				return nil
			})
			cancels <- err == nil
		})
	}
	wg.Wait()
	close(cancels)
	for _, err := range errs {
		t.Error(err)
	}
	won := 0
	for ok := range cancels {
		if ok {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d of two racing cancels from two handles applied, want one", won)
	}
	s := open()
	a, err := s.GetJob(ctx, "a")
	if err != nil || a.ExecID != strconv.Itoa(4*rounds) {
		t.Fatalf("after %d read-modify-writes from two handles, the counter is %q (%v): updates were lost", 4*rounds, a.ExecID, err)
	}
	outs, err := s.ReadOutput(ctx, "a", 0, 1<<20)
	out := delegate.JoinOutput(outs)
	if n, _ := s.OutputSize(ctx, "a"); err != nil || len(out) != 2*rounds*10 || n != int64(len(out)) {
		t.Fatalf("output: %d bytes read, size %d, %v; want %d", len(out), n, err, 2*rounds*10)
	}
	for i := 0; i < len(out); i += 10 {
		if !bytes.Equal(out[i:i+10], bytes.Repeat(out[i:i+1], 10)) {
			t.Fatalf("appends interleaved at %d: %q", i, out[i:i+10])
		}
	}
	for id, want := range map[string]int{"a": 2 * rounds, "b": 3 * rounds} {
		evs, err := s.Events(ctx, id)
		j, _ := s.GetJob(ctx, id)
		if err != nil || len(evs)+int(j.TimelineDropped) != want {
			t.Errorf("job %s: %d entries and %d dropped, %v; want %d in all", id, len(evs), j.TimelineDropped, err, want)
		}
	}
}
