package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
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
