package main

import (
	"context"
	"flag"
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

// cmdBench measures, in one run on this machine, plain exec of /bin/true,
// the sandbox start of /bin/true, and a full job round trip through the
// engine, and prints medians and ratios against plain exec.
func cmdBench(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 30, "runs of each measurement")
	proxmoxSim := fs.Bool("proxmox-sim", false, "measure Proxmox jobs against a simulator with real-world latencies instead")
	scale := fs.Float64("scale", 10, "with --proxmox-sim: divide the simulated latencies by this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 {
		return usagef("-n: must be at least 1")
	}
	if *proxmoxSim {
		if *scale < 1 {
			return usagef("--scale: must be at least 1")
		}
		return benchProxmox(ctx, cfg, min(*n, 10), *scale, stdout, stderr)
	}
	dir, err := os.MkdirTemp("", "delegate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.DataDir = dir
	cfg.MaxConcurrent = 1
	cfg.Defaults.Memory, cfg.Defaults.Disk = "256M", "64M"
	a, err := openApp(ctx, cfg, newLogger(stderr, slogWarn), true, "")
	if err != nil {
		return err
	}
	defer a.Close()

	plain := measure(*n, func() error { return exec.Command("/bin/true").Run() })
	sandboxed := measure(*n, func() error { return sandboxTrue(ctx, a.eng.Backend()) })
	job := measure(*n, func() error {
		j, err := a.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentCustom, Agent: &delegate.AgentConfig{Command: "exec /bin/true"}})
		if err != nil {
			return err
		}
		j, err = a.eng.Wait(ctx, j.ID)
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
	fmt.Fprintf(stdout, "delegate bench: %d runs each, medians (p90) on %s\n", *n, hostDesc())
	fmt.Fprintf(stdout, "%-44s %10s %10s %8s\n", "", "median", "p90", "ratio")
	row := func(name string, r *result) {
		fmt.Fprintf(stdout, "%-44s %8.2fms %8.2fms %7.1fx\n", name, ms(r.median()), ms(r.p90()), float64(r.median())/float64(plain.median()))
	}
	row("plain exec /bin/true (baseline)", plain)
	row("sandbox /bin/true (create+exec+wait+destroy)", sandboxed)
	row("job round trip (submit -> success, sqlite)", job)
	return nil
}

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
