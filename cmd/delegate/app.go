package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/metrics"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// app is an open data dir: the store, the backend and the engine over them.
type app struct {
	store   store
	backend sandbox.Backend // nil when the app only reads jobs
	// pool is the backend's warm pool (Proxmox's); nil for another
	// backend, or none.
	pool poolKeeper
	eng  *engine.Engine
	// shared: the server shares its store with others, holding a lease
	// (engine.Leases).
	shared bool
	// closers close what openApp opened, in the order it opened them;
	// Close runs them the last first.
	closers []namedCloser
}

// namedCloser closes one part, naming it in its error.
type namedCloser struct {
	name  string
	close func() error
}

// appOptions say what an app opens beside the store.
type appOptions struct {
	// RunJobs opens a sandbox backend and the egress proxy: the app runs
	// jobs. Without, it only reads and changes stored jobs.
	RunJobs bool
	// CallbackURL is where jobs report (empty: no callback server).
	CallbackURL string
	// Metrics, if not nil, hears the engine and the Proxmox client.
	Metrics *metrics.Metrics
	// Serve: the app is a server (delegate serve). Where its store is
	// shared (PostgreSQL), it holds a lease there; Addr is where it
	// serves HTTP, shown to the servers that share the store.
	Serve bool
	Addr  string
	// OneShot: the app serves one CLI command and the process ends
	// (local.Config.OneShot).
	OneShot bool
}

// openApp opens the store and, as opts say, what runs jobs. On error it
// closes what it opened.
func openApp(ctx context.Context, cfg cli.Config, log *slog.Logger, opts appOptions) (_ *app, err error) {
	secret, err := cfg.SecretResolver()
	if err != nil {
		return nil, err
	}
	bindings, err := cfg.SecretBindings()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir (DELEGATE_DATA_DIR): %w", err)
	}
	store, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a := &app{store: store}
	a.opened("the job store", store.Close)
	defer func() {
		if err != nil {
			err = errors.Join(err, a.Close())
		}
	}()
	met := opts.Metrics
	// Without one, the engine opens it only to stop the sandbox of a job
	// it cancels that no server drives.
	open := func(ctx context.Context) (sandbox.Backend, error) {
		b, _, err := openBackend(ctx, cfg, store, log, met, nil, 0, "", opts.OneShot)
		return b, err
	}
	poll := time.Duration(0) // the engine's default
	var eg *engine.Egress
	if opts.RunJobs {
		// The egress proxy: the only road out of a job's sandbox (where
		// the backend routes through it), forwarding to the callback
		// server when there is one.
		cbAddr, cbPort := callbackAddr(cfg, opts.CallbackURL)
		eg, err = engine.NewEgress(store, engine.EgressConfig{Bindings: bindings, Secret: secret, Logger: log,
			Proxy: egress.Config{Callback: cbAddr, Allow: cfg.EgressAllow, AllowPrivate: cfg.EgressAllowPrivate,
				MaxConnsPerJob: cfg.EgressMaxConns, ConnRate: cfg.EgressConnRate, IdleTimeout: cfg.EgressIdleTimeout}})
		if err != nil {
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		a.opened("the egress proxy", eg.Close)
		a.backend, a.pool, err = openBackend(ctx, cfg, store, log, met, eg.Proxy(), cbPort, opts.CallbackURL, opts.OneShot)
		if err != nil {
			return nil, err
		}
		a.opened("the sandbox backend", a.backend.Close)
		if cfg.Backend == "proxmox" && cfg.ProxmoxEgressProxy != "" {
			// Job VMs reach the proxy's shared listener, naming their job
			// in Proxy-Authorization.
			if err := eg.ServeShared(cfg.ProxmoxEgressListen); err != nil {
				return nil, fmt.Errorf("PROXMOX_EGRESS_LISTEN=%s: %w", cfg.ProxmoxEgressListen, err)
			}
		}
		if cfg.Backend == "proxmox" {
			poll = time.Second // every poll is a few API calls
		}
	}
	var observer engine.Observer // nil unless there are metrics (not a nil *Metrics)
	if met != nil {
		observer = met
		met.CountJobs(store)
	}
	var leases *engine.Leases
	if cfg.Store != "" && opts.RunJobs && opts.Serve {
		// Servers share this store: each holds a lease in it.
		leases = &engine.Leases{TTL: cfg.LeaseTTL, HostID: cfg.HostID, Addr: opts.Addr}
	}
	a.shared = leases != nil
	a.eng = engine.New(store, a.backend, engine.Config{
		Leases:          leases,
		Defaults:        cfg.Defaults,
		Maxima:          engine.Maxima{CPU: cfg.MaxCPU, MemoryBytes: cfg.MaxMemory, DiskBytes: cfg.MaxDisk, TimeoutSeconds: cfg.MaxTimeout},
		MaxConcurrent:   cfg.MaxConcurrent,
		MaxSandboxes:    cfg.MaxSandboxes,
		MaxForks:        cfg.MaxForks,
		Quotas:          engine.Quotas{Jobs: cfg.Quotas.Jobs, Sandboxes: cfg.Quotas.Sandboxes, CPU: cfg.Quotas.CPU, MemoryBytes: cfg.Quotas.MemoryBytes, DiskBytes: cfg.Quotas.DiskBytes},
		SandboxIdle:     cfg.SandboxIdle,
		SandboxPause:    cfg.SandboxPause,
		SandboxLifetime: cfg.SandboxLifetime,
		OutputLimit:     cfg.OutputLimit,
		CleanupInterval: cfg.CleanupInterval,
		PollInterval:    poll,
		Logger:          log,

		CallbackURL:        opts.CallbackURL,
		HeartbeatThreshold: cfg.HeartbeatThreshold,
		ArtifactDir:        artifactDir(cfg),
		Secret:             secret,
		OpenBackend:        open,
		Observer:           observer,

		WorkspaceRoots:    cfg.WorkspaceRoots,
		WorkspaceMaxBytes: cfg.WorkspaceMaxBytes,
		WorkspaceMaxFiles: cfg.WorkspaceMaxFiles,
		CloneDir:          filepath.Join(cfg.DataDir, "clones"),
		GitAllow:          cfg.WorkspaceGitAllow,
		Egress:            eg,
		SecretBindings:    bindings,

		DataDir:   cfg.DataDir,
		MinFree:   cfg.MinFree,
		Retention: cfg.Retention,
		PeekEnd:   peekEnd(cfg),
	})
	a.opened("the engine", a.eng.Close)
	if met != nil && leases != nil {
		eng := a.eng
		met.CountServer(func() metrics.ServerStats {
			s := eng.ServerStats()
			return metrics.ServerStats{Live: s.Live, LeaseAge: s.LeaseAge, Adoptions: s.Adoptions, FencedWrites: s.FencedWrites,
				PoolKeeper: s.PoolKeeper}
		})
	}
	return a, nil
}

