package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// testPrune: Prune removes the finished jobs that ended before the cutoff
// with everything kept of them, and the ended sandboxes and networks no
// one names; it keeps what is active, recent, in a kept sandbox that
// still exists, or a persistent job's unreleased sandbox; it names the
// artifact contents no job left names; a dry run counts the same and
// removes nothing; a second prune finds nothing more.
func testPrune(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	now := time.Now().UTC()
	old, recent := now.Add(-48*time.Hour), now.Add(-time.Hour)
	cutoff := now.Add(-24 * time.Hour)

	finished := func(id string, at time.Time, fn func(j *delegate.Job)) {
		t.Helper()
		j := NewJob(id)
		j.Status = delegate.StatusRunning
		if fn != nil {
			fn(j)
		}
		create(t, s, j)
		if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error {
			j.Status, j.FinishedAt = delegate.StatusSuccess, at
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Gone: old and finished, with output, a timeline, artifacts, a
	// question, a workspace and an ended network.
	finished("j-old", old, nil)
	if err := s.AppendOutput(ctx, "j-old", Pieces("0123456789", "E:err"), 13); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEvent(ctx, "j-old", delegate.Event{Time: old, Message: "step"}, delegate.MaxTimeline); err != nil {
		t.Fatal(err)
	}
	for _, a := range []delegate.Artifact{{Name: "a.txt", Size: 1, SHA256: sum('a')}, {Name: "shared.txt", Size: 1, SHA256: sum('b')}} {
		if err := s.AddArtifact(ctx, "j-old", a); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.AddQuestion(ctx, NewQuestion("j-old", "q1")); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBaseline(ctx, "j-old", "/src", []byte(`{"version":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveApply(ctx, "j-old", "/src", "j-old"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNetwork(ctx, &delegate.NetworkState{ID: "j-old", Policy: delegate.Egress(), TokenHash: "h-old", CreatedAt: old, EndedAt: old}); err != nil {
		t.Fatal(err)
	}
	// Kept: finished recently (sharing an artifact's content with j-old).
	finished("j-recent", recent, nil)
	if err := s.AddArtifact(ctx, "j-recent", delegate.Artifact{Name: "b.txt", Size: 1, SHA256: sum('b')}); err != nil {
		t.Fatal(err)
	}
	// Kept: not finished, though old.
	j := NewJob("j-running")
	j.CreatedAt, j.UpdatedAt = old, old
	create(t, s, j)
	// Kept: a command of a kept sandbox that still exists; gone: one of a
	// sandbox released long ago, and that sandbox with it.
	mkSandbox := func(id string, state delegate.SandboxState, ended time.Time) {
		t.Helper()
		if err := s.CreateSandbox(ctx, &delegate.Sandbox{ID: id, State: state, Backend: "local", Instance: "i-" + id,
			CreatedAt: old, LastUsedAt: old, ExpiresAt: now.Add(time.Hour), EndedAt: ended}); err != nil {
			t.Fatal(err)
		}
	}
	mkSandbox("sbx-live", delegate.SandboxIdle, time.Time{})
	mkSandbox("sbx-ended", delegate.SandboxReleased, old)
	mkSandbox("sbx-ended-recently", delegate.SandboxGone, recent)
	finished("j-in-live", old, func(j *delegate.Job) { j.Sandbox, j.Manifest.Sandbox = "sbx-live", "sbx-live" })
	finished("j-in-ended", old, func(j *delegate.Job) { j.Sandbox, j.Manifest.Sandbox = "sbx-ended", "sbx-ended" })
	// Kept: a persistent job whose sandbox was never released; gone: one
	// released.
	finished("j-persistent", old, func(j *delegate.Job) {
		j.Manifest.Lifecycle, j.SandboxID = delegate.LifecyclePersistent, "sb-p"
	})
	finished("j-released", old, func(j *delegate.Job) { j.Manifest.Lifecycle = delegate.LifecyclePersistent })

	wantGone := []string{"j-old", "j-in-ended", "j-released"}
	wantKept := []string{"j-recent", "j-running", "j-in-live", "j-persistent"}
	check := func(p *delegate.Pruned, dry bool) {
		t.Helper()
		if p.Jobs != len(wantGone) || p.Sandboxes != 1 || p.Networks != 1 {
			t.Errorf("dry %v: pruned %d jobs, %d sandboxes, %d networks; want %d, 1, 1", dry, p.Jobs, p.Sandboxes, p.Networks, len(wantGone))
		}
		if p.OutputBytes != 13 || p.WorkspaceBytes < int64(len(`{"version":1}`)) || p.Bytes < p.OutputBytes+p.WorkspaceBytes {
			t.Errorf("dry %v: freed %d bytes of output, %d of workspace, %d in all", dry, p.OutputBytes, p.WorkspaceBytes, p.Bytes)
		}
		if !slices.Equal(p.Artifacts, []string{sum('a')}) {
			t.Errorf("dry %v: artifact contents named by no job left: %v, want only a's (b is j-recent's too)", dry, p.Artifacts)
		}
	}
	p, err := s.Prune(ctx, cutoff, delegate.PruneOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	check(p, true)
	for _, id := range append(wantGone, wantKept...) {
		if _, err := s.GetJob(ctx, id); err != nil {
			t.Errorf("after a dry run: %v", err)
		}
	}

	p, err = open().Prune(ctx, cutoff, delegate.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	check(p, false)
	s = open()
	for _, id := range wantGone {
		if _, err := s.GetJob(ctx, id); !errors.Is(err, delegate.ErrNotFound) {
			t.Errorf("job %s after the prune: %v, want not found", id, err)
		}
		if _, err := s.JobManifest(ctx, id); !errors.Is(err, delegate.ErrNotFound) {
			t.Errorf("manifest of job %s after the prune: %v, want not found", id, err)
		}
	}
	for _, id := range wantKept {
		if _, err := s.GetJob(ctx, id); err != nil {
			t.Errorf("job %s after the prune: %v", id, err)
		}
	}
	if outs, err := s.ReadOutput(ctx, "j-old", 0, 100); err == nil && len(outs) > 0 {
		t.Errorf("output of a pruned job: %v", outs)
	}
	if as, err := s.Artifacts(ctx, "j-old"); err == nil && len(as) > 0 {
		t.Errorf("artifacts of a pruned job: %v", as)
	}
	if _, err := s.JobWorkspace(ctx, "j-old"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("workspace of a pruned job: %v, want not found", err)
	}
	if id, err := s.LastApply(ctx, "j-old", "/src"); err != nil || id != "" {
		t.Errorf("the apply of a pruned job: %q %v, want none", id, err)
	}
	if _, err := s.GetNetwork(ctx, "j-old"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("network of a pruned job: %v, want not found", err)
	}
	if as, err := s.Artifacts(ctx, "j-recent"); err != nil || len(as) != 1 {
		t.Errorf("artifacts of a kept job: %v, %v", as, err)
	}
	for id, want := range map[string]bool{"sbx-live": true, "sbx-ended": false, "sbx-ended-recently": true} {
		_, err := s.GetSandbox(ctx, id)
		if want && err != nil || !want && !errors.Is(err, delegate.ErrNotFound) {
			t.Errorf("sandbox %s after the prune: %v (want kept: %v)", id, err, want)
		}
	}
	if sb, err := s.GetSandbox(ctx, "sbx-live"); err != nil || sb.Commands != 1 {
		t.Errorf("the live sandbox counts its kept command: %+v, %v", sb, err)
	}

	p, err = s.Prune(ctx, cutoff, delegate.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Jobs != 0 || p.Sandboxes != 0 || p.Networks != 0 || p.Bytes != 0 || len(p.Artifacts) != 0 {
		t.Errorf("a second prune: %+v, want nothing", p)
	}
}

// testPruneMany: a prune removes more jobs than one batch holds.
func testPruneMany(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	old := time.Now().UTC().Add(-time.Hour)
	const n = 130
	for i := range n {
		id := "j-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		create(t, s, NewJob(id))
		if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error {
			j.Status, j.FinishedAt = delegate.StatusCancelled, old
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Prune(ctx, time.Now(), delegate.PruneOptions{})
	if err != nil || p.Jobs != n {
		t.Fatalf("pruned %+v, %v; want %d jobs", p, err, n)
	}
	if jobs, _, err := s.ListJobs(ctx, delegate.JobFilter{Limit: 10}); err != nil || len(jobs) != 0 {
		t.Errorf("jobs left: %d, %v", len(jobs), err)
	}
}

// sum is a made-up sha256 in hex, all c.
func sum(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// testOutputLost: what a job's output lost, and why, is read back as
// written, through another handle too.
func testOutputLost(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("j1"))
	if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error {
		j.OutputBytes, j.OutputLostBytes, j.OutputLost = 1000, 700, "no space left on /data"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := open().GetJob(ctx, "j1")
	if err != nil || got.OutputBytes != 1000 || got.OutputLostBytes != 700 || got.OutputLost != "no space left on /data" {
		t.Errorf("read back %+v, %v", got, err)
	}
}
