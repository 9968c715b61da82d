package engine_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

func tokenOf(t testing.TB, p *sandboxtest.Process) string {
	t.Helper()
	for _, kv := range p.Cmd.Env {
		if v, ok := strings.CutPrefix(kv, "DELEGATE_JOB_TOKEN="); ok {
			return v
		}
	}
	t.Fatal("no DELEGATE_JOB_TOKEN in the job's environment")
	return ""
}

// running waits until the engine records the job as running.
func running(t testing.TB, eng *engine.Engine, id string) {
	t.Helper()
	awaitJob(t, eng, id, "job running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning })
}

// flood writes status lines to a job's channel as fast as it can until
// stop is closed or the process is killed (a killed process writes no
// more; a flood after it would only take the CPU the job's end needs), or
// a bound, to keep memory in check, and counts them.
func flood(p *sandboxtest.Process, stop <-chan struct{}, lines *atomic.Int64) {
	for lines.Load() < 20_000_000 && !p.Killed() {
		select {
		case <-stop:
			return
		default:
		}
		for range 1000 {
			p.Event("y")
		}
		lines.Add(1000)
	}
}

// TestFloodingJob: a job flooding its status channel (with a 10 MB file in
// its manifest, which every update once rewrote) slows neither another
// job nor reads, is killed at its timeout with a duration within the
// timeout plus the kill grace, and costs the store a bounded number of
// writes however many lines it writes.
func TestFloodingJob(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{MaxConcurrent: 4})
	ctx := context.Background()
	m := script("yes > $DELEGATE_STATUS_FILE")
	timeout := 2
	m.Timeout = &timeout
	m.StatusMode = delegate.StatusModeDetailed
	m.Files = []delegate.File{{Path: "big.bin", Content: base64.StdEncoding.EncodeToString(make([]byte, 10<<20))}}
	job := f.submit(m)
	fp := f.started()
	running(t, f.eng, job.ID)

	stop := make(chan struct{})
	defer close(stop)
	var lines atomic.Int64
	go flood(fp, stop, &lines)
	before := f.store.WriteStats()

	// While it floods, another job runs to its end, and reads answer.
	other := f.submit(script("echo other"))
	op := f.started()
	op.Write([]byte("other\n"))
	op.Finish(sandbox.Exit{})
	if j := f.wait(f.eng, other.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("the other job: %s %s", j.Status, j.Error)
	}
	if out := f.output(other.ID); out != "other\n" {
		t.Fatalf("the other job's output: %q", out)
	}
	for range 20 {
		j, err := f.eng.Get(ctx, job.ID)
		if err != nil || j.Status != delegate.StatusRunning {
			t.Fatalf("flooding job read as %v %v", j, err)
		}
		evs, err := f.eng.Timeline(ctx, job.ID)
		if err != nil || len(evs) > delegate.MaxTimeline {
			t.Fatalf("timeline of %d entries, %v", len(evs), err)
		}
	}

	j := f.wait(f.eng, job.ID)
	if j.Status != delegate.StatusTimeout || !fp.Killed() {
		t.Fatalf("flooding job: %s (%s), killed %v", j.Status, j.Error, fp.Killed())
	}
	if d := j.Duration(time.Now()); d > time.Duration(timeout)*time.Second+5*time.Second {
		t.Fatalf("flooding job ran %s with a timeout of %ds", d, timeout)
	}
	after := f.store.WriteStats()
	n := lines.Load()
	t.Logf("%d lines flooded; %d store writes in %d commits meanwhile; %d timeline entries dropped",
		n, after.Writes-before.Writes, after.Commits-before.Commits, j.TimelineDropped)
	if n < 100_000 {
		t.Fatalf("only %d lines were written: no flood to speak of", n)
	}
	// Progress is stored a few times a second per job, output and events
	// in between: far fewer writes than lines.
	if w := after.Writes - before.Writes; w > n/1000+100 {
		t.Fatalf("%d store writes for %d lines", w, n)
	}
	evs, err := f.eng.Timeline(ctx, job.ID)
	if err != nil || len(evs) != delegate.MaxTimeline || j.TimelineDropped == 0 {
		t.Fatalf("timeline after the flood: %d entries, %d dropped, %v", len(evs), j.TimelineDropped, err)
	}
}

