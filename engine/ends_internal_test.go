package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestWaitLeavesNoEndChannel: a wait for a job keeps a channel for the
// job's end only while it waits: waits for a job that had ended already,
// and waits given up, leave none behind (they stayed for the server's
// life before, one per wait that came after the job's end); a channel
// several waiters share stays until the last lets go.
func TestWaitLeavesNoEndChannel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := testkit.OpenStore(t)
	now := time.Now().UTC()
	for id, st := range map[string]delegate.Status{"done": delegate.StatusSuccess, "queued": delegate.StatusPending} {
		j := &delegate.Job{ID: id, Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, Status: st, CreatedAt: now, UpdatedAt: now}
		if err := store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	w := newJobWriter(store, func(*delegate.Job) {})
	rd := &Reader{store: store, poll: time.Hour, ends: w.endOf}
	held := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.ends)
	}

	if j, err := rd.Wait(ctx, "done"); err != nil || j.Status != delegate.StatusSuccess {
		t.Fatalf("wait for an ended job: %v %v", j, err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if j, err := rd.Wait(short, "queued"); err != nil || j.Status != delegate.StatusPending {
		t.Fatalf("a wait given up: %v %v", j, err)
	}
	if n := held(); n != 0 {
		t.Errorf("%d end channels left after the waits", n)
	}

	c1, release1 := w.endOf("queued")
	c2, release2 := w.endOf("queued")
	if c1 != c2 {
		t.Fatal("two waiters for one job got different channels")
	}
	release1()
	if held() != 1 {
		t.Error("the channel went while a waiter still held it")
	}
	if _, err := w.update(ctx, "queued", func(j *delegate.Job) error { j.Status = delegate.StatusCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c2.c:
	default:
		t.Error("the job's end did not close its waiters' channel")
	}
	c3, release3 := w.endOf("queued") // a wait that came after the end
	release2()                        // the old channel's last waiter: the new one stays
	if held() != 1 {
		t.Error("a release for the closed channel removed the next one")
	}
	release3()
	if n := held(); n != 0 || c3 == c2 {
		t.Errorf("%d end channels left (the same channel again: %v)", n, c3 == c2)
	}
}

// countingStore counts the reads of jobs.
type countingStore struct {
	delegate.Store
	gets atomic.Int64
}

func (s *countingStore) GetJob(ctx context.Context, id string) (*delegate.Job, error) {
	s.gets.Add(1)
	return s.Store.GetJob(ctx, id)
}

// TestWaitTakesTheEndItIsTold: waiters woken by this process's end of a
// job return the job as it was stored then, without reading it again,
// each its own copy.
func TestWaitTakesTheEndItIsTold(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		db := testkit.OpenStore(t)
		store := &countingStore{Store: db}
		now := time.Now().UTC()
		j := &delegate.Job{ID: "queued", Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Env: map[string]string{"A": "1"}},
			Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now}
		if err := db.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		w := newJobWriter(db, func(*delegate.Job) {})
		rd := &Reader{store: store, poll: time.Hour, ends: w.endOf}
		const waiters = 2
		got := make(chan *delegate.Job, waiters)
		for range waiters {
			go func() {
				j, err := rd.Wait(ctx, "queued")
				if err != nil {
					t.Error(err)
				}
				got <- j
			}()
		}
		synctest.Wait() // both waiting
		if n := store.gets.Load(); n != waiters {
			t.Fatalf("%d reads of the job by %d waits that have begun, want one each", n, waiters)
		}
		if _, err := w.update(ctx, "queued", func(j *delegate.Job) error {
			j.Status, j.Error = delegate.StatusCancelled, "stopped"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		a, b := <-got, <-got
		if a == nil || b == nil || a.Status != delegate.StatusCancelled || b.Error != "stopped" {
			t.Fatalf("waiters got %+v and %+v", a, b)
		}
		if n := store.gets.Load(); n != waiters {
			t.Errorf("%d reads of the job for %d waits, want one each (before the end)", n, waiters)
		}
		a.Manifest.Env["A"] = "changed"
		if b.Manifest.Env["A"] != "1" {
			t.Error("the waiters share the job they were given")
		}
	})
}
