package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

// TestCacheLimit: the room a job's caches get is its principal's disk
// quota less its checkpoints; none for the local operator, for a
// principal holding a valid token of the admin scope, or without a quota;
// at least a byte (nothing grows) once its checkpoints fill the quota.
func TestCacheLimit(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	now := time.Now().UTC()
	for i, tok := range []delegate.Token{
		{ID: "tok-op", Principal: "ops", Scopes: []delegate.Scope{delegate.ScopeAdmin}},
		{ID: "tok-old", Principal: "was-op", Scopes: []delegate.Scope{delegate.ScopeAdmin}, RevokedAt: now},
		{ID: "tok-alice", Principal: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs}},
	} {
		tok.Hash, tok.CreatedAt = delegate.HashToken(tok.ID), now
		if err := store.CreateToken(ctx, &tok); err != nil {
			t.Fatal(i, err)
		}
	}
	for id, bytes := range map[string]int64{"sbx-alice": 300, "sbx-full": 2000} {
		sb := &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: id, Principal: id[4:],
			CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour),
			Checkpoints: []delegate.Checkpoint{{ID: "ckp-" + id[4:] + ".1", Instance: "cp", Bytes: bytes}}}
		if err := store.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	q := Quotas{DiskBytes: 1000}
	for _, tc := range []struct {
		principal string
		q         Quotas
		want      int64
	}{
		{"alice", q, 700},
		{"bob", q, 1000},
		{"full", q, 1},
		{delegate.LocalPrincipal, q, 0},
		{"ops", q, 0},
		{"was-op", q, 1000},
		{"alice", Quotas{}, 0},
	} {
		if got, err := cacheLimit(ctx, store, tc.q, tc.principal); err != nil || got != tc.want {
			t.Errorf("%s with %+v: %d, %v; want %d", tc.principal, tc.q, got, err, tc.want)
		}
	}
}
