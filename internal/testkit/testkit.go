// Package testkit holds what delegate's tests of several packages would
// otherwise each write again: opening a store, starting an engine over
// the in-memory fake backend and running a job to its end on it, starting
// a fast Proxmox simulator, polling for a condition with a deadline, and a
// log a test reads. It is imported by test files only.
package testkit

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
)

// Context is a context that ends with the test, or after timeout.
func Context(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// OpenStore opens a fresh SQLite store (jobs.db in a temporary
// directory), closed when the test ends.
func OpenStore(t testing.TB) *sqlite.DB {
	t.Helper()
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// Engine is an engine over a fresh store and the in-memory fake backend.
type Engine struct {
	*engine.Engine
	Store   *sqlite.DB
	Backend *sandboxtest.Fake
}

// StartEngine starts an engine over a fresh store and the fake backend,
// with small defaults (60 s, 1 CPU, 64M of memory, 16M of disk), a 10 ms
// poll and artifacts in a temporary directory unless cfg says otherwise;
// it is closed when the test ends.
func StartEngine(t testing.TB, cfg engine.Config) *Engine {
	t.Helper()
	e := &Engine{Store: OpenStore(t), Backend: sandboxtest.NewFake()}
	if cfg.Defaults == (delegate.Defaults{}) {
		cfg.Defaults = delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.ArtifactDir == "" {
		cfg.ArtifactDir = t.TempDir()
	}
	e.Engine = engine.New(e.Store, e.Backend, cfg)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// Started is the next process the fake backend starts (within 10 s).
func (e *Engine) Started(t testing.TB) *sandboxtest.Process {
	t.Helper()
	select {
	case p := <-e.Backend.Started:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no job's process started")
		return nil
	}
}

// Running submits m and returns the job once it runs, with its process.
func (e *Engine) Running(t testing.TB, m delegate.Manifest) (*delegate.Job, *sandboxtest.Process) {
	t.Helper()
	j, err := e.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := e.Started(t)
	Eventually(t, 10*time.Second, "job "+j.ID+" running", func() bool {
		j, err = e.Get(context.Background(), j.ID)
		return err == nil && j.Status == delegate.StatusRunning
	})
	return j, p
}

// Run submits m, ends its process with exit after it wrote out, and
// returns the job once it has ended.
func (e *Engine) Run(t testing.TB, m delegate.Manifest, out string, exit sandbox.Exit) *delegate.Job {
	t.Helper()
	j, p := e.Running(t, m)
	if out != "" {
		p.Write([]byte(out))
	}
	p.Finish(exit)
	return Wait(t, e, j.ID)
}

// Wait waits (up to 10 s) for a job of svc to end.
func Wait(t testing.TB, svc delegate.JobService, id string) *delegate.Job {
	t.Helper()
	j, err := svc.Wait(Context(t, 10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	if !j.Status.Terminal() {
		t.Fatalf("job %s still %s after 10 s", id, j.Status)
	}
	return j
}

// Eventually polls cond every few milliseconds until it holds, and fails
// the test, naming what it waited for, if it does not within timeout: the
// poll with a deadline for what no event announces.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if cond() {
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return
			}
		case <-deadline.C:
			if cond() {
				return
			}
			t.Fatalf("waited %v for %s", timeout, what)
		}
	}
}

// Log is a log a test reads: the text of every line written to it, safe
// for concurrent writers.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// NewLog is a logger writing to a Log the test reads.
func NewLog() (*slog.Logger, *Log) {
	l := &Log{}
	return slog.New(slog.NewTextHandler(l, nil)), l
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// StartSim starts a fast Proxmox simulator of nodes (tasks of 20 ms,
// boots of 100 ms, no delay after a failed login), tuned by tune, closed
// when the test ends. Its guests' sandboxes live in a temporary directory.
func StartSim(t testing.TB, nodes []pvesim.NodeSpec, tune func(*pvesim.Options)) *pvesim.Server {
	t.Helper()
	opts := pvesim.Options{
		Nodes:            nodes,
		TaskDelay:        20 * time.Millisecond,
		BootDelay:        100 * time.Millisecond,
		AuthFailureDelay: -1,
		SandboxDir:       t.TempDir(),
	}
	if tune != nil {
		tune(&opts)
	}
	sim, err := pvesim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}
