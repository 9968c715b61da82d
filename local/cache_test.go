//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestCaches: a cache persists from one sandbox to the next of the same
// key (handed to each one's job user, who writes it), a second sandbox
// asking while the first holds it gets an empty one of its own and is told
// so, another key never sees it, a holder gone without releasing it
// (a crash) leaves no lock behind, and the least recently used caches go
// once all of them pass the cap.
func TestCaches(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir, b.caches.max = t.TempDir(), 3<<20
	ctx := context.Background()
	keyA, keyB := strings.Repeat("a", 16), strings.Repeat("b", 16)
	var mu sync.Mutex
	var steps []string
	spec := func(key string) sandbox.Spec {
		s := defaultSpec()
		s.Caches = []sandbox.Cache{{Name: "go", Key: key}}
		s.Progress = func(step string) { mu.Lock(); steps = append(steps, step); mu.Unlock() }
		return s
	}
	shIn := func(sb sandbox.Instance, script string) string {
		t.Helper()
		exit, out := run(t, sb, "/bin/sh", "-c", script)
		if exit.Code != 0 {
			t.Fatalf("exit %d: %s", exit.Code, out)
		}
		return out
	}
	mk := func(key string) sandbox.Instance {
		t.Helper()
		sb, err := b.Create(ctx, spec(key))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(ctx, sb.ID()) })
		return sb
	}
	destroy := func(sb sandbox.Instance) {
		t.Helper()
		if err := b.Destroy(ctx, sb.ID()); err != nil {
			t.Fatal(err)
		}
	}

	first := mk(keyA)
	shIn(first, `[ "$(stat -c %u /cache/go)" = "$(id -u)" ] && mkdir -p /cache/go/build && head -c 2000000 /dev/zero >/cache/go/build/obj && echo one >/cache/go/mark`)
	destroy(first)
	var meta cacheMeta
	if err := readJSON(filepath.Join(b.caches.dir, keyA, "go.json"), &meta); err != nil || meta.Bytes != 2000004 || meta.Used.IsZero() {
		t.Fatalf("the cache's record after its release: %+v %v", meta, err)
	}

	second := mk(keyA)
	if out := shIn(second, `cat /cache/go/mark && [ "$(stat -c %u /cache/go/build/obj)" = "$(id -u)" ] && echo two >>/cache/go/mark && echo owned`); out != "one\nowned\n" {
		t.Errorf("the second sandbox of the key found %q in its cache", out)
	}
	// Meanwhile: one writer at a time.
	third := mk(keyA)
	if out := shIn(third, `ls -A /cache/go; touch /cache/go/x && echo writable`); out != "writable\n" {
		t.Errorf("a sandbox that found the cache in use got %q, want an empty cache of its own", out)
	}
	mu.Lock()
	told := strings.Join(steps, "\n")
	mu.Unlock()
	if !strings.Contains(told, "cache go is in use by sandbox "+second.ID()) {
		t.Errorf("the busy cache was not told: %q", told)
	}
	destroy(third)
	destroy(second)
	other := mk(keyB)
	if out := shIn(other, `ls -A /cache/go; head -c 2000000 /dev/zero >/cache/go/blob`); out != "" {
		t.Errorf("another key's cache holds %q", out)
	}
	// A crash: the holder's directory is gone without a release.
	os.WriteFile(filepath.Join(b.caches.dir, keyA, "go.lock"), []byte("sb-000000000000"), 0o600)
	again := mk(keyA)
	if out := shIn(again, `cat /cache/go/mark`); out != "one\ntwo\n" {
		t.Errorf("after a stale lock the cache holds %q", out)
	}
	destroy(again)
	// keyA (2 MB, used first) and keyB (2 MB, used last): over the 3 MiB
	// cap once keyB is released, keyA goes.
	destroy(other)
	if _, err := os.Stat(filepath.Join(b.caches.dir, keyA, "go")); !os.IsNotExist(err) {
		t.Errorf("the least recently used cache is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(b.caches.dir, keyB, "go", "blob")); err != nil {
		t.Errorf("the cache used last was evicted: %v", err)
	}
}
