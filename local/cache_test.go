//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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
	// Meanwhile (second made, its command not yet ended): one writer at a
	// time.
	third := mk(keyA)
	if out := shIn(second, `cat /cache/go/mark && [ "$(stat -c %u /cache/go/build/obj)" = "$(id -u)" ] && echo two >>/cache/go/mark && echo owned`); out != "one\nowned\n" {
		t.Errorf("the second sandbox of the key found %q in its cache", out)
	}
	exit, out := run(t, third, "/bin/sh", "-c", `ls -A /cache/go; touch /cache/go/x && echo writable`)
	if out != "writable\n" {
		t.Errorf("a sandbox that found the cache in use got %q, want an empty cache of its own", out)
	}
	checkMisses(t, exit, "go: in use by sandbox "+second.ID()) // its result says so, not only its progress
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

// TestCacheHandedBack: a sandbox made while the cache's holder has ended
// but is not destroyed yet (the engine stores a job's end first) waits
// for the cache to come back, with the holder's changes, rather than
// start with an empty one; a holder whose command still runs is not
// waited for (TestCaches).
func TestCacheHandedBack(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir = t.TempDir()
	ctx := context.Background()
	spec := defaultSpec()
	spec.Caches = []sandbox.Cache{{Name: "go", Key: strings.Repeat("c", 16)}}
	first, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(ctx, first.ID()) })
	if exit, out := run(t, first, "/bin/sh", "-c", `echo first >/cache/go/mark`); exit.Code != 0 {
		t.Fatalf("exit %d: %s", exit.Code, out)
	}
	destroyed := make(chan error, 1)
	go func() {
		// The second Create below is under way (or done, without the
		// wait) when the holder goes.
		<-time.After(300 * time.Millisecond)
		destroyed <- b.Destroy(ctx, first.ID())
	}()
	second, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(ctx, second.ID()) })
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	exit, out := run(t, second, "/bin/sh", "-c", `cat /cache/go/mark`)
	if out != "first\n" {
		t.Errorf("the next sandbox found %q in its cache, want the ended holder's changes", out)
	}
	if len(exit.CacheMisses) != 0 {
		t.Errorf("the next sandbox was told of a miss: %+v", exit.CacheMisses)
	}
}

// TestCacheBoundedWhileMounted: what a job writes into its cache lands
// on a copy-on-write layer as large as its disk, not on the host: past
// it the job gets ENOSPC and the host's cache directory does not grow
// while the job runs (a bind mount of it let a job of disk 256M write 1.5
// GiB to the host's root); after the job, what it left there within the
// cap is the cache's (issue 34, item 2).
func TestCacheBoundedWhileMounted(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir, b.caches.max = t.TempDir(), 1<<30
	key := strings.Repeat("c", 16)
	spec := defaultSpec()
	spec.DiskBytes = 16 << 20
	spec.Caches = []sandbox.Cache{{Name: "go", Key: key}}
	sb := create(t, b, spec)
	exit, out := run(t, sb, "/bin/sh", "-c", `echo kept >/cache/go/note
		head -c 40000000 /dev/zero >/cache/go/big; echo "big: $?"
		rm -f /cache/go/big; echo after >>/cache/go/note && cat /cache/go/note`)
	if exit.Code != 0 || !strings.Contains(out, "No space left on device") || !strings.Contains(out, "big: 1") ||
		!strings.HasSuffix(out, "kept\nafter\n") {
		t.Errorf("a job writing 40 MB into its cache with a disk of 16 MiB: exit %d\n%s\nwant ENOSPC, and the cache usable after", exit.Code, out)
	}
	host := filepath.Join(b.caches.dir, key, "go")
	if n := treeSize(host); n > 1<<20 {
		t.Errorf("the host's cache directory holds %d bytes while the job's sandbox lives", n)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(host, "note")); err != nil || string(data) != "kept\nafter\n" {
		t.Errorf("the cache after the job: note %q %v", data, err)
	}
	if _, err := os.Lstat(filepath.Join(host, "big")); !os.IsNotExist(err) {
		t.Errorf("the file the job removed is in the cache (%v)", err)
	}
}

