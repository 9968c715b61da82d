package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestCancelOrphan: a job whose server has stopped (without killing it) is
// cancelled from another engine, as `delegate jobs cancel` does with no
// server running. That engine takes the job over, kills its process,
// collects what it wrote meanwhile and destroys its sandbox, instead of
// only recording "cancelled" and leaving it all running.
func TestCancelOrphan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dead := func(string) bool { return false }
	for _, tc := range []struct {
		name       string
		persistent bool
		noBackend  bool // the canceller opens the backend only when it needs it
	}{
		{"ephemeral", false, false},
		{"persistent", true, false},
		{"canceller without a backend", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, engine.Config{OwnerAlive: dead})
			m := script("sleep 1000")
			if tc.persistent {
				m.Lifecycle = delegate.LifecyclePersistent
			}
			job := f.submit(m)
			p := f.started()
			eventually(t, "running", func() bool {
				j, _ := f.eng.Get(ctx, job.ID)
				return j.Status == delegate.StatusRunning
			})
			f.eng.Close() // the server stops; the job goes on
			p.Write([]byte("written while no server watched\n"))

			cfg := f.cfg
			var backend sandbox.Backend = f.backend
			opened := 0
			if tc.noBackend {
				backend = nil
				cfg.OpenBackend = func(context.Context) (sandbox.Backend, error) { opened++; return f.backend, nil }
			}
			canceller := engine.New(f.store, backend, cfg)
			defer canceller.Close()
			j, cancelled, err := canceller.Cancel(ctx, job.ID)
			if err != nil || !cancelled || j.Status != delegate.StatusCancelled {
				t.Fatalf("Cancel: %+v %v %v", j, cancelled, err)
			}
			// All of it is done when Cancel returns, not later.
			if !p.Killed() {
				t.Fatal("the job's process still runs")
			}
			if got := f.output(job.ID); got != "written while no server watched\n" {
				t.Errorf("output %q", got)
			}
			if j.Owner != canceller.Owner() || j.ExitCode == nil || *j.ExitCode != 137 {
				t.Errorf("owner %q exit %v", j.Owner, j.ExitCode)
			}
			_, err = f.backend.Recover(ctx, p.Sandbox.ID())
			if tc.persistent != (err == nil) {
				t.Errorf("sandbox after cancel: %v (persistent %v: kept for release_job, else destroyed)", err, tc.persistent)
			}
			if tc.noBackend && opened != 1 {
				t.Errorf("backend opened %d times", opened)
			}
			if _, again, err := canceller.Cancel(ctx, job.ID); again || err != nil {
				t.Errorf("second cancel: %v %v", again, err)
			}
		})
	}
}

// TestCancelOrphanProvisioning: a job its server left half-provisioned
// (a sandbox made, recorded on the job or not yet, no command started) is
// cancelled and its sandbox rolled back, persistent or not.
func TestCancelOrphanProvisioning(t *testing.T) {
	t.Parallel()
	for _, recorded := range []bool{true, false} {
		t.Run(fmt.Sprintf("recorded=%v", recorded), func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, engine.Config{OwnerAlive: func(owner string) bool { return owner != "gone-host/1/2/3" }})
			sb, err := f.backend.Create(ctx, sandbox.Spec{JobID: "job-half"})
			if err != nil {
				t.Fatal(err)
			}
			other, err := f.backend.Create(ctx, sandbox.Spec{JobID: "job-other"})
			if err != nil {
				t.Fatal(err)
			}
			m := script("x")
			m.Lifecycle = delegate.LifecyclePersistent
			now := time.Now().UTC()
			if err := f.store.CreateJob(ctx, &delegate.Job{ID: "job-half", Manifest: m, Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now,
				Backend: f.backend.Name(), Owner: "gone-host/1/2/3"}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.UpdateJob(ctx, "job-half", func(j *delegate.Job) error {
				j.Status = delegate.StatusProvisioning
				if recorded {
					j.SandboxID = sb.ID()
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			canceller := engine.New(f.store, f.backend, f.cfg)
			defer canceller.Close()
			j, cancelled, err := canceller.Cancel(ctx, "job-half")
			if err != nil || !cancelled || j.Status != delegate.StatusCancelled || j.SandboxID != "" {
				t.Fatalf("Cancel: %+v %v %v", j, cancelled, err)
			}
			if _, err := f.backend.Recover(ctx, sb.ID()); !errors.Is(err, sandbox.ErrGone) {
				t.Fatalf("the half-made sandbox is still there: %v", err)
			}
			if _, err := f.backend.Recover(ctx, other.ID()); err != nil {
				t.Fatalf("another job's sandbox was destroyed: %v", err)
			}
		})
	}
}

// TestCancelLiveOwner: a job a live engine drives is only marked; its own
// engine kills it (the canceller does not take it over).
func TestCancelLiveOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{OwnerAlive: func(string) bool { return true }})
	job := f.submit(script("sleep 1000"))
	p := f.started()
	eventually(t, "running", func() bool {
		j, _ := f.eng.Get(ctx, job.ID)
		return j.Status == delegate.StatusRunning
	})
	canceller := engine.New(f.store, f.backend, f.cfg)
	defer canceller.Close()
	j, cancelled, err := canceller.Cancel(ctx, job.ID)
	if err != nil || !cancelled || j.Owner != f.eng.Owner() {
		t.Fatalf("Cancel: owner %q, %v %v", j.Owner, cancelled, err)
	}
	eventually(t, "killed by its own engine", p.Killed)
	eventually(t, "sandbox destroyed", func() bool { return f.backend.Len() == 0 })
}
