package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

func TestCountJobs(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	counts, err := s.CountJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != len(delegate.Statuses) {
		t.Fatalf("an empty store counts %v, want every status at 0", counts)
	}
	// Move jobs along the state machine: 3 pending, 2 running, 1 success,
	// 2 failed, 1 cancelled.
	path := map[delegate.Status][]delegate.Status{
		delegate.StatusPending:   nil,
		delegate.StatusRunning:   {delegate.StatusProvisioning, delegate.StatusRunning},
		delegate.StatusSuccess:   {delegate.StatusProvisioning, delegate.StatusRunning, delegate.StatusSuccess},
		delegate.StatusFailed:    {delegate.StatusFailed},
		delegate.StatusCancelled: {delegate.StatusCancelled},
	}
	want := map[delegate.Status]int{delegate.StatusPending: 3, delegate.StatusRunning: 2, delegate.StatusSuccess: 1,
		delegate.StatusFailed: 2, delegate.StatusCancelled: 1}
	n := 0
	for final, k := range want {
		for range k {
			n++
			id := fmt.Sprintf("j%d", n)
			if err := s.CreateJob(ctx, newJob(id)); err != nil {
				t.Fatal(err)
			}
			for _, next := range path[final] {
				if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error { j.Status = next; return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	counts, err = s.CountJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range delegate.Statuses {
		if counts[st] != want[st] {
			t.Errorf("%s: %d, want %d (all: %v)", st, counts[st], want[st], counts)
		}
	}
}

// BenchmarkCountJobs prints what a metrics scrape costs the store with
// 100,000 jobs in it.
func BenchmarkCountJobs(b *testing.B) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	for i := range 100_000 {
		j := newJob(fmt.Sprintf("job-%06d", i))
		if i%10 != 0 {
			j.Status = delegate.StatusFailed // stored as it is: the state machine is UpdateJob's
		}
		if err := s.CreateJob(ctx, j); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("filled 100,000 jobs in %s", time.Since(start).Round(time.Millisecond))
	b.ResetTimer()
	for range b.N {
		if _, err := s.CountJobs(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