// TestTimelineKeepsNewest: the timeline keeps the newest MaxTimeline
// entries and counts the others, before and after they are stored; the
// progress is the latest line. statusMode simple keeps no timeline.
func TestTimelineKeepsNewest(t *testing.T) {
	t.Parallel()
	for _, mode := range []delegate.StatusMode{delegate.StatusModeDetailed, delegate.StatusModeSimple} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, engine.Config{})
			ctx := context.Background()
			m := script("steps")
			m.StatusMode = mode
			job := f.submit(m)
			p := f.started()
			for i := range 300 {
				p.Event(fmt.Sprint("line ", i))
			}
			// The progress is read from the engine's buffer at once; the
			// count of dropped entries is whole once the buffer's entries
			// are stored (a read before counts those the stored timeline
			// will lose only after: 8 dropped was seen, under load, when
			// the first 108 lines had been stored and the rest not yet).
			eventually(t, "the last line as progress, the dropped counted", func() bool {
				j, _ := f.eng.Get(ctx, job.ID)
				return j.Progress == "line 299" && (mode == delegate.StatusModeSimple || j.TimelineDropped == 100)
			})
			check := func(when string) {
				j, _ := f.eng.Get(ctx, job.ID)
				evs, err := f.eng.Timeline(ctx, job.ID)
				if err != nil {
					t.Fatal(err)
				}
				if mode == delegate.StatusModeSimple {
					if len(evs) != 0 || j.TimelineDropped != 0 {
						t.Fatalf("%s: simple job kept %d entries, %d dropped", when, len(evs), j.TimelineDropped)
					}
					return
				}
				if len(evs) != delegate.MaxTimeline || evs[0].Message != "line 100" || evs[199].Message != "line 299" || j.TimelineDropped != 100 {
					t.Fatalf("%s: %d entries from %q, %d dropped", when, len(evs), evs[0].Message, j.TimelineDropped)
				}
			}
			check("running")
			p.Finish(sandbox.Exit{})
			f.wait(f.eng, job.ID)
			check("finished")
			stored, _ := f.store.Events(ctx, job.ID)
			if mode != delegate.StatusModeSimple && len(stored) != delegate.MaxTimeline {
				t.Fatalf("%d entries stored", len(stored))
			}
		})
	}
}

// TestProgressCoalesced: reports are answered from memory, read at once
// through the engine (before they are stored), stored in batches, and
// stored at the latest when the engine closes. A completion is stored
// before the callback returns.
func TestProgressCoalesced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	m := script("work")
	m.StatusMode = delegate.StatusModeDetailed
	job := f.submit(m)
	p := f.started()
	running(t, f.eng, job.ID)
	token := tokenOf(t, p)
	before := f.store.WriteStats()
	for i := range 100 {
		if _, err := f.eng.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportStatus, Progress: fmt.Sprint("step ", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.eng.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportHeartbeat}); err != nil {
			t.Fatal(err)
		}
		if j, _ := f.eng.Get(ctx, job.ID); j.Progress != fmt.Sprint("step ", i) {
			t.Fatalf("read after report %d: %q", i, j.Progress)
		}
	}
	evs, _ := f.eng.Timeline(ctx, job.ID)
	if len(evs) < 100 || evs[len(evs)-1].Message != "step 99" {
		t.Fatalf("timeline: %d entries", len(evs))
	}
	if w := f.store.WriteStats().Writes - before.Writes; w > 20 {
		t.Fatalf("200 reports cost %d store writes", w)
	}
	eventually(t, "progress stored", func() bool {
		j, _ := f.store.GetJob(ctx, job.ID)
		return j.Progress == "step 99"
	})

	// A completion is in the store when the callback returns.
	res, err := f.eng.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportComplete, Success: true, Result: "done"})
	if err != nil || res.Status != delegate.StatusSuccess {
		t.Fatalf("complete: %v %v", res, err)
	}
	if j, err := f.store.GetJob(ctx, job.ID); err != nil || j.Status != delegate.StatusSuccess || j.Result != "done" {
		t.Fatalf("stored after complete: %+v %v", j, err)
	}
	if _, err := f.eng.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportStatus, Progress: "late"}); !errors.Is(err, delegate.ErrTerminal) {
		t.Fatalf("report after completion: %v", err)
	}

	// What is reported last is stored when the engine closes.
	job2 := f.submit(m)
	p2 := f.started()
	running(t, f.eng, job2.ID)
	tok2 := tokenOf(t, p2)
	for _, msg := range []string{"first", "last"} {
		if _, err := f.eng.Callback(ctx, job2.ID, tok2, delegate.Report{Kind: delegate.ReportStatus, Progress: msg}); err != nil {
			t.Fatal(err)
		}
	}
	f.eng.Close()
	if j, _ := f.store.GetJob(ctx, job2.ID); j.Progress != "last" {
		t.Fatalf("after close the store has %q", j.Progress)
	}
}

