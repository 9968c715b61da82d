package engine_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
)

// TestCachesByPrincipal (issue 34, item 5): a cache is keyed by whose job
// it is and by its source (a git source's ref too): the jobs of one
// principal and source share their caches, and no job gets a cache of
// another principal's, whose files it would run (a planted module), nor
// of another ref's. Before, the key was the source's alone.
func TestCachesByPrincipal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	dir := project(t, root, "calc", map[string]string{"calc.go": "package calc\n"})
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	backend := sandboxtest.NewFake()
	backend.Caps.Caches = true
	var (
		mu   sync.Mutex
		keys = map[string][]sandbox.Cache{} // by job
	)
	backend.CreateHook = func(_ context.Context, spec sandbox.Spec) error {
		mu.Lock()
		defer mu.Unlock()
		keys[spec.JobID] = spec.Caches
		return nil
	}
	eng := engine.New(store, backend, engine.Config{WorkspaceRoots: []string{root}, PollInterval: 10 * time.Millisecond,
		Defaults: delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}, ArtifactDir: t.TempDir()})
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	as := func(name string) context.Context {
		return delegate.WithPrincipal(ctx, &delegate.Principal{Name: name, Scopes: []delegate.Scope{delegate.ScopeJobs}})
	}
	cacheOf := func(ctx context.Context) string {
		t.Helper()
		m := script("go build ./...")
		m.Workspace, m.Caches = &delegate.WorkspaceSource{Dir: dir}, []string{"go"}
		j, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-backend.Started:
			p.Finish(sandbox.Exit{})
		case <-time.After(10 * time.Second):
			t.Fatal("no process started")
		}
		if _, err := eng.Wait(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if c := keys[j.ID]; len(c) == 1 && c[0].Name == "go" {
			return c[0].Key
		}
		t.Fatalf("job %s's caches: %+v", j.ID, keys[j.ID])
		return ""
	}
	alice, bob, alice2, local := cacheOf(as("alice")), cacheOf(as("bob")), cacheOf(as("alice")), cacheOf(ctx)
	if alice != alice2 {
		t.Errorf("two jobs of one principal and source have caches %s and %s, not one", alice, alice2)
	}
	if alice == bob || alice == local || bob == local {
		t.Errorf("principals share a cache: alice %s, bob %s, the local user %s", alice, bob, local)
	}
	if local != engine.CacheKey(delegate.LocalPrincipal, &delegate.WorkspaceSource{Dir: dir}) {
		t.Errorf("the server's own work is not the local user's: %s", local)
	}

	git := func(p, ref string) string {
		return engine.CacheKey(p, &delegate.WorkspaceSource{Git: "https://example.com/x.git", Ref: ref})
	}
	for _, tc := range []struct {
		name string
		a, b string
		same bool
	}{
		{"one ref", git("alice", "main"), git("alice", "main"), true},
		{"two refs", git("alice", "main"), git("alice", "dev"), false},
		{"two principals", git("alice", "main"), git("bob", "main"), false},
		{"no principal is the local user", git("", "main"), git(delegate.LocalPrincipal, "main"), true},
		{"a dir and a git source", engine.CacheKey("alice", &delegate.WorkspaceSource{Dir: "/x"}),
			engine.CacheKey("alice", &delegate.WorkspaceSource{Git: "/x"}), false},
	} {
		if (tc.a == tc.b) != tc.same {
			t.Errorf("%s: keys %s and %s, want the same: %v", tc.name, tc.a, tc.b, tc.same)
		}
	}
}

// TestCacheMissInResult (issue 34, item 5): a job that had an empty cache
// of its own instead of its project's (another sandbox held it) is told
// so in its result and its record, with why, not only in its timeline;
// a job that had its cache is told nothing.
func TestCacheMissInResult(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	dir := project(t, root, "calc", map[string]string{"calc.go": "package calc\n"})
	backend := sandboxtest.NewFake()
	backend.Caps.Caches = true
	eng := engine.New(testkit.OpenStore(t), backend, engine.Config{WorkspaceRoots: []string{root}, PollInterval: 10 * time.Millisecond,
		Defaults: delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}, ArtifactDir: t.TempDir()})
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	const why = "in use by sandbox sb-0123456789ab: this job had an empty one of its own"
	for _, tc := range []struct {
		name   string
		misses []sandbox.CacheMiss
		want   string
	}{
		{"missed", []sandbox.CacheMiss{{Name: "go", Reason: why}}, "go: " + why},
		{"had it", nil, ""},
	} {
		m := script("go build ./...")
		m.Workspace, m.Caches = &delegate.WorkspaceSource{Dir: dir}, []string{"go"}
		j, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-backend.Started:
			p.Finish(sandbox.Exit{CacheMisses: tc.misses})
		case <-time.After(10 * time.Second):
			t.Fatal("no process started")
		}
		done := testkit.Wait(t, eng, j.ID)
		res, err := eng.Result(ctx, j.ID, delegate.ResultOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if done.Status != delegate.StatusSuccess || done.CacheMissed != tc.want || res.CacheMissed != tc.want {
			t.Errorf("%s: job %s, cache_missed %q, result's %q; want %q", tc.name, done.Status, done.CacheMissed, res.CacheMissed, tc.want)
		}
	}
}
