//go:build linux

package local

import (
	"context"
	"github.com/delegate-dev/delegate/internal/testkit"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestCacheDiskQuota: a cache's growth is written back only while its
// owner's caches stay within the limit its disk quota leaves them
// (sandbox.Cache.Limit): past it the cache stays as it was and the log
// names the quota, the principal and the bytes, and so does the next
// run that takes the cache — a job's or a kept sandbox's command's —
// in its Exit.CacheMisses, once (issue 36: the run whose changes were
// refused has ended, its principal learnt it nowhere); another owner's
// caches are not counted; CacheBytes measures an owner's caches.
func TestCacheDiskQuota(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir, b.caches.max = t.TempDir(), 1<<30
	var logged testkit.Log
	b.caches.log = slog.New(slog.NewTextHandler(&logged, nil))
	ctx := context.Background()
	const limit = 3 << 20
	spec := func(owner, key string) sandbox.Spec {
		spec := defaultSpec()
		spec.DiskBytes = 16 << 20
		spec.Caches = []sandbox.Cache{{Name: "go", Key: key, Owner: owner, Limit: limit}}
		return spec
	}
	// sh runs script in a new sandbox (a kept one for a kept sandbox's
	// command) and wants its cache misses as checkMisses does.
	sh := func(spec sandbox.Spec, script, wantMiss string) {
		t.Helper()
		sb := create(t, b, spec)
		exit, out := run(t, sb, "/bin/sh", "-c", script)
		if exit.Code != 0 {
			t.Fatalf("exit %d: %s", exit.Code, out)
		}
		checkMisses(t, exit, wantMiss)
		if err := b.Destroy(ctx, sb.ID()); err != nil {
			t.Fatal(err)
		}
	}
	fill := func(owner, key string) { sh(spec(owner, key), `head -c 2000000 /dev/zero >/cache/go/blob`, "") }
	kept := func(key string) bool {
		_, err := os.Stat(filepath.Join(b.caches.dir, key, "go", "blob"))
		return err == nil
	}
	keyA, keyB, keyC := strings.Repeat("a", 16), strings.Repeat("b", 16), strings.Repeat("c", 16)
	fill("alice", keyA)
	if !kept(keyA) {
		t.Fatal("alice's first cache (2 MB of a 3 MiB limit) was not written back")
	}
	fill("alice", keyB)
	if kept(keyB) {
		t.Error("alice's second cache was written back past her limit (2 MB + 2 MB > 3 MiB)")
	}
	if log := logged.String(); !strings.Contains(log, "DELEGATE_QUOTA_DISK") || !strings.Contains(log, "principal=alice") ||
		!strings.Contains(log, "changed=2000000") || !strings.Contains(log, `"quota bytes"=3145728`) {
		t.Errorf("the refusal is not logged with the quota, the principal and the bytes: %s", log)
	}
	const notSaved = "go: the changes job job-test made were not saved in it: over the quota of alice: " +
		"disk of caches (what its checkpoints leave of the disk quota): 1.9 MiB now, this asks for 1.9 MiB more, the quota is 3.0 MiB " +
		"(DELEGATE_QUOTA_DISK on the server): delete a checkpoint"
	sh(spec("alice", keyB), `test ! -e /cache/go/blob`, notSaved)
	sh(spec("alice", keyB), `true`, "") // told once: that run's changes (none) were saved
	// A kept sandbox's command that takes the cache is told too, and the
	// refusal of one of its own commands' changes names the sandbox.
	keptSpec := spec("alice", keyB)
	keptSpec.MultiExec, keptSpec.Expires = true, time.Now().Add(time.Minute)
	sh(keptSpec, `head -c 2000000 /dev/zero >/cache/go/blob`, "")
	sh(keptSpec, `true`, "go: the changes a command in kept sandbox sb-")
	fill("bob", keyC)
	if !kept(keyC) {
		t.Error("bob's cache was held by alice's")
	}
	if n, err := b.CacheBytes("alice"); err != nil || n != 2000000 {
		t.Errorf("alice's caches measure %d, %v; want 2000000", n, err)
	}
}