// TestCallbackOtherProcess: several processes share a data dir and one
// callback port, so a callback may reach an engine that did not start the
// job: its token is found in the store, its reports reach the engine that
// drives it, and so does a cancel from a third process.
func TestCallbackOtherProcess(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	job := f.submit(script("work"))
	p := f.started()
	running(t, f.eng, job.ID)
	token := tokenOf(t, p)

	// Another process receiving callbacks (it leaves the jobs of the live
	// engine alone).
	cfg := f.cfg
	cfg.OwnerAlive = func(string) bool { return true }
	serve := engine.New(f.store, nil, cfg)
	if err := serve.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serve.Close() })
	if _, err := serve.Callback(ctx, job.ID, "dlg_wrong", delegate.Report{Kind: delegate.ReportHeartbeat}); !errors.Is(err, delegate.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v", err)
	}
	if _, err := serve.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportStatus, Progress: "via another server"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "progress seen by the driving engine", func() bool {
		j, _ := f.eng.Get(ctx, job.ID)
		return j.Progress == "via another server"
	})

	// A cancel by a third process: the driving engine kills the job, and
	// both refuse its reports from then on.
	cli := engine.New(f.store, nil, cfg)
	t.Cleanup(func() { cli.Close() })
	if _, _, err := cli.Cancel(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "process killed", p.Killed)
	for _, eng := range []*engine.Engine{f.eng, serve} {
		eventually(t, "report refused", func() bool {
			_, err := eng.Callback(ctx, job.ID, token, delegate.Report{Kind: delegate.ReportHeartbeat})
			return errors.Is(err, delegate.ErrTerminal)
		})
	}

	// A completion received by another process ends the job for the
	// engine that drives it.
	job2 := f.submit(script("work"))
	p2 := f.started()
	running(t, f.eng, job2.ID)
	if _, err := serve.Callback(ctx, job2.ID, tokenOf(t, p2), delegate.Report{Kind: delegate.ReportComplete, Success: true}); err != nil {
		t.Fatal(err)
	}
	j := f.wait(f.eng, job2.ID)
	if j.Status != delegate.StatusSuccess {
		t.Fatalf("completed elsewhere: %s", j.Status)
	}
	p2.Finish(sandbox.Exit{}) // it exits on its own within the grace
	eventually(t, "sandbox destroyed", func() bool { return f.backend.Len() == 0 })
}

// TestWatchersHearOfOutput: output and coalesced progress of a running job
// reach watchers (the MCP server's log and status subscriptions), not only
// changes of status.
func TestWatchersHearOfOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	m := script("talk")
	m.StatusMode = delegate.StatusModeStreaming
	job := f.submit(m)
	p := f.started()
	running(t, f.eng, job.ID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heard := func(what string, act func()) {
		t.Helper()
		w := f.eng.Watch(ctx)
		act()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case id := <-w:
				if id == job.ID {
					return
				}
			case <-deadline:
				t.Fatalf("no change of %s heard after %s", job.ID, what)
			}
		}
	}
	heard("output", func() { p.Write([]byte("hello\n")) })
	heard("a status line", func() { p.Event("step 1") })
	if j, _ := f.eng.Get(context.Background(), job.ID); j.Status != delegate.StatusRunning {
		t.Fatalf("job %s before its end", j.Status)
	}
}

// TestPendingJobsHoldNoGoroutine: jobs waiting for a run slot are queued,
// not parked goroutines (each one was work for every garbage collection),
// and start in the order they came.
func TestPendingJobsHoldNoGoroutine(t *testing.T) {
	f := newFixture(t, engine.Config{MaxConcurrent: 1})
	first := f.submit(script("first"))
	p := f.started()
	before := runtime.NumGoroutine()
	var queued []string
	for i := range 2000 {
		queued = append(queued, f.submit(script(fmt.Sprint("queued ", i))).ID)
	}
	// Far fewer than one a job is the point; the margin is for what the
	// tests before this one still wind down (56–59 under load in CI,
	// none of them this engine's).
	if n := runtime.NumGoroutine() - before; n > 200 {
		t.Fatalf("2000 pending jobs added %d goroutines", n)
	}
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, first.ID)
	for _, id := range queued[:3] {
		next := f.started()
		if next.Sandbox.Spec.JobID != id {
			t.Fatalf("started %s, want %s (first in, first out)", next.Sandbox.Spec.JobID, id)
		}
		next.Finish(sandbox.Exit{})
	}
}
