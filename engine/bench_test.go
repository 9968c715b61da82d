package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// The engine's hot paths over a real SQLite store and the in-memory
// backend (docs/BENCHMARKS.md, "Where the time goes"):
//
//	go test -run X -bench . -benchtime 2s ./engine/

// BenchmarkCallback: authenticated status and heartbeat reports from a
// running job, from many goroutines (as the callback server gets them).
func BenchmarkCallback(b *testing.B) {
	for _, kind := range []delegate.ReportKind{delegate.ReportStatus, delegate.ReportHeartbeat} {
		b.Run(string(kind), func(b *testing.B) {
			f := newFixture(b, engine.Config{})
			ctx := context.Background()
			m := script("work")
			m.StatusMode = delegate.StatusModeDetailed
			j := f.submit(m)
			p := f.started()
			awaitJob(b, f.eng, j.ID, "running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning })
			token := tokenOf(b, p)
			before := f.store.WriteStats()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.eng.Callback(ctx, j.ID, token, delegate.Report{Kind: kind, Progress: "step 3/10"}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(f.store.WriteStats().Writes-before.Writes)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

var day = 86400

// BenchmarkSubmit: one submission at a time, stored before it returns
// (the job waits behind a running one).
func BenchmarkSubmit(b *testing.B) {
	f := newFixture(b, engine.Config{MaxConcurrent: 1})
	f.backend.Started = make(chan *sandboxtest.Process, 1)
	ctx := context.Background()
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "bench", Agent: &delegate.AgentConfig{Command: "sleep 86400"}, Timeout: &day}
	f.submit(m)
	b.ResetTimer()
	for range b.N {
		if _, err := f.eng.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitParallel: 16 submitters at once share commits.
func BenchmarkSubmitParallel(b *testing.B) {
	f := newFixture(b, engine.Config{MaxConcurrent: 1})
	f.backend.Started = make(chan *sandboxtest.Process, 1)
	ctx := context.Background()
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "bench", Agent: &delegate.AgentConfig{Command: "sleep 86400"}, Timeout: &day}
	f.submit(m)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := f.eng.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStatus: what get_job_status reads (the job and its timeline).
func BenchmarkStatus(b *testing.B) {
	f := newFixture(b, engine.Config{MaxConcurrent: 1})
	ctx := context.Background()
	m := script("bench")
	m.StatusMode = delegate.StatusModeDetailed
	f.submit(m)
	j := f.submit(m) // pending behind the first
	b.ResetTimer()
	for range b.N {
		if _, err := f.eng.Get(ctx, j.ID); err != nil {
			b.Fatal(err)
		}
		if _, err := f.eng.Timeline(ctx, j.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStatusFlood: how long the engine takes to follow 100,000 status
// lines (with a timeline) until the last one is the job's progress.
func BenchmarkStatusFlood(b *testing.B) {
	const lines = 100_000
	for range b.N {
		b.StopTimer()
		f := newFixture(b, engine.Config{})
		m := script("flood")
		m.StatusMode = delegate.StatusModeDetailed
		j := f.submit(m)
		p := f.started()
		for i := range lines {
			p.Event(fmt.Sprint("line ", i))
		}
		before := f.store.WriteStats()
		b.StartTimer()
		last := fmt.Sprint("line ", lines-1)
		awaitJob(b, f.eng, j.ID, "the last line", func(j *delegate.Job) bool { return j.Progress == last })
		b.StopTimer()
		b.ReportMetric(float64(f.store.WriteStats().Writes-before.Writes), "writes")
		f.eng.Close()
	}
}

// BenchmarkRoundTrip: a job from submission to success, the command
// ending as soon as it starts: the engine's own part of a job's round
// trip, fresh (a sandbox made and destroyed) and as a command in a kept
// sandbox (delegate bench has the same with real sandboxes).
func BenchmarkRoundTrip(b *testing.B) {
	for _, kept := range []bool{false, true} {
		name := "fresh"
		if kept {
			name = "kept"
		}
		b.Run(name, func(b *testing.B) {
			f := newFixture(b, engine.Config{})
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			go func() {
				for {
					select {
					case p := <-f.backend.Started:
						p.Finish(sandbox.Exit{})
					case <-ctx.Done():
						return
					}
				}
			}()
			m := script("true")
			if kept {
				sb, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
				if err != nil {
					b.Fatal(err)
				}
				m.Sandbox = sb.ID
			}
			before := f.store.WriteStats()
			b.ResetTimer()
			for range b.N {
				j, err := f.eng.Submit(ctx, m, delegate.SubmitOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if j, err = f.eng.Wait(ctx, j.ID); err != nil || j.Status != delegate.StatusSuccess {
					b.Fatalf("%+v %v", j, err)
				}
			}
			after := f.store.WriteStats()
			b.ReportMetric(float64(after.Writes-before.Writes)/float64(b.N), "writes/op")
			b.ReportMetric(float64(after.Commits-before.Commits)/float64(b.N), "commits/op")
		})
	}
}
