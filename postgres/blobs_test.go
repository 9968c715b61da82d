package postgres_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

func sum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// TestBlobs: an artifact's content kept by one handle is read by another
// (another server); kept twice it is one; a content no job names goes
// at a prune once its grace is over, one a job names never.
func TestBlobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := open(t, url), open(t, url)
	named, loose := []byte(strings.Repeat("a report\n", 1000)), []byte{0, 1, 2, 255}
	for _, data := range [][]byte{named, loose, named} {
		if err := a.PutBlob(ctx, sum(data), data); err != nil {
			t.Fatal(err)
		}
	}
	for _, data := range [][]byte{named, loose} {
		if got, err := b.Blob(ctx, sum(data)); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through another handle: %d bytes, %v", len(got), err)
		}
	}
	if _, err := b.Blob(ctx, sum([]byte("none"))); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("a content never kept: %v", err)
	}
	now := time.Now().UTC()
	if err := a.CreateJob(ctx, &delegate.Job{ID: "job-1", Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now,
		Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.AddArtifact(ctx, "job-1", delegate.Artifact{Name: "report.txt", Size: int64(len(named)), SHA256: sum(named)}); err != nil {
		t.Fatal(err)
	}
	all := []string{sum(named), sum(loose)}
	for _, c := range []struct {
		grace time.Duration
		dry   bool
		n     int
		size  int64
	}{
		{time.Hour, false, 0, 0},         // kept just now: spared
		{0, true, 1, int64(len(loose))},  // dry: counted, not removed
		{0, false, 1, int64(len(loose))}, // removed: the one no job names
		{0, false, 0, 0},                 // gone already
	} {
		if n, size, err := b.DropBlobs(ctx, all, c.grace, c.dry); err != nil || n != c.n || size != c.size {
			t.Fatalf("drop (grace %s, dry %v): %d contents, %d bytes, %v; want %d, %d", c.grace, c.dry, n, size, err, c.n, c.size)
		}
	}
	if _, err := a.Blob(ctx, sum(named)); err != nil {
		t.Errorf("the content a job names: %v", err)
	}
	if _, err := a.Blob(ctx, sum(loose)); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("the content no job names, after the prune: %v", err)
	}
}

// TestArtifactsAcrossServers: the artifacts of a job that server a ran
// are read through server b, whose artifact directory is its own (no
// directory shared): their content is in the store.
func TestArtifactsAcrossServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	fake := sandboxtest.NewFake()
	a := startEngine(t, open(t, url), fake, engine.Config{})
	b := startEngine(t, open(t, url), nil, engine.Config{})
	job, err := a.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "make report", Artifacts: []string{"out/**"}},
		delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := <-fake.Started
	report := []byte("a report\n")
	if err := p.Sandbox.WriteFile(ctx, delegate.Workspace+"/out/report.txt", report, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("made\n"))
	p.Finish(sandbox.Exit{})
	c, cancel := context.WithTimeout(ctx, time.Minute) // a hang guard
	defer cancel()
	if j, err := b.Wait(c, job.ID); err != nil || j.Status != delegate.StatusSuccess {
		t.Fatalf("the job, on b: %+v, %v", j, err)
	}
	res, err := b.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil || string(res.Output) != "made\n" || len(res.Artifacts) != 1 || res.Artifacts[0].SHA256 != sum(report) {
		t.Fatalf("the result, on b: %+v, %v", res, err)
	}
	art, data, err := b.ReadArtifact(ctx, job.ID, "out/report.txt")
	if err != nil || !bytes.Equal(data, report) || art.Size != int64(len(report)) {
		t.Fatalf("the artifact, on b: %+v %q, %v", art, data, err)
	}
}
