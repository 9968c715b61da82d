// Package bench measures delegate on the machine it runs on: the sandbox
// start and a job's round trip, and Proxmox jobs against the simulator.
// `delegate bench` prints its figures.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// App is a job service with the sandbox backend under it.
type App struct {
	Jobs delegate.JobService
	// Sandboxes keeps sandboxes; nil: no kept-sandbox figures.
	Sandboxes delegate.SandboxService
	Backend   sandbox.Backend
	Close     func() error
}

// Opener opens an App over a fresh data dir, running one job at a time
// with small sandboxes (256M memory, 64M disk).
type Opener func(ctx context.Context, dataDir string) (*App, error)

// Local measures, in one run on this machine, plain exec of /bin/true,
// the sandbox start of /bin/true, and a full job round trip through the
// engine, and prints medians and ratios against plain exec.
func Local(ctx context.Context, n int, open Opener, stdout io.Writer) error {
	dir, err := os.MkdirTemp("", "delegate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a, err := open(ctx, dir)
	if err != nil {
		return err
	}
	defer a.Close()

	plain := measure(n, func() error { return exec.Command("/bin/true").Run() })
	sandboxed := measure(n, func() error { return sandboxTrue(ctx, a.Backend) })
	job := measure(n, func() error {
		j, err := a.Jobs.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentCustom, Agent: &delegate.AgentConfig{Command: "exec /bin/true"}}, delegate.SubmitOptions{})
		if err != nil {
			return err
		}
		j, err = a.Jobs.Wait(ctx, j.ID)
		if err != nil {
			return err
		}
		if j.Status != delegate.StatusSuccess {
			return fmt.Errorf("job %s: %s %s", j.ID, j.Status, j.Error)
		}
		return nil
	})
	for _, r := range []*result{plain, sandboxed, job} {
		if r.err != nil {
			return r.err
		}
	}
	fmt.Fprintf(stdout, "delegate bench: %d runs each, medians (p90) on %s\n", n, hostDesc())
	fmt.Fprintf(stdout, "%-44s %10s %10s %8s\n", "", "median", "p90", "ratio")
	row := func(name string, r *result) {
		fmt.Fprintf(stdout, "%-44s %8.2fms %8.2fms %7.1fx\n", name, ms(r.median()), ms(r.p90()), float64(r.median())/float64(plain.median()))
	}
	row("plain exec /bin/true (baseline)", plain)
	row("sandbox /bin/true (create+exec+wait+destroy)", sandboxed)
	row("job round trip (submit -> success, sqlite)", job)
	if a.Sandboxes != nil && a.Backend.Capabilities().MultiExec {
		if err := kept(ctx, n, a, plain.median(), stdout); err != nil {
			return err
		}
	}
	// What a running sandbox costs besides its job: its supervisors'
	// memory, alone and among others (shared pages are shared by more).
	for _, k := range []int{1, 10} {
		m, err := sandboxMemory(ctx, a.Backend, k)
		if err != nil {
			return fmt.Errorf("supervisor memory: %w", err)
		}
		fmt.Fprintf(stdout, "%-44s %8.0fKiB  (%d processes: anon %.0f KiB, file %.0f KiB per sandbox)\n",
			fmt.Sprintf("memory per running sandbox, %d running (PSS)", k), kib(m.PerSandbox()), m.Processes,
			kib(m.PSSAnon/int64(k)), kib(m.PSSFile/int64(k)))
	}
	return nil
}

func kib(b int64) float64 { return float64(b) / 1024 }

func sandboxTrue(ctx context.Context, b sandbox.Backend) error {
	sb, err := b.Create(ctx, sandbox.Spec{JobID: "bench", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20})
	if err != nil {
		return err
	}
	defer sb.Destroy(ctx)
	p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}, Env: []string{"PATH=/usr/bin:/bin"}, OutputLimit: 1 << 20})
	if err != nil {
		return err
	}
	exit, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return fmt.Errorf("sandbox /bin/true exited %d", exit.Code)
	}
	return nil
}

type result struct {
	times []time.Duration
	err   error
}

func measure(n int, fn func() error) *result {
	r := &result{}
	fn() // warm up caches
	for range n {
		start := time.Now()
		if err := fn(); err != nil {
			r.err = err
			return r
		}
		r.times = append(r.times, time.Since(start))
	}
	slices.Sort(r.times)
	return r
}

func (r *result) median() time.Duration { return r.times[len(r.times)/2] }
func (r *result) p90() time.Duration    { return r.times[len(r.times)*9/10] }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func hostDesc() string {
	host, _ := os.Hostname()
	exe, _ := os.Executable()
	return fmt.Sprintf("%s (%s)", host, filepath.Base(exe))
}
