package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestLocalDiskQuota: on the real local backend, a checkpoint that would
// take its principal's checkpoints (and caches) past DELEGATE_QUOTA_DISK
// is refused with the quota, the use, its size and the setting named, and
// deleted (the sandbox's files stay); one within it is kept; the operator
// is not held.
func TestLocalDiskQuota(t *testing.T) {
	f := newLocal(t)
	f.cfg.Quotas.DiskBytes = 1 << 20
	eng := f.engine(t, f.backend(t))
	alice := as("alice", delegate.ScopeJobs, delegate.ScopeSandboxes)
	sb, err := eng.OpenSandbox(alice, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.ReleaseSandbox(t.Context(), sb.ID)
	write := func(name string, n int) {
		t.Helper()
		if err := eng.WriteSandboxFile(alice, sb.ID, name, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.bin", 600<<10)
	first, err := eng.CheckpointSandbox(alice, sb.ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatalf("a checkpoint of 600 KiB within 1 MiB: %v", err)
	}
	if first.Bytes < 600<<10 {
		t.Fatalf("the checkpoint holds %d bytes, want at least 600 KiB", first.Bytes)
	}
	write("b.bin", 600<<10)
	_, err = eng.CheckpointSandbox(alice, sb.ID, delegate.CheckpointOptions{})
	var qe *delegate.QuotaError
	if !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_DISK" || qe.Limit != "1.0 MiB" || !strings.HasPrefix(qe.Use, "6") ||
		!strings.HasPrefix(qe.Asked, "6") || !strings.Contains(err.Error(), "disk of checkpoints and caches") || !strings.Contains(err.Error(), "delete a checkpoint") {
		t.Fatalf("a second checkpoint past the quota: %v", err)
	}
	cps, err := eng.ListCheckpoints(alice, sb.ID)
	if err != nil || len(cps) != 1 || cps[0].ID != first.ID {
		t.Errorf("checkpoints after the refusal: %+v, %v; want only %s", cps, err, first.ID)
	}
	if fc, err := eng.ReadSandboxFile(alice, sb.ID, "b.bin", 0, 10); err != nil || len(fc.Data) != 10 {
		t.Errorf("the sandbox's file after a refused checkpoint: %v", err)
	}
	if _, err := eng.CheckpointSandbox(t.Context(), sb.ID, delegate.CheckpointOptions{}); err != nil {
		t.Errorf("the operator is held by alice's disk quota: %v", err)
	}
}

// TestLocalCacheNotSaved (issue 36): on the real local backend, a job
// whose cache's growth DELEGATE_QUOTA_DISK has no room for ends with the
// cache as it was, and the next job of its principal that takes the
// cache is told, in its result and its record, which job's changes were
// not saved and why (the quota, the use, the size, the setting); the job
// after that, whose own changes were saved, is told nothing.
func TestLocalCacheNotSaved(t *testing.T) {
	f := newLocal(t)
	root := t.TempDir()
	dir := project(t, root, "calc", map[string]string{"calc.go": "package calc\n"})
	f.lcfg.CacheDir = filepath.Join(f.dir, "caches")
	f.cfg.WorkspaceRoots, f.cfg.Quotas.DiskBytes = []string{root}, 1<<20
	eng := f.engine(t, f.backend(t))
	alice := as("alice", delegate.ScopeJobs)
	runJob := func(task string) (*delegate.Job, *delegate.JobResult) {
		t.Helper()
		m := script(task)
		m.Workspace, m.Caches = &delegate.WorkspaceSource{Dir: dir}, []string{"go"}
		j, err := eng.Submit(alice, m, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done := testkit.Wait(t, eng, j.ID)
		res, err := eng.Result(alice, j.ID, delegate.ResultOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if done.Status != delegate.StatusSuccess {
			t.Fatalf("job %q: %s %s\n%s", task, done.Status, done.Error, res.Output)
		}
		// Its sandbox goes (and gives the cache back) after its end is
		// stored: the next job would have an empty one meanwhile.
		testkit.Eventually(t, 30*time.Second, "the job's sandbox gone", func() bool { return len(f.leftovers(t)) == 0 })
		return done, res
	}
	big, _ := runJob("head -c 1500000 /dev/zero >/cache/go/blob")
	next, res := runJob("test ! -e /cache/go/blob")
	want := "go: the changes job " + big.ID + " made were not saved in it: over the quota of alice: disk of caches " +
		"(what its checkpoints leave of the disk quota): 0 B now, this asks for 1.4 MiB more, the quota is 1.0 MiB " +
		"(DELEGATE_QUOTA_DISK on the server): delete a checkpoint"
	if !strings.HasPrefix(next.CacheMissed, want) || res.CacheMissed != next.CacheMissed {
		t.Errorf("the next job's cache_missed %q, its result's %q; want %q…", next.CacheMissed, res.CacheMissed, want)
	}
	t.Logf("the next job's result says: cache %s", res.CacheMissed)
	if last, res := runJob("true"); last.CacheMissed != "" || res.CacheMissed != "" {
		t.Errorf("the job after it is told %q", res.CacheMissed)
	}
}

// together is a store that the checkpoints made once armed reach at one
// instant: each one's first call to it (what it holds on disk, read
// ahead, or the record admitted) waits until n have come.
type together struct {
	delegate.Store
	n     int
	armed atomic.Bool
	mu    sync.Mutex
	came  int
	all   chan struct{}
}

func (s *together) arrive() {
	if !s.armed.Load() {
		return
	}
	s.mu.Lock()
	if s.came++; s.came == s.n {
		close(s.all)
	}
	s.mu.Unlock()
	select {
	case <-s.all:
	case <-time.After(10 * time.Second): // fewer came: they go on as they are
	}
}

func (s *together) Holdings(ctx context.Context, principal string) (delegate.Holdings, error) {
	s.arrive()
	return s.Store.Holdings(ctx, principal)
}

func (s *together) UpdateSandboxAdmitted(ctx context.Context, id string, fn func(*delegate.Sandbox) error, admit delegate.Admit) (*delegate.Sandbox, error) {
	s.arrive()
	return s.Store.UpdateSandboxAdmitted(ctx, id, fn, admit)
}

// TestLocalCheckpointQuotaRace (issue 36): checkpoints of a principal's
// kept sandboxes that reach the store at one instant, on the real local
// backend, at a disk quota that fits k of them: exactly k are kept, and
// each other is refused with the quota named, having read the k (the
// store records a checkpoint only within the quota, one after the
// other: before, each read the disk and then recorded, and all of them
// passed it together).
func TestLocalCheckpointQuotaRace(t *testing.T) {
	const n, k = 6, 3
	f := newLocal(t)
	f.cfg.Quotas.DiskBytes = 1 << 20 // 3 checkpoints of 300 KiB, not 4
	store := &together{Store: f.store, n: n, all: make(chan struct{})}
	eng := engine.New(store, f.backend(t), f.cfg)
	if err := eng.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	alice := as("alice", delegate.ScopeJobs, delegate.ScopeSandboxes)
	var ids []string
	for range n {
		sb, err := eng.OpenSandbox(alice, delegate.SandboxSpec{})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.ReleaseSandbox(t.Context(), sb.ID)
		if err := eng.WriteSandboxFile(alice, sb.ID, "a.bin", make([]byte, 300<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	store.armed.Store(true)
	for _, id := range ids {
		wg.Go(func() {
			_, err := eng.CheckpointSandbox(alice, id, delegate.CheckpointOptions{})
			errs <- err
		})
	}
	wg.Wait()
	store.armed.Store(false)
	close(errs)
	kept := 0
	for err := range errs {
		var qe *delegate.QuotaError
		switch {
		case err == nil:
			kept++
		case !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_DISK" || !strings.HasPrefix(qe.Use, "9") ||
			!strings.HasPrefix(err.Error(), "over the quota of alice: disk of checkpoints and caches: "):
			t.Errorf("refused with %q, want the disk quota named, having read the %d kept", err, k)
		}
	}
	if kept != k {
		t.Errorf("%d of %d checkpoints kept at once at a disk quota that fits %d", kept, n, k)
	}
	total := 0
	for _, id := range ids {
		cps, err := eng.ListCheckpoints(alice, id)
		if err != nil {
			t.Fatal(err)
		}
		total += len(cps)
	}
	if total != k {
		t.Errorf("%d checkpoints recorded, want %d", total, k)
	}
}
