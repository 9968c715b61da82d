package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestGC: GC removes the jobs that ended more than the retention ago and
// the artifact files no job left names (not one another job shares); a
// dry run counts the same and removes nothing; recent jobs stay whole.
func TestGC(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{Retention: time.Hour})
	ctx := context.Background()
	run := func(files map[string]string) string {
		t.Helper()
		m := script("build")
		m.Artifacts = []string{"*.txt"}
		job := f.submit(m)
		p := f.started()
		for name, data := range files {
			p.Sandbox.WriteFile(ctx, "/workspace/"+name, []byte(data), 0o644)
		}
		p.Write([]byte("some output"))
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, job.ID)
		return job.ID
	}
	old := run(map[string]string{"a.txt": "only-old", "b.txt": "shared"})
	recent := run(map[string]string{"c.txt": "shared"})
	if _, err := f.store.UpdateJob(ctx, old, func(j *delegate.Job) error {
		j.FinishedAt = time.Now().Add(-2 * time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	blob := func(data string) string {
		h := sha256.Sum256([]byte(data))
		sum := hex.EncodeToString(h[:])
		return filepath.Join(f.cfg.ArtifactDir, sum[:2], sum)
	}
	// Written long enough ago for a prune to take them.
	for _, data := range []string{"only-old", "shared"} {
		then := time.Now().Add(-time.Hour)
		if err := os.Chtimes(blob(data), then, then); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	dry, err := f.eng.GC(ctx, delegate.PruneOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Jobs != 1 || dry.ArtifactFiles != 1 || dry.ArtifactBytes != int64(len("only-old")) || dry.OutputBytes != int64(len("some output")) {
		t.Errorf("dry run: %+v; want 1 job, 1 artifact file of 8 bytes, 11 bytes of output", dry)
	}
	if _, err := f.eng.Get(ctx, old); err != nil || !exists(blob("only-old")) {
		t.Errorf("a dry run removed something: %v", err)
	}

	p, err := f.eng.GC(ctx, delegate.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Jobs != dry.Jobs || p.ArtifactFiles != dry.ArtifactFiles || p.Bytes != dry.Bytes {
		t.Errorf("GC %+v, its dry run %+v", p, dry)
	}
	if _, err := f.eng.Get(ctx, old); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("the old job after GC: %v, want not found", err)
	}
	if exists(blob("only-old")) || !exists(blob("shared")) {
		t.Errorf("after GC: the old job's own artifact file exists: %v; the shared one: %v (want false, true)",
			exists(blob("only-old")), exists(blob("shared")))
	}
	if _, data, err := f.eng.ReadArtifact(ctx, recent, "c.txt"); err != nil || string(data) != "shared" {
		t.Errorf("the recent job's artifact: %q, %v", data, err)
	}
	if got := f.output(recent); got != "some output" {
		t.Errorf("the recent job's output: %q", got)
	}

	off := newFixture(t, engine.Config{Retention: -1})
	if p, err := off.eng.GC(ctx, delegate.PruneOptions{}); err != nil || p.Jobs != 0 || !p.Before.IsZero() {
		t.Errorf("retention off: %+v, %v", p, err)
	}
}
