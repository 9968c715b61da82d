package sqlite_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

// The store's hot paths (docs/BENCHMARKS.md, "Where the time goes"):
//
//	go test -run X -bench . -benchtime 2s ./sqlite/

func openBench(b *testing.B) *sqlite.DB {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func BenchmarkUpdateJob(b *testing.B) {
	for _, size := range []int{0, 10 << 20} {
		b.Run(fmt.Sprintf("file=%dMB", size>>20), func(b *testing.B) {
			ctx := context.Background()
			s := openBench(b)
			j := newJob("j1")
			if size > 0 {
				j.Manifest.Files = []delegate.File{{Path: "big", Content: base64.StdEncoding.EncodeToString(make([]byte, size))}}
			}
			if err := s.CreateJob(ctx, j); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error { j.Progress = fmt.Sprint("step ", i); return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSaveProgress: one group commit of 16 jobs' coalesced progress.
func BenchmarkSaveProgress(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	batch := make([]delegate.JobProgress, 16)
	for i := range batch {
		id := fmt.Sprint("j", i)
		if err := s.CreateJob(ctx, newJob(id)); err != nil {
			b.Fatal(err)
		}
		batch[i] = delegate.JobProgress{ID: id, Events: []delegate.Event{{Time: time.Now(), Message: "step"}}}
	}
	b.ResetTimer()
	for i := range b.N {
		for k := range batch {
			batch[k].Progress = fmt.Sprint("step ", i)
			batch[k].Heartbeat = time.Now()
		}
		if err := s.SaveProgress(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/job")
}

func BenchmarkGetJob(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	if err := s.CreateJob(ctx, newJob("j1")); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := s.GetJob(ctx, "j1"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateJob(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	b.ResetTimer()
	for i := range b.N {
		if err := s.CreateJob(ctx, newJob(fmt.Sprint("j", i))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateJobParallel: 16 submitters at once share commits.
func BenchmarkCreateJobParallel(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	var n atomic.Int64
	b.SetParallelism(8) // 16 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.CreateJob(ctx, newJob(fmt.Sprint("j", n.Add(1)))); err != nil {
				b.Fatal(err)
			}
		}
	})
	reportGroups(b, s)
}

// reportGroups reports how many writes a commit carried on average.
func reportGroups(b *testing.B, s *sqlite.DB) {
	st := s.WriteStats()
	if st.Commits > 0 {
		b.ReportMetric(float64(st.Writes)/float64(st.Commits), "writes/commit")
	}
}

// BenchmarkGetSandbox: a kept sandbox read with its activity, from the
// index of its jobs, as its commands add up: the count of every command
// it had (GetSandbox, for an agent's or the dashboard's read) grows with
// them; the read a command's start makes (GetSandboxUncounted: the ones
// not ended, and the last end) does not.
func BenchmarkGetSandbox(b *testing.B) {
	for _, commands := range []int{10, 1000, 10000} {
		ctx := context.Background()
		s := openBench(b)
		now := time.Now().UTC()
		if err := s.CreateSandbox(ctx, &delegate.Sandbox{ID: "sbx-a", State: delegate.SandboxIdle, Backend: "local", Instance: "sb-1",
			CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			b.Fatal(err)
		}
		for i := range commands {
			j := newJob(fmt.Sprint("c", i))
			j.Sandbox, j.Status, j.FinishedAt = "sbx-a", delegate.StatusSuccess, now
			if err := s.CreateJob(ctx, j); err != nil {
				b.Fatal(err)
			}
		}
		for _, read := range []struct {
			name string
			fn   func(context.Context, string) (*delegate.Sandbox, error)
		}{{"counted", s.GetSandbox}, {"uncounted", s.GetSandboxUncounted}} {
			b.Run(fmt.Sprintf("commands=%d/%s", commands, read.name), func(b *testing.B) {
				for range b.N {
					sb, err := read.fn(ctx, "sbx-a")
					if err != nil || sb.Running != 0 {
						b.Fatal(sb, err)
					}
				}
			})
		}
	}
}

// BenchmarkArtifactOfMany: reading one artifact of a job that keeps
// 10,000, by name (Artifact) against the list read and scanned as
// ReadArtifact did before (Artifacts): saving them all was quadratic.
//
//	go test -run X -bench ArtifactOfMany ./sqlite/
func BenchmarkArtifactOfMany(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	if err := s.CreateJob(ctx, newJob("j1")); err != nil {
		b.Fatal(err)
	}
	const n = 10_000
	for i := range n {
		if err := s.AddArtifact(ctx, "j1", delegate.Artifact{Name: fmt.Sprintf("out/f%05d.txt", i), Size: 10, SHA256: fmt.Sprintf("%064d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("by-name", func(b *testing.B) {
		for i := range b.N {
			if _, err := s.Artifact(ctx, "j1", fmt.Sprintf("out/f%05d.txt", i%n)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("list-and-scan", func(b *testing.B) {
		for i := range b.N {
			arts, err := s.Artifacts(ctx, "j1")
			if err != nil || len(arts) != n {
				b.Fatal(err)
			}
			_ = i
		}
	})
}
