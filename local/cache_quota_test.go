//go:build linux

package local

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// lockedBuffer is a log's destination read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCacheDiskQuota: a cache's growth is written back only while its
// owner's caches stay within the limit its disk quota leaves them
// (sandbox.Cache.Limit): past it the cache stays as it was and the log
// names the quota, the principal and the bytes; another owner's caches
// are not counted; CacheBytes measures an owner's caches.
func TestCacheDiskQuota(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir, b.caches.max = t.TempDir(), 1<<30
	var logged lockedBuffer
	b.caches.log = slog.New(slog.NewTextHandler(&logged, nil))
	ctx := context.Background()
	const limit = 3 << 20
	fill := func(owner, key string) {
		t.Helper()
		spec := defaultSpec()
		spec.DiskBytes = 16 << 20
		spec.Caches = []sandbox.Cache{{Name: "go", Key: key, Owner: owner, Limit: limit}}
		sb := create(t, b, spec)
		if exit, out := run(t, sb, "/bin/sh", "-c", `head -c 2000000 /dev/zero >/cache/go/blob`); exit.Code != 0 {
			t.Fatalf("exit %d: %s", exit.Code, out)
		}
		if err := b.Destroy(ctx, sb.ID()); err != nil {
			t.Fatal(err)
		}
	}
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
	fill("bob", keyC)
	if !kept(keyC) {
		t.Error("bob's cache was held by alice's")
	}
	if n, err := b.CacheBytes("alice"); err != nil || n != 2000000 {
		t.Errorf("alice's caches measure %d, %v; want 2000000", n, err)
	}
}