// TestCacheMergeBack: after the job its cache is the one it saw: what it
// removed (a file, a directory it replaced) is gone, what it made is
// there; and a link the cache held, which the job replaced by a directory,
// never leads the server out of the cache when it writes the job's files
// back.
func TestCacheMergeBack(t *testing.T) {
	b := newBackend(t, 0)
	b.caches.dir, b.caches.max = t.TempDir(), 1<<30
	key := strings.Repeat("d", 16)
	host := filepath.Join(b.caches.dir, key, "go")
	outside := t.TempDir()
	for _, d := range []string{"o", "keep"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"old": "old", "o/a": "a", "keep/k": "k", "changed": "before"} {
		if err := os.WriteFile(filepath.Join(host, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(host, "evil")); err != nil {
		t.Fatal(err)
	}
	spec := defaultSpec()
	spec.Caches = []sandbox.Cache{{Name: "go", Key: key}}
	sb := create(t, b, spec)
	exit, out := run(t, sb, "/bin/sh", "-c", `cd /cache/go && rm old && rm -r o && mkdir o && echo b >o/b &&
		rm evil && mkdir evil && echo x >evil/pwned && echo after >changed && mkdir -p d/e && echo new >d/e/f && ln -s keep/k link`)
	if exit.Code != 0 {
		t.Fatalf("the job: %d %s", exit.Code, out)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"o/b": "b\n", "evil/pwned": "x\n", "changed": "after\n", "d/e/f": "new\n", "keep/k": "k", "link": "k"} {
		if data, err := os.ReadFile(filepath.Join(host, name)); err != nil || string(data) != want {
			t.Errorf("%s in the cache after the job: %q %v, want %q", name, data, err, want)
		}
	}
	for _, name := range []string{"old", "o/a"} {
		if _, err := os.Lstat(filepath.Join(host, name)); !os.IsNotExist(err) {
			t.Errorf("%s, which the job removed, is in the cache (%v)", name, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(host, "evil")); err != nil || !fi.IsDir() {
		t.Errorf("evil in the cache: %v %v, want the job's directory", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "pwned")); !os.IsNotExist(err) {
		t.Errorf("the server wrote the job's file through a link, out of the cache (%v)", err)
	}
}

// TestKeptCacheHeldPerCommand: a kept sandbox takes its cache for each
// command's run, not for its life (issue 34, item 5): while it stays
// open between commands, another job of the project gets the cache with
// what its first command wrote, and what that job wrote is there for the
// kept sandbox's next command (the last writer wins, per file). A
// command of the kept sandbox that asks while a job holds the cache has
// an empty one, and its Exit says so and why; so does a job that asks
// while one of the kept sandbox's commands runs.
func TestKeptCacheHeldPerCommand(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			b.caches.dir, b.caches.max = t.TempDir(), 1<<30
			key := strings.Repeat("e", 16)
			host := filepath.Join(b.caches.dir, key, "go")
			spec := defaultSpec()
			spec.Caches = []sandbox.Cache{{Name: "go", Key: key}}
			keptSpec := spec
			keptSpec.MultiExec, keptSpec.Expires = true, time.Now().Add(time.Minute)
			kept := create(t, b, keptSpec)
			sh := func(sb sandbox.Instance, script string, wantMiss string) string {
				t.Helper()
				exit, out := run(t, sb, "/bin/sh", "-c", script)
				if exit.Code != 0 {
					t.Fatalf("%q: exit %d: %s", script, exit.Code, out)
				}
				checkMisses(t, exit, wantMiss)
				return out
			}

			sh(kept, `echo one >/cache/go/mark && mkdir -p /cache/go/build && echo obj >/cache/go/build/obj`, "")
			if data, err := os.ReadFile(filepath.Join(host, "mark")); err != nil || string(data) != "one\n" {
				t.Errorf("the cache after the kept sandbox's command: mark %q %v, want what it wrote", data, err)
			}
			// The kept sandbox stays open; a job of the project has the cache.
			job := create(t, b, spec)
			if out := sh(job, `cat /cache/go/mark /cache/go/build/obj && echo two >/cache/go/mark && echo job >/cache/go/jobfile`, ""); out != "one\nobj\n" {
				t.Errorf("a job while the kept sandbox stays open found %q in the cache, want what its command wrote", out)
			}
			if err := job.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
			if out := sh(kept, `cat /cache/go/mark /cache/go/jobfile`, ""); out != "two\njob\n" {
				t.Errorf("the kept sandbox's next command found %q, want the job's changes", out)
			}

			// A job holds the cache: the kept sandbox's command has an empty one.
			holder := create(t, b, spec)
			if out := sh(kept, `ls -A /cache/go; touch /cache/go/x && echo writable`, "go: in use by sandbox "+holder.ID()); out != "writable\n" {
				t.Errorf("a command of the kept sandbox while a job holds the cache found %q, want an empty one of its own", out)
			}
			if err := holder.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(host, "x")); !os.IsNotExist(err) {
				t.Errorf("what the command wrote in its empty cache reached the project's (%v)", err)
			}

			// A command of the kept sandbox runs and holds it: a job has an
			// empty one; once the command ends its changes are the cache's.
			long := start(t, kept, "/bin/sh", "-c", `echo four >/cache/go/four && while [ ! -e /workspace/go-on ]; do sleep 0.02; done`)
			other := create(t, b, spec)
			if out := sh(other, `ls -A /cache/go; echo ok`, "go: in use by sandbox "+kept.ID()); out != "ok\n" {
				t.Errorf("a job while a command of the kept sandbox runs found %q in its cache, want an empty one", out)
			}
			if err := kept.WriteFile(context.Background(), "/workspace/go-on", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if exit, out := finish(t, long); exit.Code != 0 || len(exit.CacheMisses) != 0 {
				t.Fatalf("the kept sandbox's long command: %+v %s", exit, out)
			}
			if data, err := os.ReadFile(filepath.Join(host, "four")); err != nil || string(data) != "four\n" {
				t.Errorf("the cache after the long command: four %q %v", data, err)
			}
			if lock, err := os.ReadFile(host + ".lock"); err != nil || len(lock) != 0 {
				t.Errorf("between the kept sandbox's commands its cache's lock holds %q (%v), want it free", lock, err)
			}
		})
	}
}

// checkMisses wants exit to name the caches the command had an empty one
// of as want says ("" for none; "NAME: REASON" begins the one it wants).
func checkMisses(t *testing.T, exit sandbox.Exit, want string) {
	t.Helper()
	var got []string
	for _, m := range exit.CacheMisses {
		got = append(got, m.Name+": "+m.Reason)
	}
	if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], want)) {
		t.Errorf("the command's cache misses: %q, want %q", got, want)
	}
}
