package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// leased is a fixture whose engines share the store by leases (short
// ones), judged by their leases alone (every process looks alive: the
// engines are in this one).
func leased(t *testing.T, ttl time.Duration) *fixture {
	return newFixture(t, engine.Config{MaxConcurrent: 4, OwnerAlive: func(string) bool { return true },
		Leases: &engine.Leases{TTL: ttl, HostID: "host-a"}})
}

// startLeased starts another engine on f's store, with a lease of ttl.
func (f *fixture) startLeased(ttl time.Duration) *engine.Engine {
	cfg := f.cfg
	cfg.Leases = &engine.Leases{TTL: ttl, HostID: "host-a"}
	eng := engine.New(f.store, f.backend, cfg)
	if err := eng.Start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { eng.Close() })
	return eng
}

// TestLeaseAdoptsAndFences: a server whose lease expired (as it does when
// it is paused, or cut from the store) has its running job adopted by
// another, at the next epoch; the first one's next write is refused
// (fenced, counted), it stops driving the job and takes no new one; the
// adopter carries the job to its end, the output whole and not doubled.
func TestLeaseAdoptsAndFences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, time.Minute) // a renews every 20 s: it does not see its lease go
	a := f.eng
	job := f.submit(script("long"))
	p := f.started()
	p.Write([]byte("before "))
	awaitJob(t, a, job.ID, "running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning && j.OutputBytes == 7 })

	b := f.startLeased(900 * time.Millisecond)
	if err := f.store.ExpireServer(ctx, a.Owner()); err != nil { // a's lease runs out (a paused)
		t.Fatal(err)
	}
	adopted := awaitJob(t, b, job.ID, "adopted", func(j *delegate.Job) bool { return j.Owner == b.Owner() })
	if adopted.Epoch != job.Epoch+1 || adopted.Status != delegate.StatusRunning {
		t.Fatalf("adopted at epoch %d (was %d), %s", adopted.Epoch, job.Epoch, adopted.Status)
	}
	p.Write([]byte("after"))
	eventually(t, "a's write fenced", func() bool { return a.ServerStats().FencedWrites > 0 })
	p.Finish(sandbox.Exit{})
	j := f.wait(b, job.ID)
	if j.Status != delegate.StatusSuccess || f.output(job.ID) != "before after" || j.Owner != b.Owner() {
		t.Fatalf("the adopted job: %s %q output %q owner %s", j.Status, j.Error, f.output(job.ID), j.Owner)
	}
	if st := b.ServerStats(); st.Adoptions != 1 || !st.Live || st.FencedWrites != 0 {
		t.Errorf("the adopter's stats: %+v", st)
	}
}

// TestLeaseLostStopsClaiming: a server whose lease the store no longer
// has stops: it says so, and refuses new jobs, naming why.
func TestLeaseLostStopsClaiming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, 900*time.Millisecond)
	if err := f.store.ExpireServer(ctx, f.eng.Owner()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease lost", func() bool { return !f.eng.ServerStats().Live })
	if _, err := f.eng.Submit(ctx, script("more"), delegate.SubmitOptions{}); !errors.Is(err, delegate.ErrConflict) ||
		!strings.Contains(err.Error(), "lost its lease") {
		t.Errorf("a submit to the server: %v", err)
	}
}

// TestLeaseRetriesProvisioning: a job whose server died while its sandbox
// was being made (no start token: its command provably never started) is
// provisioned again by the server that adopts it, once; the dead server,
// waking, writes nothing more of it.
func TestLeaseRetriesProvisioning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, time.Minute)
	a := f.eng
	var once sync.Once
	blocked, release := make(chan struct{}), make(chan struct{})
	f.backend.CreateHook = func(ctx context.Context, spec sandbox.Spec) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(blocked)
			<-release
		}
		return nil
	}
	job := f.submit(script("twice?"))
	<-blocked
	b := f.startLeased(900 * time.Millisecond)
	if err := f.store.ExpireServer(ctx, a.Owner()); err != nil {
		t.Fatal(err)
	}
	p := f.started() // b's attempt
	close(release)   // a's create returns: its next write is refused
	p.Finish(sandbox.Exit{})
	j := f.wait(b, job.ID)
	if j.Status != delegate.StatusSuccess || j.Attempts != 2 || j.Owner != b.Owner() || j.StartToken == "" {
		t.Fatalf("retried job: %s %q attempts %d owner %s", j.Status, j.Error, j.Attempts, j.Owner)
	}
	eventually(t, "a's write fenced", func() bool { return a.ServerStats().FencedWrites > 0 })
	select {
	case extra := <-f.backend.Started:
		t.Fatalf("a second command started: %v", extra.Cmd.Args)
	default:
	}
}

// TestLeaseFailsStartedProvisioning: a job caught between its start token
// and its running status may have started: the adopter fails it, saying
// so, rather than start it twice.
func TestLeaseFailsStartedProvisioning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, 900*time.Millisecond)
	job, err := f.eng.Submit(ctx, script("x"), delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.started().Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	// A job as a dead server left it: provisioning, its start recorded.
	stuck := &delegate.Job{ID: "job-stuck", Manifest: script("y"), Status: delegate.StatusProvisioning, Owner: "gone/1/2/3",
		StartToken: "t1", Attempts: 1, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC(), Backend: "mock"}
	if _, err := f.store.RegisterServer(ctx, delegate.Server{ID: stuck.Owner, HostID: "host-b"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := f.store.CreateJob(ctx, stuck); err != nil {
		t.Fatal(err)
	}
	if err := f.store.ExpireServer(ctx, stuck.Owner); err != nil {
		t.Fatal(err)
	}
	j := f.wait(f.eng, stuck.ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "it may have started, so it is not started twice") {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
}

// TestLeaseDrain: a server told to drain (delegate servers drain) takes no
// new job, saying so, and its running job goes on to its end.
func TestLeaseDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, 900*time.Millisecond)
	job := f.submit(script("long"))
	p := f.started()
	if err := f.store.DrainServer(ctx, f.eng.Owner()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a submit refused", func() bool {
		_, err := f.eng.Submit(ctx, script("more"), delegate.SubmitOptions{})
		return errors.Is(err, delegate.ErrConflict) && strings.Contains(err.Error(), "is draining and takes no new jobs")
	})
	p.Finish(sandbox.Exit{})
	if j := f.wait(f.eng, job.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("the running job: %s %q", j.Status, j.Error)
	}
}

// localNamed is the fake backend named local: its jobs' sandboxes are
// its host's.
type localNamed struct{ *sandboxtest.Fake }

func (localNamed) Name() string { return "local" }

// TestLeaseLocalJobOfAnotherHost: a local job whose server died is
// adopted by a server of another host (another DELEGATE_HOST_ID), which
// cannot reach its sandbox: the job ends failed, saying so.
func TestLeaseLocalJobOfAnotherHost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, time.Minute)
	f.eng.Close() // the fixture's engine runs the fake under its own name
	local := localNamed{f.backend}
	a := engine.New(f.store, local, f.cfg)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	job, err := a.Submit(ctx, script("long"), delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.started()
	awaitJob(t, a, job.ID, "running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning })
	cfg := f.cfg
	cfg.Leases = &engine.Leases{TTL: 900 * time.Millisecond, HostID: "host-b"}
	b := engine.New(f.store, local, cfg)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := f.store.ExpireServer(ctx, a.Owner()); err != nil {
		t.Fatal(err)
	}
	j := f.wait(b, job.ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "a local sandbox can be taken over only on its own host") ||
		!strings.Contains(j.Error, "host id host-b") {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
}
