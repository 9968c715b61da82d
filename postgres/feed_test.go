package postgres_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

type heardJob struct {
	id     string
	status delegate.Status
}

// follow runs db's feed until t ends, and returns what it tells, once it
// listens.
func follow(t *testing.T, db delegate.JobFeed) <-chan heardJob {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	heard, listening, done := make(chan heardJob, 16), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- db.FollowJobs(ctx, func() { close(listening) }, func(id string, st delegate.Status) { heard <- heardJob{id, st} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the feed ended with %v", err)
		}
	})
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("the feed did not listen: %v", err)
	}
	return heard
}

func next(t *testing.T, heard <-chan heardJob) heardJob {
	t.Helper()
	select {
	case h := <-heard:
		return h
	case <-time.After(30 * time.Second): // a hang guard, not a measure
		t.Fatal("no notification")
		return heardJob{}
	}
}

// TestJobFeed: a job that another process (another pool, with its own
// origin) starts and ends is told to the listener, in commit order, once
// each; the submission and provisioning are not told, nor the changes
// the listener's own process makes.
func TestJobFeed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := open(t, url), open(t, url)
	heard := follow(t, a)

	create := func(s delegate.Store, id string) {
		now := time.Now().UTC()
		if err := s.CreateJob(ctx, &delegate.Job{ID: id, Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now,
			Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}}); err != nil {
			t.Fatal(err)
		}
	}
	move := func(s delegate.Store, id string, st delegate.Status) {
		if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error { j.Status = st; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	create(a, "job-own")
	for _, st := range []delegate.Status{delegate.StatusProvisioning, delegate.StatusRunning, delegate.StatusSuccess} {
		move(a, "job-own", st) // the listener's own process: not told
	}
	create(b, "job-other")
	for _, st := range []delegate.Status{delegate.StatusProvisioning, delegate.StatusRunning} {
		move(b, "job-other", st)
	}
	move(b, "job-other", delegate.StatusCancelled)
	for _, want := range []heardJob{{"job-other", delegate.StatusRunning}, {"job-other", delegate.StatusCancelled}} {
		if got := next(t, heard); got != want {
			t.Fatalf("heard %+v, want %+v (what a's own process did is not told, nor a submission)", got, want)
		}
	}
}

// deaf is a store whose feed listens and loses every notification: what
// the poll behind it must cover.
type deaf struct{ *postgres.DB }

func (d deaf) FollowJobs(ctx context.Context, listening func(), _ func(string, delegate.Status)) error {
	return d.DB.FollowJobs(ctx, listening, func(string, delegate.Status) {})
}

// TestWakeAcrossServers: a job that server a runs ends; server b, on the
// same database, waiting for it (wait_job) and watching jobs (a progress
// report, the dashboard), is woken by the feed, with polls an hour apart:
// only a notification can wake it. With a feed that loses every
// notification, the poll behind it (ChangePoll) wakes the waiter.
func TestWakeAcrossServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	fake := sandboxtest.NewFake()
	a := startEngine(t, open(t, url), fake, engine.Config{})
	hour := engine.Config{PollInterval: time.Hour, ChangePoll: time.Hour}
	b := startEngine(t, open(t, url), nil, hour)
	polled := startEngine(t, deaf{open(t, url)}, nil, engine.Config{PollInterval: time.Hour, ChangePoll: 50 * time.Millisecond})

	wctx, stop := context.WithTimeout(ctx, 30*time.Second) // a hang guard
	defer stop()
	watch := b.Watch(wctx)
	job, err := a.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan *delegate.Job, 2)
	for _, e := range []*engine.Engine{b, polled} {
		go func() {
			c, cancel := context.WithTimeout(ctx, time.Minute) // a hang guard: b polls once an hour
			defer cancel()
			j, err := e.Wait(c, job.ID)
			if err != nil || c.Err() != nil {
				t.Errorf("the wait on another server: %v, %v (not woken)", err, c.Err())
			}
			ended <- j
		}()
	}
	var p *sandboxtest.Process
	select {
	case p = <-fake.Started:
	case <-wctx.Done():
		t.Fatal("the job did not start")
	}
	// b hears the job start: only the feed tells a watcher of another
	// process's change.
	told := false
	for id := range watch {
		if told = id == job.ID; told {
			break
		}
	}
	if !told {
		t.Fatal("b was not told that the job started on a")
	}
	p.Finish(sandbox.Exit{Code: 3})
	for range 2 {
		if j := <-ended; j == nil || j.Status != delegate.StatusFailed || j.ExitCode == nil || *j.ExitCode != 3 {
			t.Fatalf("a waiter on another server got %+v, want the job failed with exit code 3", j)
		}
	}
}

