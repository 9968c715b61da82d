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

// atMost admits while the kind of holding count reads fewer than n,
// refusing with a *QuotaError that names what it read.
func atMost(n int, count func(delegate.Holdings) int) delegate.Admit {
	return func(h delegate.Holdings) error {
		if count(h) >= n {
			return &delegate.QuotaError{Principal: "alice", Quota: "test", Setting: "TEST", Use: fmt.Sprint(count(h)), Asked: "1", Limit: fmt.Sprint(n)}
		}
		return nil
	}
}

// atOnce runs try(0) … try(tries-1) at once, and counts those that
// returned nil and the errors of the others.
func atOnce(tries int, try func(i int) error) (stored int, refusals []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() {
			err := try(i)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				stored++
			} else {
				refusals = append(refusals, err)
			}
		})
	}
	wg.Wait()
	return stored, refusals
}

// testQuotaRace: creations by one principal that race, through two
// handles (two servers sharing the store), are admitted one after the
// other: of many at once at a quota of n, exactly n are stored, each
// refusal is admit's own error as it returned it (having read the n
// stored), and another principal is not held by it. So for kept
// sandboxes.
func testQuotaRace(t *testing.T, open Open) {
	const n, tries = 3, 24
	handles := []delegate.Store{open(), open()}
	alice := As("alice")
	race := func(create func(s delegate.Store, i int) error) (stored int, refusals []error) {
		return atOnce(tries, func(i int) error { return create(handles[i%2], i) })
	}
	check := func(what string, stored int, refusals []error) {
		t.Helper()
		if stored != n {
			t.Errorf("%s: %d stored of %d at once, at a quota of %d", what, stored, tries, n)
		}
		for _, err := range refusals {
			var qe *delegate.QuotaError
			if !errors.As(err, &qe) || err != error(qe) || qe.Use != fmt.Sprint(n) {
				t.Errorf("%s: refused with %v (%T), want admit's own error having read %d", what, err, err, n)
				break
			}
		}
	}
	stored, refusals := race(func(s delegate.Store, i int) error {
		return s.CreateJobAdmitted(alice, NewJob(fmt.Sprintf("race-%d", i)), atMost(n, func(h delegate.Holdings) int { return h.Jobs }))
	})
	check("jobs", stored, refusals)
	now := time.Now().UTC()
	stored, refusals = race(func(s delegate.Store, i int) error {
		sb := &delegate.Sandbox{ID: fmt.Sprintf("sbx-race-%d", i), State: delegate.SandboxIdle, Backend: "local", Instance: fmt.Sprint(i),
			Resources: delegate.Resources{CPU: 1, Memory: "64M"}, CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}
		return s.CreateSandboxAdmitted(alice, sb, atMost(n, func(h delegate.Holdings) int { return h.Sandboxes }))
	})
	check("sandboxes", stored, refusals)
	if err := handles[1].CreateJobAdmitted(As("bob"), NewJob("bob-1"), atMost(n, func(h delegate.Holdings) int { return h.Jobs })); err != nil {
		t.Errorf("bob is held by alice's holdings: %v", err)
	}
}