// opened records a part that Close closes.
func (a *app) opened(name string, close func() error) {
	a.closers = append(a.closers, namedCloser{name, close})
}

// Close stops the engine and closes what the app opened, the last opened
// first, and reports every part that failed to close.
func (a *app) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		if err := a.closers[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("closing %s: %w", a.closers[i].name, err))
		}
	}
	a.closers = nil
	return errors.Join(errs...)
}

// callbackAddr is where the egress proxy forwards a sandbox's callback
// connections (the callback server's own address, a wildcard as the
// loopback) and its port, when jobs have a callback server.
func callbackAddr(cfg cli.Config, callbackURL string) (netip.AddrPort, int) {
	if callbackURL == "" || cfg.CallbackPort == 0 {
		return netip.AddrPort{}, 0
	}
	host := cfg.CallbackHost
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, 0 // a name: the callback stays the public URL's
	}
	return netip.AddrPortFrom(a, uint16(cfg.CallbackPort)), cfg.CallbackPort
}

// openBackend makes the sandbox backend DELEGATE_BACKEND names; proxy is
// the egress proxy its sandboxes go through (nil: none), cbPort the
// callback port a local sandbox forwards (0: none), callbackURL the
// callback server's public URL, which job VMs' firewalls let them reach.
//
// A Proxmox backend is the warm pool's keeper too.
func openBackend(ctx context.Context, cfg cli.Config, st store, log *slog.Logger, met *metrics.Metrics, proxy sandbox.EgressServer, cbPort int, callbackURL string, oneShot bool) (sandbox.Backend, poolKeeper, error) {
	switch cfg.Backend {
	case "proxmox":
		client, err := pve.New(cfg.Proxmox)
		if err != nil {
			return nil, nil, fmt.Errorf("proxmox backend: %w", err)
		}
		if met != nil {
			client.Observe(met.ProxmoxRequest)
		}
		// One instance per data dir: a restarted server finds its VMs, and
		// servers with other data dirs leave them alone; servers sharing
		// a store are one instance (instanceID).
		instance, err := instanceID(ctx, cfg, st)
		if err != nil {
			return nil, nil, fmt.Errorf("proxmox backend: instance id: %w", err)
		}
		var eg *proxmox.Egress
		if cfg.ProxmoxEgressProxy != "" && proxy != nil {
			if eg, err = proxmox.ParseEgress(cfg.ProxmoxEgressProxy, callbackURL); err != nil {
				return nil, nil, fmt.Errorf("proxmox backend: %w", err)
			}
		}
		var vmids [2]int
		if cfg.ProxmoxVMIDRange != "" {
			lo, hi, err := proxmox.ParseVMIDRange(cfg.ProxmoxVMIDRange)
			if err != nil {
				return nil, nil, fmt.Errorf("proxmox backend: %w", err)
			}
			vmids = [2]int{lo, hi}
		}
		b, err := proxmox.New(client, proxmox.Config{Template: cfg.Defaults.VMTemplate, Bridge: cfg.ProxmoxBridge, VLAN: cfg.ProxmoxVLAN, Egress: eg,
			AgentTimeout: cfg.ProxmoxAgentTimeout, NodeMemory: cfg.ProxmoxNodeMemory, Instance: instance, Logger: log,
			ResourcePool: cfg.ProxmoxResourcePool, CPUOvercommit: cfg.ProxmoxCPUOvercommit, Nodes: cfg.ProxmoxNodes, VMIDRange: vmids,
			TransferURL: callbackURL, CheckpointDir: filepath.Join(cfg.DataDir, "proxmox-checkpoints")})
		if err != nil {
			return nil, nil, fmt.Errorf("proxmox backend: %w", err)
		}
		if err := b.Check(ctx); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("proxmox backend (PROXMOX_HOST=%s): %w", cfg.Proxmox.Host, err), b.Close())
		}
		return b, b, nil
	default:
		b, err := local.New(local.Config{Dir: filepath.Join(cfg.DataDir, "sandboxes"), RootfsDir: cfg.LocalRootfsDir(),
			DefaultTemplate: cfg.Defaults.VMTemplate, UIDs: cfg.SandboxUIDs, ToolDirs: cfg.ToolDirs, Logger: log,
			// The host's file table is shared by the jobs running at once
			// and the sandboxes kept after theirs.
			PidsMax: cfg.PidsMax, NoFile: cfg.NoFile, Sandboxes: cfg.MaxConcurrent + local.KeptSandboxes,
			CacheDir: filepath.Join(cfg.DataDir, "caches"), CacheMaxBytes: cfg.CacheMaxBytes,
			Egress: proxy, EgressCallbackPort: cbPort, OneShot: oneShot})
		if err != nil {
			return nil, nil, fmt.Errorf("local backend: %w", err)
		}
		if tpl := cfg.Defaults.VMTemplate; tpl != "" {
			if err := b.CheckTemplate(ctx, tpl); err != nil {
				return nil, nil, errors.Join(fmt.Errorf("DEFAULT_VM_TEMPLATE=%q: %w", tpl, err), b.Close())
			}
		}
		return b, nil, nil
	}
}