func startEngine(t testing.TB, store delegate.Store, backend sandbox.Backend, cfg engine.Config) *engine.Engine {
	t.Helper()
	cfg.Defaults = delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}
	cfg.ArtifactDir = t.TempDir()
	// The engines are in one process, which the default takes for one
	// server: each would think the others dead, and adopt their jobs.
	cfg.OwnerAlive = func(string) bool { return true }
	var eng *engine.Engine
	if backend == nil {
		eng = engine.New(store, nil, cfg)
	} else {
		eng = engine.New(store, backend, cfg)
	}
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// nofeed is a store that tells nothing (its JobFeed hidden): a server on
// it reads other servers' ends by polling alone, as before the feed.
type nofeed struct{ delegate.Store }

// BenchmarkWakeAcrossServers: how long after a job's command ends on
// server a a waiter for it (wait_job) on another server returns: one
// server woken by the feed (LISTEN/NOTIFY, the poll 1 s behind it), one
// by polling alone (its store's feed hidden: every 200 ms the finish
// counter, as before the feed), both with the default settings, both
// waiting for the same job, which ends at a random moment of the poll's
// period. An op is one job; the figures are each waiter's median and
// slowest, and the ratio of the medians.
//
//	go test -run X -bench WakeAcrossServers -benchtime 50x ./postgres/
func BenchmarkWakeAcrossServers(b *testing.B) {
	ctx := context.Background()
	url := pgtest.New(b)
	fake := sandboxtest.NewFake()
	a := startEngine(b, open(b, url), fake, engine.Config{})
	waiters := map[string]*engine.Engine{
		"notified": startEngine(b, open(b, url), nil, engine.Config{}),
		"polled":   startEngine(b, nofeed{open(b, url)}, nil, engine.Config{}),
	}
	watch := waiters["notified"].Watch(ctx)
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		job, err := a.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, delegate.SubmitOptions{})
		if err != nil {
			b.Fatal(err)
		}
		type woke struct {
			name string
			at   time.Time
		}
		woken := make(chan woke, len(waiters))
		for name, e := range waiters {
			go func() {
				j, err := e.Wait(ctx, job.ID)
				if err != nil || !j.Status.Terminal() {
					b.Errorf("%s: %v %v", name, j, err)
				}
				woken <- woke{name, time.Now()}
			}()
		}
		p := <-fake.Started
		for id := range watch { // running, told: the waiters wait by now
			if id == job.ID {
				break
			}
		}
		// The end at a moment of the poll's period drawn at random: the
		// op's start is the polled waiter's last wake-up, in phase with
		// its poll, which would make its every figure the slowest.
		<-time.After(rand.N(200 * time.Millisecond))
		t0 := time.Now()
		p.Finish(sandbox.Exit{})
		for range waiters {
			w := <-woken
			took[w.name] = append(took[w.name], w.at.Sub(t0))
		}
	}
	b.StopTimer()
	for _, name := range []string{"notified", "polled"} {
		b.ReportMetric(ms(p50(took[name])), name+"-p50-ms")
		b.ReportMetric(ms(slices.Max(took[name])), name+"-max-ms")
	}
	b.ReportMetric(float64(p50(took["polled"]))/float64(p50(took["notified"])), "polled/notified")
}
