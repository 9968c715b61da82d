package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestSaveProgress: one call stores many jobs' coalesced progress; the
// timeline keeps the newest MaxTimeline entries and counts the rest; a
// finished job keeps its final progress; an unknown job is skipped.
func TestSaveProgress(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	for _, id := range []string{"a", "b", "done"} {
		if err := s.CreateJob(ctx, newJob(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateJob(ctx, "done", func(j *delegate.Job) error {
		j.Status, j.Progress = delegate.StatusCancelled, "cancelled"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	beat := time.Now().UTC().Truncate(time.Microsecond)
	result := "so far"
	many := make([]delegate.Event, 250)
	for i := range many {
		many[i] = delegate.Event{Time: beat, Message: fmt.Sprint("line ", i)}
	}
	err := s.SaveProgress(ctx, []delegate.JobProgress{
		{ID: "a", Progress: "step 2", Heartbeat: beat, Result: &result, Events: []delegate.Event{{Time: beat, Message: "step 1"}, {Time: beat, Message: "step 2"}}},
		{ID: "b", Progress: "line 249", Events: many, Dropped: 1000},
		{ID: "done", Progress: "late", Heartbeat: beat, Events: []delegate.Event{{Time: beat, Message: "late"}}},
		{ID: "nobody", Progress: "x", Events: []delegate.Event{{Time: beat, Message: "x"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.GetJob(ctx, "a")
	if a.Progress != "step 2" || !a.LastHeartbeat.Equal(beat) || a.Result != "so far" || a.TimelineDropped != 0 {
		t.Fatalf("a: %+v", a)
	}
	if evs, _ := s.Events(ctx, "a"); len(evs) != 2 || evs[1].Message != "step 2" {
		t.Fatalf("a's timeline: %+v", evs)
	}
	b, _ := s.GetJob(ctx, "b")
	evs, _ := s.Events(ctx, "b")
	if b.Progress != "line 249" || len(evs) != delegate.MaxTimeline || evs[0].Message != "line 50" || b.TimelineDropped != 1050 {
		t.Fatalf("b: progress %q, %d events from %q, %d dropped", b.Progress, len(evs), evs[0].Message, b.TimelineDropped)
	}
	// More events push the oldest out, one for one.
	if err := s.SaveProgress(ctx, []delegate.JobProgress{{ID: "b", Events: many[:10]}}); err != nil {
		t.Fatal(err)
	}
	b, _ = s.GetJob(ctx, "b")
	evs, _ = s.Events(ctx, "b")
	if len(evs) != delegate.MaxTimeline || evs[0].Message != "line 60" || evs[len(evs)-1].Message != "line 9" || b.TimelineDropped != 1060 {
		t.Fatalf("b after 10 more: %d events from %q to %q, %d dropped", len(evs), evs[0].Message, evs[len(evs)-1].Message, b.TimelineDropped)
	}
	done, _ := s.GetJob(ctx, "done")
	if done.Progress != "cancelled" || !done.LastHeartbeat.IsZero() {
		t.Fatalf("finished job's progress changed: %+v", done)
	}
	if evs, _ := s.Events(ctx, "done"); len(evs) != 1 || evs[0].Message != "late" {
		t.Fatalf("finished job's timeline: %+v", evs)
	}
	if _, err := s.GetJob(ctx, "nobody"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
}

// TestConcurrentWritesGrouped: concurrent writes all land, and one write
// that fails (a duplicate idempotency key) undoes nothing of the writes
// committed in the same group.
func TestConcurrentWritesGrouped(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures = map[string]int{}
	)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := newJob(fmt.Sprint("j", i))
			j.IdempotencyKey = fmt.Sprint("key-", i%8)
			if err := s.CreateJob(ctx, j); err != nil {
				mu.Lock()
				failures[j.IdempotencyKey]++
				mu.Unlock()
				return
			}
			for k := range 5 {
				if _, err := s.UpdateJob(ctx, j.ID, func(j *delegate.Job) error { j.Progress = fmt.Sprint("step ", k); return nil }); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	jobs, _, err := s.ListJobs(ctx, delegate.JobFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 8 {
		t.Fatalf("%d jobs stored, want one per key (8); failures %v", len(jobs), failures)
	}
	for _, j := range jobs {
		if j.Progress != "step 4" || j.Manifest.Task != "echo "+j.ID {
			t.Fatalf("job %s: progress %q, task %q", j.ID, j.Progress, j.Manifest.Task)
		}
		if failures[j.IdempotencyKey] != 7 {
			t.Fatalf("key %s: %d refused, want 7", j.IdempotencyKey, failures[j.IdempotencyKey])
		}
	}
}

// TestFinishesCounts: the counter moves once per job that reaches a
// terminal status, whichever process (here: store) does it.
func TestFinishesCounts(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s := open(t, path)
	other := open(t, path) // another process sharing the file
	for _, id := range []string{"a", "b"} {
		if err := s.CreateJob(ctx, newJob(id)); err != nil {
			t.Fatal(err)
		}
	}
	n0, err := s.Finishes(ctx)
	if err != nil || n0 != 0 {
		t.Fatalf("finishes %d %v", n0, err)
	}
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.Progress = "x"; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Finishes(ctx); n != 0 {
		t.Fatalf("a progress update counted as a finish: %d", n)
	}
	if _, err := other.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.Status = delegate.StatusCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Finishes(ctx); n != 1 {
		t.Fatalf("finishes after a cancel in another process: %d", n)
	}
	// An update of a finished job that changes other fields is no finish.
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.SandboxID = ""; j.Progress = "released"; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := other.Finishes(ctx); n != 1 {
		t.Fatalf("finishes after a later update: %d", n)
	}
}

// TestManifestIsImmutable: a caller changing the manifest of a job it got
// changes nothing stored, nor what the next caller gets; UpdateJob never
// writes the manifest; files are read apart.
func TestManifestIsImmutable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s := open(t, path)
	j := newJob("a")
	j.Manifest.Files = []delegate.File{{Path: "a.txt", Content: "aGVsbG8="}}
	j.Manifest.Secrets = []string{"S"}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	j.Manifest.Env["A"] = "changed by the submitter after the fact"
	got, _ := s.GetJob(ctx, "a")
	if got.Manifest.Env["A"] != "b" || len(got.Manifest.Files) != 0 {
		t.Fatalf("stored manifest: %+v", got.Manifest)
	}
	got.Manifest.Env["A"] = "changed"
	got.Manifest.Secrets[0] = "T"
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error {
		j.Manifest.Task = "rm -rf /"
		j.Progress = "x"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*struct{ name string }{{"same process"}, {"reopened"}} {
		if st.name == "reopened" {
			s = open(t, path)
		}
		again, err := s.GetJob(ctx, "a")
		if err != nil || again.Manifest.Env["A"] != "b" || again.Manifest.Secrets[0] != "S" || again.Manifest.Task != "echo a" || again.Progress != "x" {
			t.Fatalf("%s: %+v %v", st.name, again, err)
		}
		files, err := s.JobFiles(ctx, "a")
		if err != nil || len(files) != 1 || files[0].Path != "a.txt" || files[0].Content != "aGVsbG8=" {
			t.Fatalf("%s: files %+v %v", st.name, files, err)
		}
	}
	if files, err := s.JobFiles(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) || files != nil {
		t.Fatalf("files of an unknown job: %v %v", files, err)
	}
}

// TestJobManifest: a job's manifest alone, cached or read, without files.
func TestJobManifest(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s := open(t, path)
	j := newJob("a")
	j.Manifest.StatusMode = delegate.StatusModeDetailed
	j.Manifest.Files = []delegate.File{{Path: "a.txt", Content: "aGk="}}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cached", "read by another store"} {
		store := s
		if name != "cached" {
			store = open(t, path)
		}
		m, err := store.JobManifest(ctx, "a")
		if err != nil || m.StatusMode != delegate.StatusModeDetailed || m.Task != "echo a" || len(m.Files) != 0 {
			t.Fatalf("%s: %+v %v", name, m, err)
		}
		m.Env["A"] = "changed" // a copy
	}
	if m, _ := s.JobManifest(ctx, "a"); m.Env["A"] != "b" {
		t.Fatalf("the cached manifest was changed through a copy: %v", m.Env)
	}
	if _, err := s.JobManifest(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
}
