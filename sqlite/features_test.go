package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

func TestIdempotencyEventsArtifacts(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	j := newJob("a")
	j.IdempotencyKey, j.TokenHash, j.Result = "key-1", "hash", "r"
	j.LastHeartbeat = time.Now().UTC().Truncate(time.Microsecond)
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	dup := newJob("b")
	dup.IdempotencyKey = "key-1"
	if err := s.CreateJob(ctx, dup); err == nil {
		t.Fatal("a second job with the same idempotency key was stored")
	}
	if err := s.CreateJob(ctx, newJob("c")); err != nil { // no key: no clash
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, newJob("d")); err != nil {
		t.Fatal(err)
	}
	got, err := s.JobByIdempotencyKey(ctx, "key-1")
	if err != nil || got.ID != "a" || got.TokenHash != "hash" || got.Result != "r" || !got.LastHeartbeat.Equal(j.LastHeartbeat) {
		t.Fatalf("by key: %+v %v", got, err)
	}
	if _, err := s.JobByIdempotencyKey(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatal(err)
	}

	for i := range 5 {
		if err := s.AddEvent(ctx, "a", delegate.Event{Time: time.Now(), Message: fmt.Sprint("step ", i)}, 3); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events(ctx, "a")
	if err != nil || len(evs) != 3 || evs[0].Message != "step 2" || evs[2].Message != "step 4" {
		t.Fatalf("events kept: %+v %v", evs, err)
	}

	for _, a := range []delegate.Artifact{{Name: "z.txt", Size: 1, SHA256: "1"}, {Name: "a/b.txt", Size: 2, SHA256: "2"}} {
		if err := s.AddArtifact(ctx, "a", a); err != nil {
			t.Fatal(err)
		}
	}
	arts, err := s.Artifacts(ctx, "a")
	if err != nil || len(arts) != 2 || arts[0].Name != "a/b.txt" || arts[1].SHA256 != "1" {
		t.Fatalf("artifacts: %+v %v", arts, err)
	}
	if n, err := s.OutputSize(ctx, "a"); err != nil || n != 0 {
		t.Fatalf("output size %d %v", n, err)
	}
	s.AppendOutput(ctx, "a", stdout("12345"), 5)
	if n, _ := s.OutputSize(ctx, "a"); n != 5 {
		t.Fatalf("output size %d", n)
	}
}
