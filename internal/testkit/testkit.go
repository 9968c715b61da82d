// Package testkit holds what delegate's tests of several packages would
// otherwise each write again: opening a store, waiting for a job to end,
// polling for a condition with a deadline, and a log a test reads. It
// imports neither the engine nor a backend, so that their own tests may
// use it: an engine over the fake backend is testengine's, a fast Proxmox
// simulator testsim's. It is imported by test files only.
package testkit

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
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
	if !Poll(timeout, cond) {
		t.Fatalf("waited %v for %s", timeout, what)
	}
}

// Poll is Eventually for a test that says more when cond does not come
// to hold: it reports whether cond held within timeout.
func Poll(timeout time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return true
			}
		case <-deadline.C:
			return cond()
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

// FillTree writes files files of size bytes under dir, 100 to a
// directory (d000/f00000, d000/f00001, …), each differing from the
// others in its first byte, the files and directories owned by uid (the
// workspace tree of the checkpoint and fork benchmarks).
func FillTree(tb testing.TB, dir string, files, size, uid int) {
	tb.Helper()
	buf := make([]byte, size)
	for i := range files {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				tb.Fatal(err)
			}
			if err := os.Chown(d, uid, uid); err != nil {
				tb.Fatal(err)
			}
		}
		if size > 0 {
			buf[0] = byte(i)
		}
		p := filepath.Join(d, fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			tb.Fatal(err)
		}
	}
}

// TimeCopy times `cp -a src/. dst` (the plain copy checkpoint and fork
// figures are set against), then removes dst.
func TimeCopy(tb testing.TB, src, dst string) time.Duration {
	tb.Helper()
	t0 := time.Now()
	if out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput(); err != nil {
		tb.Fatalf("cp -a: %v %s", err, out)
	}
	took := time.Since(t0)
	os.RemoveAll(dst)
	return took
}
