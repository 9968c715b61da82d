package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/pgproxy"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// Leases and heartbeats on the database's clock (issue 37): servers whose
// hosts' clocks are far off (an engine's Leases.Clock, an hour either
// way), on a real PostgreSQL, with short leases; what each judges of a
// lease or a heartbeat stamped by another is on the database's clock,
// each host's own read only to learn its offset from it.

// leaseTTL is the tests' lease: renewed every 0.67 s, trusted 1.6 s.
const leaseTTL = 2 * time.Second

// clockServer is an engine, its store handle and its log.
type clockServer struct {
	*engine.Engine
	db  *postgres.DB
	log *testkit.Log
}

// startSkewed starts a server on the database at url whose host's clock
// is off by skew, on backend fake (shared: any server re-attaches any
// job's process). Heartbeats are judged every second, a job silent 4 s
// failed.
func startSkewed(t *testing.T, url string, fake *sandboxtest.Fake, skew time.Duration) *clockServer {
	t.Helper()
	log := &testkit.Log{}
	db := open(t, url)
	eng := startEngine(t, db, fake, engine.Config{MaxConcurrent: 8, PollInterval: 200 * time.Millisecond,
		HeartbeatThreshold: 4 * time.Second, Logger: slog.New(slog.NewTextHandler(log, nil)),
		Leases: &engine.Leases{TTL: leaseTTL, HostID: "host-1", Clock: func() time.Time { return time.Now().Add(skew) }}})
	return &clockServer{Engine: eng, db: db, log: log}
}

// runJobs submits n jobs to s and returns them and their processes.
func runJobs(t *testing.T, s *clockServer, fake *sandboxtest.Fake, n int) ([]*delegate.Job, []*sandboxtest.Process) {
	t.Helper()
	var jobs []*delegate.Job
	var procs []*sandboxtest.Process
	for range n {
		j, err := s.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "work"}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
		select {
		case p := <-fake.Started:
			procs = append(procs, p)
		case <-time.After(30 * time.Second): // a hang guard
			t.Fatalf("job %s did not start", j.ID)
		}
	}
	return jobs, procs
}

// finishAll ends every process (its output first) and checks, on the
// first of servers, that each job ended success with its whole output
// (before, then its end), and that it ended once, on one of them.
func finishAll(t *testing.T, servers []*clockServer, jobs []*delegate.Job, procs []*sandboxtest.Process, before string) {
	t.Helper()
	ctx := context.Background()
	for i, p := range procs {
		p.Write([]byte(fmt.Sprintf("end of %s\n", jobs[i].ID)))
		p.Finish(sandbox.Exit{Code: 0})
	}
	for _, j := range jobs {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang guard
		got, err := servers[0].Wait(wctx, j.ID)
		cancel()
		if err != nil || got.Status != delegate.StatusSuccess {
			t.Fatalf("job %s: %+v, %v", j.ID, got, err)
		}
		out, err := servers[0].db.ReadOutput(ctx, j.ID, 0, 1<<20)
		var text strings.Builder
		for _, o := range out {
			text.Write(o.Data)
		}
		if want := before + fmt.Sprintf("end of %s\n", j.ID); err != nil || text.String() != want {
			t.Errorf("job %s: output %q, %v; want %q", j.ID, text.String(), err, want)
		}
		ends := 0
		for _, s := range servers {
			ends += strings.Count(s.log.String(), `msg="job finished" job=`+j.ID)
		}
		if ends != 1 {
			t.Errorf("job %s ended %d times", j.ID, ends)
		}
	}
}

// beat sends a heartbeat of each job's (its callback, with its token)
// every 300 ms, through the server through(i) names for the i-th, until
// the test ends.
func beat(t *testing.T, jobs []*delegate.Job, procs []*sandboxtest.Process, through func(i int) *clockServer) {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	tokens := make([]string, len(procs))
	for i, p := range procs {
		for _, kv := range p.Cmd.Env {
			if v, ok := strings.CutPrefix(kv, "DELEGATE_JOB_TOKEN="); ok {
				tokens[i] = v
			}
		}
	}
	wg.Go(func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for i, j := range jobs {
				// Refused while the server is cut off, or once the job
				// ended: the next beat goes on.
				_, _ = through(i).Callback(ctx, j.ID, tokens[i], delegate.Report{Kind: delegate.ReportHeartbeat})
			}
		}
	})
}

