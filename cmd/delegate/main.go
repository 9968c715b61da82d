// Command delegate is an MCP server that runs jobs in isolated sandboxes,
// and a CLI for people to do the same.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sqlite"
)

const usage = `delegate runs jobs in isolated sandboxes, for AI agents (over MCP) and people.

Usage:
  delegate serve [--http ADDR]        MCP server on stdio, or Streamable HTTP at ADDR/mcp
  delegate run --script CMD | --manifest FILE [--file LOCAL:REMOTE]... [--timeout N]
                                      run one job and print its output
  delegate jobs list|status|result|cancel [ID]
                                      read and manage stored jobs
  delegate bench [-n N]               measure sandbox start and job round trip
  delegate pve-sim --listen ADDR --nodes N
                                      run a Proxmox VE API simulator (prints the env to use it)
  delegate version

Configuration comes from the environment (see the README); flags override it.
`

func main() {
	// The sandbox helpers are this same binary, re-executed.
	if local.Reexec() {
		return
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "delegate: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		err = cmdServe(ctx, cfg, rest, stderr)
	case "run":
		var code int
		code, err = cmdRun(ctx, cfg, rest, stdout, stderr)
		if err == nil {
			return code
		}
	case "jobs":
		err = cmdJobs(ctx, cfg, rest, stdout, stderr)
	case "pve-sim":
		err = cmdPveSim(ctx, cfg, rest, stdout, stderr)
	case "bench":
		err = cmdBench(ctx, cfg, rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "delegate", version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "delegate: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "delegate %s: %v\n", cmd, err)
		var usageErr usageError
		if errors.As(err, &usageErr) {
			return 2
		}
		return 1
	}
	return 0
}

var version = "dev"

// usageError marks a mistake in the command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// app is an open data dir: the store, the backend and the engine over them.
type app struct {
	cfg   config
	log   *slog.Logger
	store *sqlite.Store
	eng   *engine.Engine
}

// openApp opens the store; with a backend it can also run jobs. Jobs get
// callbackURL (empty: no callback server) to report to.
func openApp(ctx context.Context, cfg config, log *slog.Logger, withBackend bool, callbackURL string) (*app, error) {
	secrets, err := loadSecrets(cfg.SecretsFile)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir (DELEGATE_DATA_DIR): %w", err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "jobs.db"))
	if err != nil {
		return nil, err
	}
	var backend sandbox.Backend
	poll := time.Duration(0) // the engine's default
	if withBackend {
		backend, err = openBackend(ctx, cfg, log)
		if err != nil {
			store.Close()
			return nil, err
		}
		if cfg.Backend == "proxmox" {
			poll = time.Second // every poll is a few API calls
		}
	}
	eng := engine.New(store, backend, engine.Config{
		Defaults:        cfg.Defaults,
		MaxConcurrent:   cfg.MaxConcurrent,
		OutputLimit:     cfg.OutputLimit,
		CleanupInterval: cfg.CleanupInterval,
		PollInterval:    poll,
		Logger:          log,

		CallbackURL:        callbackURL,
		HeartbeatThreshold: cfg.HeartbeatThreshold,
		ArtifactDir:        filepath.Join(cfg.DataDir, "artifacts"),
		Secret:             secretResolver(secrets),
	})
	return &app{cfg: cfg, log: log, store: store, eng: eng}, nil
}

// openBackend makes the sandbox backend DELEGATE_BACKEND names.
func openBackend(ctx context.Context, cfg config, log *slog.Logger) (sandbox.Backend, error) {
	switch cfg.Backend {
	case "proxmox":
		client, err := pve.New(cfg.Proxmox)
		if err != nil {
			return nil, fmt.Errorf("proxmox backend: %w", err)
		}
		b := proxmox.New(client, proxmox.Config{Template: cfg.Defaults.VMTemplate, Bridge: cfg.ProxmoxBridge, VLAN: cfg.ProxmoxVLAN,
			AgentTimeout: cfg.ProxmoxAgentTimeout, Logger: log})
		if err := b.Check(ctx); err != nil {
			return nil, fmt.Errorf("proxmox backend (PROXMOX_HOST=%s): %w", cfg.Proxmox.Host, err)
		}
		return b, nil
	default:
		b, err := local.New(local.Config{Dir: filepath.Join(cfg.DataDir, "sandboxes"), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
		return b, nil
	}
}

func (a *app) Close() {
	a.eng.Close()
	a.store.Close()
}

// must be a delegate.Status the user typed.
func parseStatus(s string) (delegate.Status, error) {
	st := delegate.Status(s)
	if s != "" && !st.Valid() {
		return "", usagef("--status: must be one of pending, provisioning, running, success, failed, timeout, cancelled (got %q)", s)
	}
	return st, nil
}
