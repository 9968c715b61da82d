// Command delegate is an MCP server that runs jobs in isolated sandboxes,
// and a CLI for people to do the same. This file and the two beside it
// only wire: the commands are in package cli, the job engine in engine.
package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/bench"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	// run and exec are handed to a server serving the data dir when there
	// is one, by C code before the runtime starts (a cgo build) or as
	// this package is initialised, before most others (a Go build).
	_ "github.com/delegate-dev/delegate/internal/handoff/front"
	"github.com/delegate-dev/delegate/local"
)

func main() {
	// The sandbox helpers are this same binary, re-executed.
	if local.Reexec() {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, cli.Program{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Getenv:  os.Getenv,
		Version: buildinfo.Version(),
		Open:    openService,
		Serve:   serve,
		Bench:   runBench,

		MigrateStore: migrateStore,
		Servers:      servers,
		ProxmoxGC:    proxmoxGC,
		ProxmoxDrain: proxmoxDrain,
	}, os.Args[1:])
	stop()
	os.Exit(code)
}

// openService opens the engine over the data dir as the CLI's services.
func openService(ctx context.Context, cfg cli.Config, log *slog.Logger, runJobs bool) (cli.Services, func() error, error) {
	oneShotGC(os.Getenv)
	a, err := openApp(ctx, cfg, log, appOptions{RunJobs: runJobs, OneShot: true})
	if err != nil {
		return cli.Services{}, nil, err
	}
	if runJobs {
		// Its own life: a Ctrl-C cancels the job, and the engine sees it end.
		if err := a.eng.Start(context.WithoutCancel(ctx)); err != nil {
			return cli.Services{}, nil, errors.Join(err, a.Close())
		}
	}
	e := a.eng
	return cli.Services{Jobs: e, Sandboxes: e, Questions: e, Network: e, Workspaces: e, Retention: e, Checkpoints: e,
		Principals: engine.NewPrincipals(a.store, log)}, a.Close, nil
}

func runBench(ctx context.Context, cfg cli.Config, opts cli.BenchOptions, out io.Writer, log *slog.Logger) error {
	if len(opts.ControlPlane) > 0 {
		return bench.ControlPlane(ctx, bench.ControlPlaneOptions{Binaries: opts.ControlPlane, Rounds: opts.Runs, Jobs: opts.StoreJobs}, out)
	}
	if opts.ProxmoxSim {
		return bench.Proxmox(ctx, opts.Runs, opts.Scale, out, log)
	}
	if opts.Load > 0 {
		return bench.Load(ctx, opts.Load, opts.Sleep, func(ctx context.Context, dataDir string, n int) (*bench.App, error) {
			cfg.DataDir = dataDir
			cfg.MaxConcurrent = n
			cfg.Defaults.Memory, cfg.Defaults.Disk = "64M", "16M"
			a, err := openApp(ctx, cfg, log, appOptions{RunJobs: true})
			if err != nil {
				return nil, err
			}
			if err := a.eng.Start(ctx); err != nil {
				return nil, errors.Join(err, a.Close())
			}
			return &bench.App{Jobs: a.eng, Backend: a.backend, Close: a.Close}, nil
		}, out)
	}
	return bench.Local(ctx, opts.Runs, func(ctx context.Context, dataDir string) (*bench.App, error) {
		cfg.DataDir = dataDir
		cfg.MaxConcurrent = 1
		cfg.Defaults.Memory, cfg.Defaults.Disk = "256M", "64M"
		a, err := openApp(ctx, cfg, log, appOptions{RunJobs: true})
		if err != nil {
			return nil, err
		}
		return &bench.App{Jobs: a.eng, Sandboxes: a.eng, Backend: a.backend, Close: a.Close}, nil
	}, out)
}

// oneShotHeap is the heap at which a CLI command's process collects
// garbage (oneShotGC).
const oneShotHeap = 32 << 20

// oneShotGC lets a CLI command's process (one command, then it ends)
// collect garbage only once its heap reaches oneShotHeap, not at the
// runtime's first goal of 4 MB: `delegate run --script true` allocates
// ~5 MB in all (1 MB live), and its one collection was 4% of its CPU,
// 5% of `delegate exec ID -- true`'s (issue 41, item 2). A command that
// runs long (a job's output followed for hours) is collected at the
// limit. GOGC or GOMEMLIMIT in the environment win.
func oneShotGC(getenv func(string) string) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(oneShotHeap)
	debug.SetGCPercent(-1)
}