// TestLeasesOnTheDatabasesClock: two servers, one host's clock an hour
// behind the database's, the other's an hour ahead, their jobs' only
// signs of life heartbeats sent through the other server (the backend
// does not watch the processes). For three leases' time on the
// database's clock neither loses its lease, nor adopts the other's jobs,
// nor fails a job for a heartbeat stamped by the other (on the host
// ahead, a heartbeat stamped on the clock behind would be two hours old,
// and the job failed).
// Cut from the database, the one behind (its own clock would give its
// lease an hour more) stops trusting its lease before the lease ends; the
// one ahead (its clock would have it ended an hour ago) adopts its jobs
// only then, and carries them to their end, each once. Back, the one
// behind registers again.
func TestLeasesOnTheDatabasesClock(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	proxy := pgproxy.New(t, url)
	fake := sandboxtest.NewFake()
	fake.Caps.Supervised = false // the jobs' signs of life: their heartbeats alone
	behind := startSkewed(t, proxy.URL, fake, -time.Hour)
	ahead := startSkewed(t, url, fake, time.Hour)
	jobsB, procsB := runJobs(t, behind, fake, 2)
	jobsA, procsA := runJobs(t, ahead, fake, 2)
	var cutOff atomic.Bool
	beat(t, append(jobsB, jobsA...), append(procsB, procsA...), func(i int) *clockServer {
		if i < len(jobsB) || cutOff.Load() {
			return ahead // behind's jobs; all of them once behind is cut off
		}
		return behind
	})

	_, start, err := ahead.db.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wrong []string
	testkit.Eventually(t, time.Minute, "three leases' time on the database's clock", func() bool {
		srvs, now, err := ahead.db.Servers(ctx)
		if err != nil {
			wrong = append(wrong, err.Error())
			return true
		}
		for _, s := range []*clockServer{behind, ahead} {
			if st := s.ServerStats(); !st.Live || st.Adoptions != 0 {
				wrong = append(wrong, fmt.Sprintf("%s at %s: %+v", s.Owner(), now.Sub(start), st))
			}
		}
		for _, s := range srvs {
			if !s.Live {
				wrong = append(wrong, fmt.Sprintf("the store has %s's lease ended at %s", s.ID, now.Sub(start)))
			}
		}
		return len(wrong) > 0 || now.Sub(start) >= 3*leaseTTL
	})
	if len(wrong) > 0 {
		t.Fatalf("with clocks an hour off, both alive:\n%s", strings.Join(wrong, "\n"))
	}
	for i, j := range append(jobsB, jobsA...) {
		owner := map[bool]*clockServer{true: behind, false: ahead}[i < len(jobsB)]
		got, err := ahead.db.GetJob(ctx, j.ID)
		if err != nil || got.Status != delegate.StatusRunning || got.Owner != owner.Owner() || got.Epoch != j.Epoch {
			t.Fatalf("job %s of %s: %+v, %v", j.ID, owner.Owner(), got, err)
		}
	}

	cutOff.Store(true)
	proxy.Cut()
	cut := time.Now()
	var lost, adopted time.Duration
	testkit.Eventually(t, 30*time.Second, "the jobs of the server behind adopted", func() bool {
		if lost == 0 && !behind.ServerStats().Live {
			lost = time.Since(cut)
		}
		if adopted == 0 && ahead.ServerStats().Adoptions == int64(len(jobsB)) {
			adopted = time.Since(cut)
		}
		return lost != 0 && adopted != 0
	})
	// Its lease was renewed at most a renewal's period before the cut.
	if expires := leaseTTL - leaseTTL/3; lost >= leaseTTL || adopted < expires || lost > adopted {
		t.Errorf("cut from the database: the server behind stopped trusting its lease after %s, its jobs were adopted after %s "+
			"(want: trust given up within the lease, %s; adopted once it has ended, %s at the least, and after)", lost, adopted, leaseTTL, expires)
	}
	if log := behind.log.String(); !strings.Contains(log, "lease lost") {
		t.Errorf("the log of the server behind:\n%s", log)
	}
	for _, j := range jobsB {
		if got, err := ahead.db.GetJob(ctx, j.ID); err != nil || got.Owner != ahead.Owner() || got.Epoch != j.Epoch+1 {
			t.Errorf("job %s adopted: %+v, %v", j.ID, got, err)
		}
	}
	finishAll(t, []*clockServer{ahead, behind}, append(jobsB, jobsA...), append(procsB, procsA...), "")

	proxy.Restore()
	testkit.Eventually(t, 30*time.Second, "the server behind registered again", func() bool {
		return behind.ServerStats().Live && strings.Contains(behind.log.String(), "lease regained")
	})
}

