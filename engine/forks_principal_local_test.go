package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestLocalCheckpointOtherPrincipal (issue 38, bad input): another
// principal's sandbox and checkpoint are not found by any checkpoint
// call (checkpoint, rollback, list, delete, fork from either), and
// nothing is changed or made; the owner's calls still work after.
func TestLocalCheckpointOtherPrincipal(t *testing.T) {
	f := newLocal(t)
	eng := f.engine(t, f.backend(t))
	as := func(name string) context.Context {
		return delegate.WithPrincipal(context.Background(), &delegate.Principal{Name: name, Scopes: []delegate.Scope{delegate.ScopeJobs}})
	}
	alice, bob := as("alice"), as("bob")
	sb, err := eng.OpenSandbox(alice, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := eng.CheckpointSandbox(alice, sb.ID, delegate.CheckpointOptions{Name: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"checkpoint", errOf(eng.CheckpointSandbox(bob, sb.ID, delegate.CheckpointOptions{}))},
		{"rollback", errOf(eng.RollbackSandbox(bob, sb.ID, cp.ID))},
		{"list", errOf(eng.ListCheckpoints(bob, sb.ID))},
		{"delete", eng.DeleteCheckpoint(bob, cp.ID)},
		{"fork of the checkpoint", errOf(eng.ForkSandbox(bob, delegate.ForkSpec{From: cp.ID, Count: 1}))},
		{"fork of the sandbox", errOf(eng.ForkSandbox(bob, delegate.ForkSpec{From: sb.ID, Count: 1}))},
	} {
		if !errors.Is(c.err, delegate.ErrNotFound) {
			t.Errorf("bob's %s of alice's: %v, want not found", c.what, c.err)
		}
	}
	list, err := eng.ListCheckpoints(alice, sb.ID)
	if err != nil || len(list) != 1 || list[0].ID != cp.ID || len(list[0].Forks) != 0 {
		t.Errorf("alice's checkpoints after bob's calls: %+v %v, want %s alone, without forks", list, err, cp.ID)
	}
	if mine, _ := eng.ListSandboxes(bob, delegate.SandboxListOptions{}); len(mine) != 0 {
		t.Errorf("bob has sandboxes: %+v", mine)
	}
	if _, err := eng.RollbackSandbox(alice, sb.ID, cp.ID); err != nil {
		t.Errorf("alice's rollback after: %v", err)
	}
	if _, _, err := eng.ReleaseSandbox(alice, sb.ID); err != nil {
		t.Fatal(err)
	}
}
