package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
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

// unreachable is a store a server cannot register again with while cut
// is set, as when it is cut from the store.
type unreachable struct {
	delegate.Store
	cut atomic.Bool
}

func (u *unreachable) RejoinServer(ctx context.Context, s delegate.Server, ttl time.Duration) (delegate.Server, []delegate.Adopted, error) {
	if u.cut.Load() {
		return delegate.Server{}, nil, errors.New("the store is out of reach (the test cut it)")
	}
	return u.Store.RejoinServer(ctx, s, ttl)
}

// TestLeaseLostStopsClaiming: a server whose lease the store no longer
// has stops: it says so, and refuses new jobs, naming why, while it
// cannot reach the store; once it can, it registers again and claims.
func TestLeaseLostStopsClaiming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, time.Minute)
	store := &unreachable{Store: f.store}
	store.cut.Store(true)
	cfg := f.cfg
	cfg.Leases = &engine.Leases{TTL: 900 * time.Millisecond, HostID: "host-a"}
	eng := engine.New(store, f.backend, cfg)
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	if err := f.store.ExpireServer(ctx, eng.Owner()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease lost", func() bool { return !eng.ServerStats().Live })
	if _, err := eng.Submit(ctx, script("more"), delegate.SubmitOptions{}); !errors.Is(err, delegate.ErrConflict) ||
		!strings.Contains(err.Error(), "lost its lease") {
		t.Errorf("a submit to the server: %v", err)
	}
	store.cut.Store(false)
	eventually(t, "the server registered again", func() bool { return eng.ServerStats().Live })
	if _, err := eng.Submit(ctx, script("more"), delegate.SubmitOptions{}); err != nil {
		t.Errorf("a submit once it registered again: %v", err)
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

// TestLeaseRejoins: a server that lost its lease (cut from the store,
// then back) registers again with a new lease and claims again; of its
// two running jobs, the one another server adopted meanwhile stays the
// adopter's (nothing more of it written by the first), the other it
// takes back at the next epoch and carries to its end.
func TestLeaseRejoins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := leased(t, 900*time.Millisecond)
	a := f.eng
	running := func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning && j.OutputBytes == 7 }
	var jobs [2]*delegate.Job
	var procs [2]*sandboxtest.Process
	for i, name := range []string{"adopted", "back"} {
		jobs[i] = f.submit(script(name))
		procs[i] = f.started()
		procs[i].Write([]byte("before "))
		jobs[i] = awaitJob(t, a, jobs[i].ID, "running", running)
	}
	// Another server, by hand, so that it adopts the first job only.
	if _, err := f.store.RegisterServer(ctx, delegate.Server{ID: "other", Host: "h", HostID: "host-b"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := f.store.ExpireServer(ctx, a.Owner()); err != nil { // a cut from the store past its lease
		t.Fatal(err)
	}
	if got, err := f.store.AdoptJobs(ctx, "other", []string{a.Owner()}, 1); err != nil || len(got) != 1 || got[0].Job.ID != jobs[0].ID {
		t.Fatalf("the other server adopted %+v, %v", got, err)
	}
	// a finds its lease gone, gives its jobs up, registers again and
	// takes back the job no one adopted.
	back := awaitJob(t, a, jobs[1].ID, "taken back", func(j *delegate.Job) bool { return j.Epoch == jobs[1].Epoch+1 })
	eventually(t, "a live again", func() bool { return a.ServerStats().Live })
	if back.Owner != a.Owner() || back.Status != delegate.StatusRunning {
		t.Fatalf("taken back: %+v", back)
	}
	for _, p := range procs {
		p.Write([]byte("after"))
	}
	procs[1].Finish(sandbox.Exit{})
	if j := f.wait(a, jobs[1].ID); j.Status != delegate.StatusSuccess || f.output(jobs[1].ID) != "before after" {
		t.Fatalf("the job taken back: %s %q, output %q", j.Status, j.Error, f.output(jobs[1].ID))
	}
	// It claims again.
	more := f.submit(script("more"))
	f.started().Finish(sandbox.Exit{})
	if j := f.wait(a, more.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("a job submitted after the rejoin: %s %q", j.Status, j.Error)
	}
	// The adopted job: the other's, as it left it (a follows it no more).
	if j, err := f.store.GetJob(ctx, jobs[0].ID); err != nil || j.Owner != "other" || j.Epoch != jobs[0].Epoch+1 ||
		j.Status != delegate.StatusRunning || f.output(jobs[0].ID) != "before " {
		t.Fatalf("the adopted job: %+v, output %q, %v", j, f.output(jobs[0].ID), err)
	}
}