// keepPool starts the Proxmox warm pool: only a server keeps one (one
// per data dir: the lock file decides; the others take VMs from it).
// With PROXMOX_POOL_SIZE=0 it still runs once, to destroy the pool an
// earlier run left. It returns nil for another backend.
func keepPool(ctx context.Context, cfg cli.Config, a *app, met *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	b := a.pool
	if b == nil {
		return nil, nil
	}
	p := cfg.ProxmoxPool
	pc := proxmox.PoolConfig{Size: p.Size, CPU: p.CPU, MemoryBytes: p.MemoryBytes, DiskBytes: p.DiskBytes, Network: p.Network,
		LockFile: filepath.Join(cfg.DataDir, "proxmox-pool.lock")}
	if a.shared {
		// Servers sharing a store: the one that holds the pool's term in
		// it keeps the pool (a file lock is one host's).
		pc.LockFile, pc.Lead = "", a.eng.PoolKeeper
		pc.CheckInterval = min(10*time.Second, max(cfg.LeaseTTL, time.Second))
	}
	stop, err = b.KeepPool(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("warm pool (PROXMOX_POOL_*): %w", err)
	}
	if p.Size > 0 {
		log.Info("warm pool", "size", p.Size, "template", cfg.Defaults.VMTemplate, "cpu", p.CPU, "memory", p.MemoryBytes>>20,
			"disk", p.DiskBytes>>20, "takes", "jobs of this cpu and memory, at most this disk, no network, the default template")
	}
	if met != nil {
		met.CountPool(poolCounter{b})
	}
	return stop, nil
}

// poolKeeper keeps a warm pool of sandboxes (the Proxmox backend does),
// and has its workspaces carried over HTTP by the callback server.
type poolKeeper interface {
	KeepPool(ctx context.Context, cfg proxmox.PoolConfig) (stop func(), err error)
	PoolVMs() []proxmox.PoolCount
	Transfers() *proxmox.Transfers
}

// poolCounter reads the warm pool for the metrics.
type poolCounter struct{ b poolKeeper }

func (p poolCounter) PoolVMs(context.Context) ([]metrics.PoolVMs, error) {
	var out []metrics.PoolVMs
	for _, c := range p.b.PoolVMs() {
		out = append(out, metrics.PoolVMs{Template: c.Template, State: c.State, Count: c.Count})
	}
	return out, nil
}

// peekEnd reads a local sandbox's record of its command's end, for the
// jobs a read-only process lists (nil for other backends).
func peekEnd(cfg cli.Config) func(sandboxID, execID string) (sandbox.Exit, bool) {
	if cfg.Backend != "local" {
		return nil
	}
	dir := filepath.Join(cfg.DataDir, "sandboxes")
	return func(sandboxID, execID string) (sandbox.Exit, bool) { return local.PeekEnd(dir, sandboxID, execID) }
}

// artifactDir is where artifact files are kept: DELEGATE_ARTIFACT_DIR,
// else the data dir's (on PostgreSQL the store keeps artifacts' contents:
// it holds those collected before).
func artifactDir(cfg cli.Config) string {
	if cfg.ArtifactDir != "" {
		return cfg.ArtifactDir
	}
	return filepath.Join(cfg.DataDir, "artifacts")
}
