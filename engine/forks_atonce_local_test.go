package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/sandbox"
)

// gatedForks is the local backend whose forks (Create from a checkpoint)
// wait for each other: each goes on once want of them are being made at
// once, and fails after a while alone (the forks were opened one after
// another); the one that arrives fail-th fails (0: none).
type gatedForks struct {
	*local.Backend
	mu      sync.Mutex
	want    int
	fail    int
	n       int
	arrived chan struct{}
}

func (g *gatedForks) expect(want, fail int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.want, g.fail, g.n, g.arrived = want, fail, 0, make(chan struct{})
}

func (g *gatedForks) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	if spec.From == "" {
		return g.Backend.Create(ctx, spec)
	}
	g.mu.Lock()
	g.n++
	n, want, fail, arrived := g.n, g.want, g.fail, g.arrived
	if n == want {
		close(arrived)
	}
	g.mu.Unlock()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("fork %d of %d was made alone for 30 s: the forks are not opened at once", n, want)
	}
	if n == fail {
		return nil, errors.New("the host has no room for it (injected)")
	}
	return g.Backend.Create(ctx, spec)
}

// TestLocalForkAtOnce (issue 38, the fork's figure): the sandboxes of a
// fork are opened at once, not one after another; if one cannot be
// made, the others made are released and nothing of them is left (no
// sandbox directory, no mount, no live record), the error naming the
// fork that failed and why; a principal's quota of sandboxes holds
// for forks opened at once (decided per sandbox where it is stored).
func TestLocalForkAtOnce(t *testing.T) {
	f := newLocal(t)
	f.cfg.MaxForks = 3
	f.cfg.Quotas = engine.Quotas{Sandboxes: 4}
	g := &gatedForks{Backend: f.backend(t)}
	eng := f.engine(t, g)
	ctx := delegate.WithPrincipal(context.Background(), &delegate.Principal{Name: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs}})
	src, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.ReleaseSandbox(ctx, src.ID) }) // also when the test fails (its layers are mounts)
	if err := eng.WriteSandboxFile(ctx, src.ID, "a.txt", []byte("base"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live := func() []string {
		t.Helper()
		sbs, err := eng.ListSandboxes(ctx, delegate.SandboxListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		slices.Sort(ids)
		return ids
	}
	before, left := live(), f.leftovers(t)

	// One of three fails: the two made are released, nothing is left.
	g.expect(3, 2)
	_, err = eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 3})
	if err == nil || !strings.Contains(err.Error(), "no room for it (injected)") || !strings.Contains(err.Error(), "of 3)") ||
		!strings.Contains(err.Error(), cp.ID) {
		t.Fatalf("a fork of 3 whose second fails: %v, want the failure, which fork and from what", err)
	}
	if now := live(); !slices.Equal(now, before) {
		t.Errorf("live sandboxes after the failed fork: %v, want %v", now, before)
	}
	testkit.Eventually(t, time.Minute, "nothing left of the failed fork's sandboxes", func() bool {
		return slices.Equal(f.leftovers(t), left)
	})
	if now := f.leftovers(t); !slices.Equal(now, left) {
		t.Errorf("left of the failed fork: %v, want %v", now, left)
	}

	// Three at once, each its own sandbox with the source's files.
	g.expect(3, 0)
	forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, fk := range forks {
		if seen[fk.Instance] || fk.From != cp.ID {
			t.Errorf("fork %+v: an instance seen before, or not from %s", fk, cp.ID)
		}
		seen[fk.Instance] = true
		if fc, err := eng.ReadSandboxFile(ctx, fk.ID, "a.txt", 0, 100); err != nil || string(fc.Data) != "base" {
			t.Errorf("fork %s reads %v %v", fk.ID, fc, err)
		}
	}
	for _, fk := range forks {
		if _, _, err := eng.ReleaseSandbox(ctx, fk.ID); err != nil {
			t.Fatal(err)
		}
	}

	// With room for 2 more sandboxes, 3 at once: each passes the check
	// made before its machine (none is stored yet), the store admits
	// two and refuses the third; the call fails, none is kept.
	other, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	before = live()
	g.expect(3, 0)
	_, err = eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 3})
	var qe *delegate.QuotaError
	if !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_SANDBOXES" {
		t.Errorf("3 forks with room for 2: %v, want the quota of kept sandboxes", err)
	}
	if now := live(); !slices.Equal(now, before) {
		t.Errorf("live sandboxes after the fork over the quota: %v, want %v", now, before)
	}
	for _, id := range []string{other.ID, src.ID} {
		if _, _, err := eng.ReleaseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
