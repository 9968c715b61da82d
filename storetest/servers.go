package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// expired is a lease that has run out by the time anything reads it (the
// store's clock moves on between two statements).
const expired = time.Microsecond

func register(t *testing.T, s delegate.Store, id string, ttl time.Duration) delegate.Server {
	t.Helper()
	srv, err := s.RegisterServer(context.Background(), delegate.Server{ID: id, Host: "h", HostID: "boot-" + id, Addr: "http://" + id}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// testLeases: a lease is the store's (its clock), renewed only while it
// is live; an expired one never comes back.
func testLeases(t *testing.T, open Open) {
	ctx := context.Background()
	s, other := open(), open()
	a := register(t, s, "a", time.Hour)
	if !a.Live || a.HostID != "boot-a" || a.Addr != "http://a" || !a.ExpiresAt.After(a.StartedAt) {
		t.Fatalf("registered %+v", a)
	}
	if _, err := other.RegisterServer(ctx, delegate.Server{ID: "a"}, time.Hour); !errors.Is(err, delegate.ErrConflict) {
		t.Fatalf("a second registration of one id: %v, want ErrConflict", err)
	}
	renewed, err := other.RenewServer(ctx, "a", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.ExpiresAt.After(a.ExpiresAt) || renewed.RenewedAt.Before(a.RenewedAt) {
		t.Fatalf("renewed %+v, was %+v", renewed, a)
	}
	register(t, other, "b", expired)
	if _, err := s.RenewServer(ctx, "b", time.Hour); !errors.Is(err, delegate.ErrLeaseLost) {
		t.Fatalf("renew an expired lease: %v, want ErrLeaseLost", err)
	}
	if _, err := s.RenewServer(ctx, "nobody", time.Hour); !errors.Is(err, delegate.ErrLeaseLost) {
		t.Fatalf("renew no lease: %v, want ErrLeaseLost", err)
	}
	register(t, s, "c", time.Hour)
	if err := other.ExpireServer(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewServer(ctx, "c", time.Hour); !errors.Is(err, delegate.ErrLeaseLost) {
		t.Fatalf("renew a lease ended: %v, want ErrLeaseLost", err)
	}
	if err := s.DrainServer(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	list, now, err := other.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now.IsZero() || len(list) != 3 {
		t.Fatalf("servers at %v: %+v", now, list)
	}
	live := map[string]bool{}
	for i, srv := range list {
		live[srv.ID] = srv.Live
		if i > 0 && srv.Live && !list[i-1].Live {
			t.Fatalf("live servers come first: %+v", list)
		}
		if srv.Live != srv.ExpiresAt.After(now) {
			t.Fatalf("%s: live %v, expires %v, now %v", srv.ID, srv.Live, srv.ExpiresAt, now)
		}
		if srv.ID == "a" && !srv.Draining {
			t.Fatalf("a was drained: %+v", srv)
		}
	}
	if !live["a"] || live["b"] || live["c"] {
		t.Fatalf("live: %v, want a alone", live)
	}
}

// testTerms: one holder of a duty at a time, a new term at each election;
// a holder whose term ran out can neither renew nor resign its
// successor's.
func testTerms(t *testing.T, open Open) {
	ctx := context.Background()
	s, other := open(), open()
	a, err := s.AcquireTerm(ctx, "pool", "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a.Holder != "a" || a.Term <= 0 || a.Name != "pool" {
		t.Fatalf("term %+v", a)
	}
	_, err = other.AcquireTerm(ctx, "pool", "b", time.Hour)
	var held *delegate.TermHeldError
	if !errors.As(err, &held) || held.Term.Holder != "a" || held.Term.Term != a.Term || !errors.Is(err, delegate.ErrLeaseLost) {
		t.Fatalf("b's election while a holds it: %v", err)
	}
	again, err := s.AcquireTerm(ctx, "pool", "a", expired)
	if err != nil || again.Term != a.Term {
		t.Fatalf("a renews: %+v, %v; want term %d", again, err, a.Term)
	}
	b, err := other.AcquireTerm(ctx, "pool", "b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if b.Term <= a.Term || b.Holder != "b" {
		t.Fatalf("b elected after a's term ran out: %+v (a's %d)", b, a.Term)
	}
	if err := s.ResignTerm(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireTerm(ctx, "pool", "a", time.Hour); !errors.As(err, &held) || held.Term.Term != b.Term {
		t.Fatalf("a's stale resignation removed b's term, or a renewed it: %v", err)
	}
	if _, err := s.AcquireTerm(ctx, "other duty", "a", time.Hour); err != nil {
		t.Fatalf("another duty is free: %v", err)
	}
	if err := other.ResignTerm(ctx, b); err != nil {
		t.Fatal(err)
	}
	c, err := s.AcquireTerm(ctx, "pool", "c", time.Hour)
	if err != nil || c.Term <= b.Term {
		t.Fatalf("after b resigned: %+v, %v", c, err)
	}
}

// claim makes owner the job's owner at its epoch plus one, as a server's
// claim does.
func claim(t *testing.T, s delegate.Store, id, owner string) *delegate.Job {
	t.Helper()
	j, err := s.UpdateJob(context.Background(), id, func(j *delegate.Job) error {
		j.Status, j.Owner, j.Epoch = delegate.StatusProvisioning, owner, j.Epoch+1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// testFencing: a write under a fence the job no longer holds is refused
// by the store, and writes nothing: its state, its output, its artifacts.
func testFencing(t *testing.T, open Open) {
	ctx := context.Background()
	s, other := open(), open()
	create(t, s, NewJob("f1"))
	j := claim(t, s, "f1", "a")
	if j.Epoch != 1 || j.Owner != "a" {
		t.Fatalf("claimed: owner %q epoch %d", j.Owner, j.Epoch)
	}
	got, err := other.GetJob(ctx, "f1")
	if err != nil || got.Epoch != 1 || got.Owner != "a" {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	fa := delegate.WithFence(ctx, delegate.Fence{Owner: "a", Epoch: 1})
	if _, err := s.UpdateJob(fa, "f1", func(j *delegate.Job) error { j.Status = delegate.StatusRunning; return nil }); err != nil {
		t.Fatalf("the owner's write: %v", err)
	}
	if err := s.AppendOutput(fa, "f1", Pieces("o:one"), 3); err != nil {
		t.Fatal(err)
	}
	register(t, s, "a", expired)
	register(t, other, "b", time.Hour)
	adopted, err := other.AdoptJobs(ctx, "b", []string{"a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(adopted) != 1 || adopted[0].From != "a" || adopted[0].Job.Owner != "b" || adopted[0].Job.Epoch != 2 ||
		adopted[0].Job.Status != delegate.StatusRunning || adopted[0].Job.Manifest.Task != "echo f1" {
		t.Fatalf("adopted %+v", adopted)
	}
	// a wakes up and writes as it did.
	_, err = s.UpdateJob(fa, "f1", func(j *delegate.Job) error {
		j.Status, j.Error = delegate.StatusFailed, "from a stale owner"
		return nil
	})
	var fe *delegate.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, delegate.ErrFenced) || fe.Owner != "b" || fe.Epoch != 2 || fe.Fence.Epoch != 1 {
		t.Fatalf("a stale owner's update: %v, want a FencedError naming b at 2", err)
	}
	if delegate.ErrorKind(err) != delegate.KindConflict {
		t.Fatalf("kind %v", delegate.ErrorKind(err))
	}
	if err := s.AppendOutput(fa, "f1", Pieces("o:two"), 6); !errors.Is(err, delegate.ErrFenced) {
		t.Fatalf("a stale owner's output: %v", err)
	}
	if err := s.AddArtifact(fa, "f1", delegate.Artifact{Name: "x", Size: 1, SHA256: sum('x')}); !errors.Is(err, delegate.ErrFenced) {
		t.Fatalf("a stale owner's artifact: %v", err)
	}
	got, err = other.GetJob(ctx, "f1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != delegate.StatusRunning || got.Error != "" || got.OutputRead != 3 || got.Owner != "b" || got.Epoch != 2 {
		t.Fatalf("the stale writes changed the job: %+v", got)
	}
	if out, _ := other.ReadOutput(ctx, "f1", 0, 100); Tagged(out) != "[stdout]o:one" {
		t.Fatalf("output %q", Tagged(out))
	}
	if arts, _ := other.Artifacts(ctx, "f1"); len(arts) != 0 {
		t.Fatalf("artifacts %+v", arts)
	}
	// The successor writes at its epoch; unfenced writes (a cancel, a
	// callback) go through the state machine alone.
	fb := delegate.WithFence(ctx, delegate.Fence{Owner: "b", Epoch: 2})
	if err := other.AppendOutput(fb, "f1", Pieces("o:two"), 6); err != nil {
		t.Fatal(err)
	}
	if err := other.AddArtifact(fb, "f1", delegate.Artifact{Name: "x", Size: 1, SHA256: sum('x')}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateJob(ctx, "f1", func(j *delegate.Job) error { j.Progress = "a callback"; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateJob(fb, "f1", func(j *delegate.Job) error { j.Epoch = 1; return nil }); err == nil {
		t.Fatal("an epoch went down")
	}
	if _, err := other.UpdateJob(fb, "nope", func(*delegate.Job) error { return nil }); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("a fenced write of no job: %v", err)
	}
}

// testAdoptJobs: the unfinished jobs of servers whose leases are not live
// are adopted, each once, by a server whose own lease is.
func testAdoptJobs(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	const n = 30
	for i := range n {
		id := fmt.Sprintf("j%02d", i)
		create(t, s, NewJob(id))
		claim(t, s, id, "dead")
	}
	create(t, s, NewJob("live-owned"))
	claim(t, s, "live-owned", "alive")
	create(t, s, NewJob("ended"))
	claim(t, s, "ended", "dead")
	if err := setStatus(s, "ended", delegate.StatusFailed); err != nil {
		t.Fatal(err)
	}
	register(t, s, "alive", time.Hour)
	register(t, s, "dead", expired)
	register(t, s, "gone", expired)
	if _, err := s.AdoptJobs(ctx, "gone", []string{"dead"}, n); !errors.Is(err, delegate.ErrLeaseLost) {
		t.Fatalf("adoption by a server whose lease expired: %v", err)
	}
	if got, err := s.AdoptJobs(ctx, "alive", []string{"alive"}, n); err != nil || len(got) != 0 {
		t.Fatalf("adopted its own (or a live owner's) jobs: %v, %v", got, err)
	}
	adopters := []string{"x", "y", "z"}
	for _, id := range adopters {
		register(t, s, id, time.Hour)
	}
	if got, err := s.AdoptJobs(ctx, "x", []string{"alive"}, n); err != nil || len(got) != 0 {
		t.Fatalf("adopted a live server's job: %v, %v", got, err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]string{}
		wg   sync.WaitGroup
	)
	for _, a := range adopters {
		h := open()
		wg.Go(func() {
			for {
				got, err := h.AdoptJobs(ctx, a, []string{"dead", "alive"}, 4)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, ad := range got {
					if prev, twice := seen[ad.Job.ID]; twice {
						t.Errorf("%s adopted by %s and %s", ad.Job.ID, prev, a)
					}
					seen[ad.Job.ID] = a
					if ad.From != "dead" || ad.Job.Owner != a || ad.Job.Epoch != 2 {
						t.Errorf("adopted %+v from %s", ad.Job, ad.From)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d jobs adopted, want %d", len(seen), n)
	}
	for _, id := range []string{"live-owned", "ended"} {
		if j, _ := s.GetJob(ctx, id); j.Epoch != 1 {
			t.Fatalf("%s adopted: %+v", id, j)
		}
	}
}

// testRejoin: a server whose lease expired gets a new one, and takes back
// the jobs it owned that no other server adopted, at the next epoch; the
// one another adopted stays the adopter's; a server whose lease is live
// cannot rejoin.
func testRejoin(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	for _, id := range []string{"adopted", "back", "done"} {
		create(t, s, NewJob(id))
		claim(t, s, id, "lost")
	}
	if err := setStatus(s, "done", delegate.StatusFailed); err != nil {
		t.Fatal(err)
	}
	register(t, s, "lost", expired)
	register(t, s, "other", time.Hour)
	if got, err := s.AdoptJobs(ctx, "other", []string{"lost"}, 1); err != nil || len(got) != 1 || got[0].Job.ID != "adopted" {
		t.Fatalf("adopted %v, %v", got, err)
	}
	me := delegate.Server{ID: "lost", Host: "h", HostID: "boot-lost"}
	srv, back, err := s.RejoinServer(ctx, me, time.Hour)
	if err != nil || !srv.Live || len(back) != 1 || back[0].Job.ID != "back" || back[0].Job.Epoch != 2 || back[0].Job.Owner != "lost" {
		t.Fatalf("rejoined: %+v, took back %+v, %v", srv, back, err)
	}
	if j, _ := s.GetJob(ctx, "adopted"); j.Owner != "other" || j.Epoch != 2 {
		t.Errorf("the job another server adopted: owner %s, epoch %d", j.Owner, j.Epoch)
	}
	if j, _ := s.GetJob(ctx, "done"); j.Epoch != 1 {
		t.Errorf("the ended job taken back: epoch %d", j.Epoch)
	}
	if _, err := s.RenewServer(ctx, "lost", time.Hour); err != nil {
		t.Errorf("the new lease is not renewed: %v", err)
	}
	if _, _, err := s.RejoinServer(ctx, me, time.Hour); !errors.Is(err, delegate.ErrConflict) {
		t.Errorf("a rejoin while the lease is live: %v", err)
	}
	// Forgotten meanwhile (its lease ended long ago): registered anew.
	if _, _, err := s.RejoinServer(ctx, delegate.Server{ID: "new", Host: "h"}, time.Hour); err != nil {
		t.Errorf("a rejoin of a server the store forgot: %v", err)
	}
}
