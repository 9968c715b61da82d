// Package testengine starts an engine over a fresh store and the
// in-memory fake backend (sandboxtest.Fake) for the tests of the packages
// above the engine, and runs jobs on it. It is imported by test files
// only.
package testengine

import (
	"context"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
)

// Engine is an engine over a fresh store and the in-memory fake backend.
type Engine struct {
	*engine.Engine
	Store   *sqlite.DB
	Backend *sandboxtest.Fake
}

// Start starts an engine over a fresh store and the fake backend,
// with small defaults (60 s, 1 CPU, 64M of memory, 16M of disk), a 10 ms
// poll and artifacts in a temporary directory unless cfg says otherwise;
// it is closed when the test ends.
func Start(t testing.TB, cfg engine.Config) *Engine {
	t.Helper()
	e := &Engine{Store: testkit.OpenStore(t), Backend: sandboxtest.NewFake()}
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
	testkit.Eventually(t, 10*time.Second, "job "+j.ID+" running", func() bool {
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
	return testkit.Wait(t, e, j.ID)
}