// testCheckpointQuotaRace: checkpoints recorded at once on a principal's
// sandboxes (UpdateSandboxAdmitted), through two handles, are admitted
// one after the other: at a disk quota that fits n of them exactly n are
// recorded, each refusal is admit's own error having read the n, the
// refused changed nothing, and another principal's are not held. Before,
// the engine checked the disk and recorded the checkpoint in two steps,
// and checkpoints at one instant passed the quota together.
func testCheckpointQuotaRace(t *testing.T, open Open) {
	const n, tries, size = 3, 24, 1000
	handles := []delegate.Store{open(), open()}
	alice, ctx := As("alice"), context.Background()
	now := time.Now().UTC()
	newSandbox := func(owner context.Context, id string) {
		sb := &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: id,
			CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := handles[0].CreateSandbox(owner, sb); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tries / 2 {
		newSandbox(alice, fmt.Sprintf("sbx-cp-%d", i))
	}
	newSandbox(As("bob"), "sbx-cp-bob")
	admit := func(h delegate.Holdings) error {
		if h.CheckpointBytes+size > n*size {
			return &delegate.QuotaError{Principal: "alice", Quota: "test disk", Setting: "TEST", Use: fmt.Sprint(h.CheckpointBytes),
				Asked: fmt.Sprint(size), Limit: fmt.Sprint(n * size)}
		}
		return nil
	}
	checkpoint := func(s delegate.Store, ctx context.Context, id string, i int) error {
		_, err := s.UpdateSandboxAdmitted(ctx, id, func(sb *delegate.Sandbox) error {
			sb.CheckpointSeq++
			sb.Checkpoints = append(sb.Checkpoints, delegate.Checkpoint{ID: delegate.CheckpointID(id, sb.CheckpointSeq),
				SandboxID: id, Instance: fmt.Sprintf("cp-%d", i), Bytes: size, CreatedAt: now})
			return nil
		}, admit)
		return err
	}
	stored, refusals := atOnce(tries, func(i int) error {
		return checkpoint(handles[i%2], alice, fmt.Sprintf("sbx-cp-%d", i%(tries/2)), i)
	})
	if stored != n {
		t.Errorf("%d checkpoints recorded of %d at once, at a quota that fits %d", stored, tries, n)
	}
	for _, err := range refusals {
		var qe *delegate.QuotaError
		if !errors.As(err, &qe) || err != error(qe) || qe.Use != fmt.Sprint(n*size) {
			t.Errorf("refused with %v (%T), want admit's own error having read %d bytes", err, err, n*size)
			break
		}
	}
	if h, err := handles[1].Holdings(ctx, "alice"); err != nil || h.CheckpointBytes != n*size {
		t.Errorf("alice's checkpoints hold %d bytes (%v), want %d: a refused one was recorded", h.CheckpointBytes, err, n*size)
	}
	if err := checkpoint(handles[1], As("bob"), "sbx-cp-bob", 0); err != nil {
		t.Errorf("bob is held by alice's checkpoints: %v", err)
	}
	if err := checkpoint(handles[0], As("bob"), "sbx-cp-0", 0); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("bob checkpoints alice's sandbox: %v, want not found", err)
	}
}

// testHoldings: what a principal holds is its jobs not ended and its live
// kept sandboxes, with their CPU and memory; a command in a kept sandbox
// uses the sandbox's; a persistent job whose sandbox is not kept yet
// counts as that sandbox; the checkpoints of its live sandboxes are its
// disk. Another's are not counted.
func testHoldings(t *testing.T, open Open) {
	ctx, s := context.Background(), open()
	alice := As("alice")
	job := func(id, sandbox string, lc delegate.Lifecycle, r *delegate.Resources) {
		j := NewJob(id)
		j.Sandbox, j.Manifest.Lifecycle, j.Manifest.Resources = sandbox, lc, r
		if err := s.CreateJob(alice, j); err != nil {
			t.Fatal(err)
		}
	}
	job("a-running", "", delegate.LifecycleEphemeral, &delegate.Resources{CPU: 2, Memory: "1G"})
	job("a-persistent", "", delegate.LifecyclePersistent, &delegate.Resources{CPU: 0.5, Memory: "512M"})
	job("a-command", "sbx-a1", delegate.LifecyclePersistent, &delegate.Resources{CPU: 8, Memory: "8G"}) // the sandbox's
	job("a-ended", "", delegate.LifecycleEphemeral, &delegate.Resources{CPU: 16, Memory: "16G"})
	if err := setStatus(s, "a-ended", delegate.StatusCancelled); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(As("bob"), NewJob("b-running")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, id := range []string{"sbx-a1", "sbx-a2"} {
		sb := &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: id,
			Resources: delegate.Resources{CPU: 1, Memory: "256M"}, CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s.CreateSandbox(alice, sb); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateSandbox(ctx, "sbx-a1", func(sb *delegate.Sandbox) error {
		sb.Checkpoints = []delegate.Checkpoint{{ID: "ckp-a1.1", Instance: "cp-1", Bytes: 1000}, {ID: "ckp-a1.2", Instance: "cp-2", Bytes: 2000}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateSandbox(ctx, "sbx-a2", func(sb *delegate.Sandbox) error {
		sb.Checkpoints = []delegate.Checkpoint{{ID: "ckp-a2.1", Instance: "cp-3", Bytes: 4000}} // goes with it
		sb.State, sb.EndedAt = delegate.SandboxReleased, now
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := delegate.Holdings{Jobs: 3, Sandboxes: 2, CPU: 3.5, MemoryBytes: (1 << 30) + (512 << 20) + (256 << 20), CheckpointBytes: 3000}
	for i, h := range []delegate.Store{s, open()} {
		if got, err := h.Holdings(ctx, "alice"); err != nil || got != want {
			t.Errorf("handle %d: alice holds %+v, %v; want %+v", i, got, err, want)
		}
	}
	var seen delegate.Holdings
	if err := s.CreateJobAdmitted(alice, NewJob("a-next"), func(h delegate.Holdings) error { seen = h; return nil }); err != nil || seen != want {
		t.Errorf("admit was given %+v (%v); want %+v", seen, err, want)
	}
}