// TestLeasesThroughADatabaseOutage: the database out of every server's
// reach for longer than their leases (their connections cut, new ones
// refused, as when it is stopped or the network fails). Each server stops
// trusting its lease within it and takes no new job; the jobs' processes
// run on, and write. Back, each server registers again and takes back
// its jobs, or adopts the other's: every job ends once, success, with
// its whole output, what it wrote during the outage too.
func TestLeasesThroughADatabaseOutage(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	proxy := pgproxy.New(t, url)
	fake := sandboxtest.NewFake()
	a, b := startSkewed(t, proxy.URL, fake, 0), startSkewed(t, proxy.URL, fake, 0)
	jobsA, procsA := runJobs(t, a, fake, 2)
	jobsB, procsB := runJobs(t, b, fake, 2)
	jobs, procs := append(jobsA, jobsB...), append(procsA, procsB...)
	for _, p := range procs {
		p.Write([]byte("before\n"))
	}
	watcher := open(t, url) // the test's own way to the database
	testkit.Eventually(t, 30*time.Second, "the output before stored", func() bool {
		for _, j := range jobs {
			if got, err := watcher.GetJob(ctx, j.ID); err != nil || got.OutputBytes != 7 {
				return false
			}
		}
		return true
	})

	proxy.Cut()
	testkit.Eventually(t, 10*time.Second, "both servers give their leases up", func() bool {
		return !a.ServerStats().Live && !b.ServerStats().Live
	})
	if _, err := a.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "more"}, delegate.SubmitOptions{}); err == nil ||
		!strings.Contains(err.Error(), "lease") {
		t.Errorf("a submission during the outage: %v, want a refusal naming the lease", err)
	}
	for _, p := range procs {
		p.Write([]byte("during the outage\n"))
	}
	// Longer than the leases, on the database's clock.
	testkit.Eventually(t, 30*time.Second, "both leases ended in the database", func() bool {
		srvs, _, err := watcher.Servers(ctx)
		if err != nil {
			return false
		}
		for _, s := range srvs {
			if s.Live {
				return false
			}
		}
		return len(srvs) == 2
	})

	proxy.Restore()
	testkit.Eventually(t, 30*time.Second, "both registered again", func() bool {
		return a.ServerStats().Live && b.ServerStats().Live &&
			strings.Contains(a.log.String(), "lease regained") && strings.Contains(b.log.String(), "lease regained")
	})
	for _, j := range jobs {
		got, err := watcher.GetJob(ctx, j.ID)
		if err != nil || got.Status != delegate.StatusRunning || got.Epoch <= j.Epoch {
			t.Errorf("job %s after the outage: %+v, %v (want running, at a later epoch than %d)", j.ID, got, err, j.Epoch)
		}
	}
	finishAll(t, []*clockServer{a, b}, jobs, procs, "before\nduring the outage\n")
}
