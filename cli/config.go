package cli

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/oauthrs"
	"github.com/delegate-dev/delegate/pve"
	"github.com/spf13/pflag"
)

// Config is everything the environment and flags decide. Environment names
// follow the seed where it had one; flags override the environment.
type Config struct {
	DataDir         string
	RootfsDir       string // "": DataDir/rootfs (see LocalRootfsDir)
	Backend         string
	MaxConcurrent   int
	OutputLimit     int64
	CleanupInterval time.Duration
	Defaults        delegate.Defaults
	LogLevel        slog.Level

	// Store is where the jobs are kept (DELEGATE_STORE): "" for the SQLite
	// store in DataDir, or a PostgreSQL URL (store.go).
	Store string
	// LeaseTTL is a server's lease in a shared store (DELEGATE_LEASE_TTL,
	// PostgreSQL only); HostID tells this host from the others
	// (DELEGATE_HOST_ID; "": the kernel's boot id).
	LeaseTTL time.Duration
	HostID   string
	// AdvertiseURL is where the other servers of a shared store reach
	// this one's --http listener, to forward it the commands for its
	// local kept sandboxes (DELEGATE_ADVERTISE_URL; "": the listener's
	// address, the host's name for an address of every interface).
	AdvertiseURL string
	// ArtifactDir holds artifact files by sha256 (DELEGATE_ARTIFACT_DIR;
	// "": DataDir/artifacts). On PostgreSQL the store keeps them: it holds
	// those collected before.
	ArtifactDir string

	// SandboxUIDs is the local sandboxes' host uid range
	// (DELEGATE_SANDBOX_UIDS, "FIRST-LAST"; "": the backend's default),
	// which the backend checks when it starts.
	SandboxUIDs string
	// ToolDirs are host directories of tools local jobs see read-only, on
	// their PATH (DELEGATE_TOOL_DIRS, separated by ':').
	ToolDirs []string
	// PidsMax and NoFile are a local sandbox's processes and each
	// process's open files (DELEGATE_PIDS_MAX, DELEGATE_NOFILE; 0: the
	// backend chooses them from the host's file table).
	PidsMax, NoFile int

	// Maxima are the most a manifest may ask for (DELEGATE_MAX_CPU,
	// _MEMORY, _DISK, _TIMEOUT): for the local backend the host's own
	// cores and memory by default; 0: the manifest's bounds only.
	MaxCPU     float64
	MaxMemory  int64
	MaxDisk    int64
	MaxTimeout int

	// Kept sandboxes (DELEGATE_MAX_SANDBOXES, DELEGATE_SANDBOX_IDLE,
	// _PAUSE, _LIFETIME): how many may exist, and their timers' longest
	// values (a sandbox may ask for shorter idle and lifetime).
	MaxSandboxes int
	// MaxForks is the most forks one fork makes (DELEGATE_MAX_FORKS).
	MaxForks int
	// Quotas per principal (DELEGATE_QUOTA_*, quotas.go).
	Quotas          Quotas
	SandboxIdle     time.Duration
	SandboxPause    time.Duration
	SandboxLifetime time.Duration

	CallbackHost       string
	CallbackPort       int
	CallbackPublicURL  string
	HeartbeatThreshold time.Duration
	SecretsFile        string

	// EgressAllow lifts single ranges out of what the egress proxy always
	// denies (a package mirror at 10.1.2.3/32), DELEGATE_EGRESS_ALLOW;
	// EgressAllowPrivate lets jobs reach the private ranges,
	// DELEGATE_EGRESS_ALLOW_PRIVATE. Neither widens an allowlist.
	EgressAllow        []netip.Prefix
	EgressAllowPrivate bool
	// EgressMaxConns, EgressConnRate and EgressIdleTimeout are the
	// proxy's per-job limits (DELEGATE_EGRESS_MAX_CONNS, _CONN_RATE,
	// _IDLE_TIMEOUT; 0: egress's defaults).
	EgressMaxConns    int
	EgressConnRate    int
	EgressIdleTimeout time.Duration

	// HTTPToken and HTTPTokenFile are DELEGATE_HTTP_TOKEN and
	// DELEGATE_HTTP_TOKEN_FILE as they are: `serve --http` reads them
	// (LoadHTTPToken), the other commands never need the file.
	HTTPToken     string
	HTTPTokenFile string
	// OAuth is the external issuer whose access tokens `serve --http`
	// accepts besides (DELEGATE_OAUTH_*; no Issuers: none).
	OAuth oauthrs.Config

	// Proxmox (DELEGATE_BACKEND=proxmox).
	Proxmox pve.Config
	// ProxmoxEgressProxy is where job VMs reach the egress proxy
	// (PROXMOX_EGRESS_PROXY, address:port): set, jobs' networks go
	// through it alone, behind each VM's firewall; ProxmoxEgressListen is
	// where the server listens for them (PROXMOX_EGRESS_LISTEN, default
	// the same address).
	ProxmoxEgressProxy  string
	ProxmoxEgressListen string
	ProxmoxBridge       string
	ProxmoxVLAN         int
	// ProxmoxAgentTimeout bounds the wait for a new VM's guest agent.
	ProxmoxAgentTimeout time.Duration
	// ProxmoxNodeMemory is what VMs may use per node ("" key: every node).
	ProxmoxNodeMemory map[string]int64
	// ProxmoxResourcePool (PROXMOX_RESOURCE_POOL) and ProxmoxCPUOvercommit
	// (PROXMOX_CPU_OVERCOMMIT): see proxmox.Config.
	ProxmoxResourcePool  string
	ProxmoxCPUOvercommit float64
	// ProxmoxNodes (PROXMOX_NODES, comma-separated) and ProxmoxVMIDRange
	// (PROXMOX_VMID_RANGE, LOW-HIGH): see proxmox.Config.
	ProxmoxNodes     []string
	ProxmoxVMIDRange string

	// Toolsets are the MCP tools serve offers (DELEGATE_TOOLSETS, --toolsets:
	// jobs, proxmox); ProxmoxAllowElevated lets the proxmox tools change
	// anything (PROXMOX_ALLOW_ELEVATED).
	Toolsets             []string
	ProxmoxAllowElevated bool
	// proxmoxErr is what is wrong with PROXMOX_* when the backend is not
	// proxmox (the proxmox toolset needs them).
	proxmoxErr error

	// ProxmoxPool is the warm pool `serve` keeps (PROXMOX_POOL_*).
	ProxmoxPool PoolConfig

	// Workspaces: the directories a job's workspace source may lie under
	// (DELEGATE_WORKSPACE_ROOTS, a list like PATH; none: dir sources are
	// refused), a source's caps (DELEGATE_WORKSPACE_MAX_BYTES, _MAX_FILES),
	// the addresses a git clone may reach besides public ones
	// (DELEGATE_WORKSPACE_GIT_ALLOW), and what the caches may hold in all
	// (DELEGATE_CACHE_MAX).
	WorkspaceRoots    []string
	WorkspaceMaxBytes int64
	WorkspaceMaxFiles int
	WorkspaceGitAllow []netip.Prefix
	CacheMaxBytes     int64

	// Retention: finished jobs go this long after they ended
	// (DELEGATE_RETENTION; 0: the default, < 0: never). MinFree is the
	// data dir's floor of free space (DELEGATE_MIN_FREE; 0: the default,
	// < 0: none). See gc.go.
	Retention time.Duration
	MinFree   int64
}

// PoolConfig is the warm pool of booted Proxmox VMs: how many, and their
// shape (jobs of exactly that CPU and memory, and at most that disk,
// take them).
type PoolConfig struct {
	Size        int
	CPU         float64
	MemoryBytes int64
	DiskBytes   int64
	// Network keeps the pool's VMs with a NIC, for forks' files over
	// HTTP (PROXMOX_POOL_NETWORK; proxmox.PoolConfig.Network).
	Network bool
}

// envVar documents one setting; docs/operations.md's Configuration table is written from these.
type envVar struct {
	name, def, help string
}

// Defaults of the settings that are not job defaults of package delegate.
const (
	defaultCallbackHost = "127.0.0.1"
	defaultCallbackPort = 8765
)

// envVars lists the settings for `delegate --help`.
func envVars() []envVar {
	return append([]envVar{
		{"DELEGATE_DATA_DIR", "$XDG_STATE_HOME/delegate or ~/.local/state/delegate", "state directory: jobs.db, sandboxes"},
		{"DELEGATE_STORE", "DELEGATE_DATA_DIR/jobs.db", "where jobs are kept: SQLite in the data dir, or a PostgreSQL URL postgres://user:password@host/db (delegate store migrate)"},
		{"DELEGATE_BACKEND", "local", "sandbox backend: local or proxmox"},
		{"DELEGATE_MAX_CONCURRENT", strconv.Itoa(delegate.DefaultMaxConcurrent), "jobs running at once; more wait as pending"},
		{"DELEGATE_OUTPUT_LIMIT", fmt.Sprintf("%dM", delegate.DefaultOutputLimit>>20), "output kept per job (the rest is counted, not kept)"},
		{"DELEGATE_LOG_LEVEL", "info", "debug, info, warn or error (logs go to stderr)"},
		{"DEFAULT_TIMEOUT", strconv.Itoa(delegate.DefaultTimeoutSeconds), fmt.Sprintf("job timeout in seconds when the manifest has none (1..%d)", delegate.MaxTimeoutSeconds)},
		{"DEFAULT_CPU", strconv.Itoa(delegate.DefaultCPU), "cpu cores per job"},
		{"DEFAULT_MEMORY", delegate.DefaultMemory, "memory per job"},
		{"DEFAULT_DISK", delegate.DefaultDisk, "size of /workspace per job"},
		{"DEFAULT_VM_TEMPLATE", "(host view)", "default vmTemplate (local: a rootfs name, or an absolute path; proxmox: a template)"},
		{"DELEGATE_ROOTFS_DIR", "DELEGATE_DATA_DIR/rootfs", "root filesystems a job may name in vmTemplate (local backend)"},
		{"DELEGATE_SANDBOX_UIDS", "1879048192-2147352575", "host uids of local sandboxes, FIRST-LAST: 65536 per sandbox, clear of /etc/subuid and /etc/subgid"},
		{"DELEGATE_TOOL_DIRS", "", "host directories of tools local jobs see read-only at their paths, their bin on PATH, separated by ':' (e.g. /opt/node:/opt/jdk)"},
		{"DELEGATE_PIDS_MAX", "512 (less on a small host)", "processes and threads of one local sandbox"},
		{"DELEGATE_MAX_CPU", "the host's cores (local)", "most cpu cores a job may ask for"},
		{"DELEGATE_MAX_MEMORY", "the host's memory (local)", "most memory a job may ask for"},
		{"DELEGATE_MAX_DISK", "the host's memory (local: /workspace is memory)", "largest /workspace a job may ask for"},
		{"DELEGATE_MAX_TIMEOUT", strconv.Itoa(delegate.MaxTimeoutSeconds), "longest timeout a job may ask for, in seconds"},
		{"DELEGATE_MAX_SANDBOXES", strconv.Itoa(delegate.DefaultMaxSandboxes), "kept sandboxes that may exist at once (opened, or kept by persistent jobs)"},
		{"DELEGATE_MAX_FORKS", strconv.Itoa(delegate.DefaultMaxForks), "most forks of a kept sandbox one call makes (open_sandbox count, sandboxes fork -n)"},
		{"DELEGATE_SANDBOX_IDLE", delegate.DefaultSandboxIdle.String(), "a kept sandbox idle this long is paused (a duration like 30m)"},
		{"DELEGATE_SANDBOX_PAUSE", delegate.DefaultSandboxPause.String(), "a kept sandbox paused this long is destroyed"},
		{"DELEGATE_SANDBOX_LIFETIME", delegate.DefaultSandboxLifetime.String(), "a kept sandbox is destroyed this long after it was made"},
		{"DELEGATE_NOFILE", "from the host's file table, 1024 at most", "open files of each process of a local sandbox (RLIMIT_NOFILE, at most the server's)"},
		{"DELEGATE_LEASE_TTL", "15s", "with DELEGATE_STORE: a server silent this long is dead to the others, which adopt its jobs (renewed every third of it)"},
		{"DELEGATE_ARTIFACT_DIR", "DELEGATE_DATA_DIR/artifacts", "where artifact files are kept, by sha256 (on PostgreSQL the store keeps them: this holds those collected before)"},
		{"DELEGATE_ADVERTISE_URL", "http(s)://the --http address", "with DELEGATE_STORE: where the other servers reach this one's --http listener, to forward it commands for its local kept sandboxes"},
		{"DELEGATE_HOST_ID", "the kernel's boot id", "with DELEGATE_STORE: names this host; local sandboxes are taken over only by a server with the same"},
		{"CLEANUP_INTERVAL_SECONDS", strconv.Itoa(int(delegate.DefaultCleanupInterval.Seconds())), "how often orphaned sandboxes are looked for"},
		{"CALLBACK_HOST", defaultCallbackHost, "address the callback server binds"},
		{"CALLBACK_PORT", strconv.Itoa(defaultCallbackPort), "port of the callback server (0: none)"},
		{"CALLBACK_PUBLIC_URL", "http://CALLBACK_HOST:CALLBACK_PORT", "callback base URL handed to sandboxes"},
		{"HEARTBEAT_THRESHOLD_SECONDS", strconv.Itoa(int(delegate.DefaultHeartbeatThreshold.Seconds())), "a running job silent this long fails with lost heartbeat"},
		{"DELEGATE_SECRETS_FILE", "", "file of NAME=value secret lines (mode 0600); NAME_INJECT='host Header Format {}' binds a secret to a host"},
		{"DELEGATE_SECRET_<NAME>_INJECT", "", "'host Header Format {}': the egress proxy adds the secret to the job's HTTPS requests to host; the job sees a placeholder"},
		{"DELEGATE_EGRESS_ALLOW", "", "comma-separated ranges jobs may reach although the egress proxy denies them (10.1.2.3/32): never widens an allowlist"},
		{"DELEGATE_EGRESS_ALLOW_PRIVATE", "false", "let jobs' network reach 10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7"},
		{"DELEGATE_EGRESS_MAX_CONNS", strconv.Itoa(egress.DefaultMaxConnsPerJob), "connections one job may hold open at once through the egress proxy (all jobs together: half the server's open files)"},
		{"DELEGATE_EGRESS_CONN_RATE", strconv.Itoa(egress.DefaultConnRate), "connections one job may open a second through the egress proxy (a burst of twice as many)"},
		{"DELEGATE_EGRESS_IDLE_TIMEOUT", egress.DefaultIdleTimeout.String(), "a job's connection through the egress proxy that carries nothing either way this long is closed"},
		{"DELEGATE_HTTP_TOKEN", "", "serve --http: token that /mcp, the dashboard and /metrics require (Authorization: Bearer)"},
		{"DELEGATE_HTTP_TOKEN_FILE", "", "file holding DELEGATE_HTTP_TOKEN instead (mode 0600)"},
		{"DELEGATE_OAUTH_ISSUERS", "", "serve --http: OAuth issuers (comma-separated URLs) whose JWT access tokens /mcp accepts (docs/security.md)"},
		{"DELEGATE_OAUTH_RESOURCE", "", "with DELEGATE_OAUTH_ISSUERS: this server's /mcp URL as clients reach it; tokens' aud must hold it"},
		{"DELEGATE_OAUTH_NAME_CLAIM", oauthrs.DefaultNameClaim, "the access token claim that names its principal (ISSUER-HOST:VALUE)"},
		{"DELEGATE_WORKSPACE_ROOTS", "", "directories (a list like PATH) whose subdirectories jobs may import as manifest.workspace.dir; unset: none"},
		{"DELEGATE_WORKSPACE_MAX_BYTES", "256M", "most a workspace source may hold (and never more than half the job's memory)"},
		{"DELEGATE_WORKSPACE_MAX_FILES", "50000", "most files (directories and links included) a workspace source may hold"},
		{"DELEGATE_WORKSPACE_GIT_ALLOW", "", "CIDRs a git source may be cloned from besides public addresses (a git server on the LAN), comma-separated"},
		{"DELEGATE_CACHE_MAX", "10G", "what the caches jobs ask for (manifest.caches) may hold in all; the least recently used go first"},
		{"DELEGATE_RETENTION", "30d", "finished jobs, their output and artifacts go this long after they ended (delegate gc; 0: kept forever)"},
		{"DELEGATE_MIN_FREE", "1G or 5% of the disk, the smaller", "below this free in the data dir, submissions and new sandboxes are refused (0: no floor)"},
		{"DELEGATE_BACKEND=proxmox", "", "also PROXMOX_* (see docs/PROXMOX.md)"},
		{"DELEGATE_TOOLSETS", DefaultToolsets, "MCP tools of serve: jobs, proxmox (admin tools; PROXMOX_* token), or both"},
		{"PROXMOX_ALLOW_ELEVATED", "false", "let the proxmox tools change the cluster (otherwise read-only)"},
	}, quotaVars()...)
}

func defaultDataDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "delegate")
	}
	// $HOME and $TMPDIR as getenv has them (os.UserHomeDir and
	// os.TempDir read this process's): a command handed to a server is
	// read with the environment of the process that sent it.
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "state", "delegate")
	}
	return filepath.Join(cmp.Or(getenv("TMPDIR"), "/tmp"), fmt.Sprintf("delegate-%d", os.Getuid()))
}

// LoadConfig reads the environment. Every error names the variable.
func LoadConfig(getenv func(string) string) (Config, error) {
	return loadConfig(getenv, thisHost())
}

// hostInfo is what the maxima's defaults come from.
type hostInfo struct {
	CPUs        int
	MemoryBytes int64 // 0: unknown
}

func thisHost() hostInfo { return hostInfo{CPUs: runtime.NumCPU(), MemoryBytes: hostMemory()} }

func loadConfig(getenv func(string) string, host hostInfo) (Config, error) {
	c := Config{
		DataDir:         defaultDataDir(getenv),
		Backend:         "local",
		MaxConcurrent:   delegate.DefaultMaxConcurrent,
		MaxSandboxes:    delegate.DefaultMaxSandboxes,
		MaxForks:        delegate.DefaultMaxForks,
		SandboxIdle:     delegate.DefaultSandboxIdle,
		SandboxPause:    delegate.DefaultSandboxPause,
		SandboxLifetime: delegate.DefaultSandboxLifetime,
		OutputLimit:     delegate.DefaultOutputLimit,
		CleanupInterval: delegate.DefaultCleanupInterval,
		Defaults:        delegate.ServerDefaults(),
		LogLevel:        slog.LevelInfo,

		CallbackHost:       defaultCallbackHost,
		CallbackPort:       defaultCallbackPort,
		HeartbeatThreshold: delegate.DefaultHeartbeatThreshold,

		WorkspaceMaxBytes: defaultWorkspaceMaxBytes,
		WorkspaceMaxFiles: defaultWorkspaceMaxFiles,
		CacheMaxBytes:     defaultCacheMax,
	}
	var errs []string
	bad := func(name, rule string) { errs = append(errs, fmt.Sprintf("%s=%q: %s", name, getenv(name), rule)) }
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	intIn := func(name string, lo, hi int, dst *int) {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				bad(name, fmt.Sprintf("must be a whole number from %d to %d", lo, hi))
				return
			}
			*dst = n
		}
	}
	size := func(name string, min int64, dst *string) {
		if v := getenv(name); v != "" {
			n, err := delegate.ParseSize(v)
			if err != nil || n < min {
				bad(name, fmt.Sprintf("must be a size like 512M or 2G, at least %dM", min>>20))
				return
			}
			*dst = v
		}
	}
	str("DELEGATE_DATA_DIR", &c.DataDir)
	str("DELEGATE_BACKEND", &c.Backend)
	if c.Backend != "local" && c.Backend != "proxmox" {
		bad("DELEGATE_BACKEND", "must be local or proxmox")
	}
	intIn("DELEGATE_MAX_CONCURRENT", 1, 1024, &c.MaxConcurrent)
	intIn("DELEGATE_MAX_SANDBOXES", 1, 1024, &c.MaxSandboxes)
	intIn("DELEGATE_MAX_FORKS", 1, 64, &c.MaxForks)
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"DELEGATE_SANDBOX_IDLE", &c.SandboxIdle}, {"DELEGATE_SANDBOX_PAUSE", &c.SandboxPause}, {"DELEGATE_SANDBOX_LIFETIME", &c.SandboxLifetime}} {
		if v := getenv(d.name); v != "" {
			n, err := time.ParseDuration(v)
			if err != nil || n < time.Second || n > delegate.MaxSandboxLifetime {
				bad(d.name, fmt.Sprintf("must be a duration like 30m or 24h, from 1s to %s", delegate.MaxSandboxLifetime))
				continue
			}
			*d.dst = n
		}
	}
	if v := getenv("DELEGATE_OUTPUT_LIMIT"); v != "" {
		n, err := delegate.ParseSize(v)
		if err != nil || n < delegate.MinOutputLimit || n > delegate.MaxOutputLimit {
			bad("DELEGATE_OUTPUT_LIMIT", "must be a size from 1K to 1G, like 4M")
		} else {
			c.OutputLimit = n
		}
	}
	if v := getenv("DELEGATE_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			bad("DELEGATE_LOG_LEVEL", "must be debug, info, warn or error")
		}
	}
	intIn("DEFAULT_TIMEOUT", 1, delegate.MaxTimeoutSeconds, &c.Defaults.Timeout)
	if v := getenv("DEFAULT_CPU"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0.01 || n > delegate.MaxCPU {
			bad("DEFAULT_CPU", fmt.Sprintf("must be a number of cores from 0.01 to %d", delegate.MaxCPU))
		} else {
			c.Defaults.CPU = n
		}
	}
	size("DEFAULT_MEMORY", delegate.MinMemoryBytes, &c.Defaults.Memory)
	size("DEFAULT_DISK", delegate.MinDiskBytes, &c.Defaults.Disk)
	str("DEFAULT_VM_TEMPLATE", &c.Defaults.VMTemplate)
	if rule := templateRule(c.Defaults.VMTemplate, c.DataDir); rule != "" {
		bad("DEFAULT_VM_TEMPLATE", rule)
	}
	str("DELEGATE_ROOTFS_DIR", &c.RootfsDir)
	str("DELEGATE_SANDBOX_UIDS", &c.SandboxUIDs)
	intIn("DELEGATE_PIDS_MAX", 16, 1<<20, &c.PidsMax)
	intIn("DELEGATE_NOFILE", 16, 1<<20, &c.NoFile)
	if c.RootfsDir != "" && (!filepath.IsAbs(c.RootfsDir) || filepath.Clean(c.RootfsDir) != c.RootfsDir) {
		bad("DELEGATE_ROOTFS_DIR", "must be a clean absolute path")
	}
	if v := getenv("DELEGATE_TOOL_DIRS"); v != "" {
		for d := range strings.SplitSeq(v, ":") {
			if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" {
				bad("DELEGATE_TOOL_DIRS", fmt.Sprintf("must be clean absolute paths of directories, separated by ':' (got %q)", d))
				break
			}
			c.ToolDirs = append(c.ToolDirs, d)
		}
	}
	if v := getenv("DELEGATE_LEASE_TTL"); v != "" {
		n, err := time.ParseDuration(v)
		if err != nil || n < time.Second || n > 5*time.Minute {
			bad("DELEGATE_LEASE_TTL", "must be a duration like 15s, from 1s to 5m")
		}
		c.LeaseTTL = n
	}
	str("DELEGATE_HOST_ID", &c.HostID)
	if v := getenv("DELEGATE_ADVERTISE_URL"); v != "" {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
			bad("DELEGATE_ADVERTISE_URL", "must be an http(s) URL of this server's --http listener, without a path, like http://10.0.0.5:8080")
		} else {
			c.AdvertiseURL = strings.TrimSuffix(v, "/")
		}
	}
	str("DELEGATE_ARTIFACT_DIR", &c.ArtifactDir)
	cleanup := int(c.CleanupInterval.Seconds())
	intIn("CLEANUP_INTERVAL_SECONDS", 1, 86400, &cleanup)
	c.CleanupInterval = time.Duration(cleanup) * time.Second
	str("CALLBACK_HOST", &c.CallbackHost)
	intIn("CALLBACK_PORT", 0, 65535, &c.CallbackPort)
	c.CallbackPublicURL = "http://" + net.JoinHostPort(c.CallbackHost, strconv.Itoa(c.CallbackPort))
	if v := getenv("CALLBACK_PUBLIC_URL"); v != "" {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("CALLBACK_PUBLIC_URL", "must be an http(s) URL like http://10.0.0.5:8765")
		} else {
			c.CallbackPublicURL = strings.TrimSuffix(v, "/")
		}
	}
	heartbeat := int(c.HeartbeatThreshold.Seconds())
	intIn("HEARTBEAT_THRESHOLD_SECONDS", 1, 86400, &heartbeat)
	c.HeartbeatThreshold = time.Duration(heartbeat) * time.Second
	str("DELEGATE_SECRETS_FILE", &c.SecretsFile)
	if v := getenv("DELEGATE_EGRESS_ALLOW"); v != "" {
		for _, f := range strings.Split(v, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(f))
			if err != nil {
				bad("DELEGATE_EGRESS_ALLOW", fmt.Sprintf("%q is not an address range like 10.1.2.3/32 or fd00:1::/64", strings.TrimSpace(f)))
				break
			}
			c.EgressAllow = append(c.EgressAllow, p.Masked())
		}
	}
	if v := getenv("DELEGATE_EGRESS_ALLOW_PRIVATE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad("DELEGATE_EGRESS_ALLOW_PRIVATE", "must be true or false")
		}
		c.EgressAllowPrivate = b
	}
	intIn("DELEGATE_EGRESS_MAX_CONNS", 4, 1<<16, &c.EgressMaxConns)
	intIn("DELEGATE_EGRESS_CONN_RATE", 1, 1<<16, &c.EgressConnRate)
	if v := getenv("DELEGATE_EGRESS_IDLE_TIMEOUT"); v != "" {
		n, err := time.ParseDuration(v)
		if err != nil || n < time.Second || n > 24*time.Hour {
			bad("DELEGATE_EGRESS_IDLE_TIMEOUT", "must be a duration like 5m, from 1s to 24h")
		} else {
			c.EgressIdleTimeout = n
		}
	}
	str("DELEGATE_HTTP_TOKEN", &c.HTTPToken)
	str("DELEGATE_HTTP_TOKEN_FILE", &c.HTTPTokenFile)
	if c.HTTPToken != "" && c.HTTPTokenFile != "" {
		errs = append(errs, "DELEGATE_HTTP_TOKEN and DELEGATE_HTTP_TOKEN_FILE: set one, not both")
	}
	c.loadOAuth(getenv, &errs)
	c.loadWorkspaces(getenv, bad)
	c.loadRetention(getenv, bad)
	c.loadStore(getenv, &errs)
	c.loadMaxima(getenv, host, bad)
	c.loadQuotas(getenv, bad)
	c.loadToolsets(getenv, bad, &errs)
	if c.Backend == "proxmox" {
		pc, err := pve.ConfigFromEnv(getenv)
		if err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), "invalid Proxmox configuration:\n  "))
		}
		c.Proxmox = pc
		str("PROXMOX_JOB_BRIDGE", &c.ProxmoxBridge)
		str("PROXMOX_EGRESS_PROXY", &c.ProxmoxEgressProxy)
		str("PROXMOX_EGRESS_LISTEN", &c.ProxmoxEgressListen)
		if v := c.ProxmoxEgressProxy; v != "" {
			if ap, err := netip.ParseAddrPort(v); err != nil || ap.Port() == 0 {
				bad("PROXMOX_EGRESS_PROXY", "must be the address and port job VMs reach the egress proxy at, like 10.0.0.5:3128")
			}
			if c.ProxmoxEgressListen == "" {
				c.ProxmoxEgressListen = v
			}
		}
		intIn("PROXMOX_JOB_VLAN", 0, 4094, &c.ProxmoxVLAN)
		agent := 300
		intIn("PROXMOX_AGENT_TIMEOUT", 1, 3600, &agent)
		c.ProxmoxAgentTimeout = time.Duration(agent) * time.Second
		if c.Defaults.VMTemplate == "" {
			errs = append(errs, "DEFAULT_VM_TEMPLATE: must be set for the proxmox backend (a template's name or vmid)")
		}
		if v := getenv("PROXMOX_NODE_MEMORY"); v != "" {
			m, err := parseNodeMemory(v)
			if err != nil {
				bad("PROXMOX_NODE_MEMORY", err.Error())
			}
			c.ProxmoxNodeMemory = m
		}
		c.ProxmoxPool = loadPool(getenv, c.Defaults, bad)
		for _, n := range strings.Split(getenv("PROXMOX_NODES"), ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.ProxmoxNodes = append(c.ProxmoxNodes, n)
			}
		}
		str("PROXMOX_VMID_RANGE", &c.ProxmoxVMIDRange)
		if str("PROXMOX_RESOURCE_POOL", &c.ProxmoxResourcePool); c.ProxmoxResourcePool != "" && !poolIDRe().MatchString(c.ProxmoxResourcePool) {
			bad("PROXMOX_RESOURCE_POOL", "must be a Proxmox pool id: letters, digits, '.', '-' and '_' (parent/child for a nested pool)")
		}
		if v := getenv("PROXMOX_CPU_OVERCOMMIT"); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f >= 0 && f <= 100) {
				bad("PROXMOX_CPU_OVERCOMMIT", "must be a ratio of vCPUs to cores from 0 (no reservation) to 100, like 4")
			}
			c.ProxmoxCPUOvercommit = f
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("invalid configuration:\n  %s", strings.Join(errs, "\n  "))
	}
	return c, nil
}

// loadMaxima reads DELEGATE_MAX_*. For the local backend, whose jobs run
// on this host, a maximum not set is the host's own cores or memory (and
// the workspace, a tmpfs, is memory too), and a DEFAULT_* not set comes
// down to it; a DEFAULT_* set above a maximum is an error naming both.
func (c *Config) loadMaxima(getenv func(string) string, host hostInfo, bad func(name, rule string)) {
	c.MaxTimeout = delegate.MaxTimeoutSeconds
	if c.Backend == "local" {
		c.MaxCPU = float64(host.CPUs)
		c.MaxMemory, c.MaxDisk = host.MemoryBytes, host.MemoryBytes
	}
	if v := getenv("DELEGATE_MAX_CPU"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0.01 || n > delegate.MaxCPU {
			bad("DELEGATE_MAX_CPU", fmt.Sprintf("must be a number of cores from 0.01 to %d", delegate.MaxCPU))
		} else {
			c.MaxCPU = n
		}
	}
	for _, s := range []struct {
		name string
		min  int64
		dst  *int64
	}{{"DELEGATE_MAX_MEMORY", delegate.MinMemoryBytes, &c.MaxMemory}, {"DELEGATE_MAX_DISK", delegate.MinDiskBytes, &c.MaxDisk}} {
		if v := getenv(s.name); v != "" {
			n, err := delegate.ParseSize(v)
			if err != nil || n < s.min || n > delegate.MaxSizeBytes {
				bad(s.name, fmt.Sprintf("must be a size like 8G, from %dM to 1T", s.min>>20))
			} else {
				*s.dst = n
			}
		}
	}
	intIn := func(name string, lo, hi int, dst *int) {
		if v := getenv(name); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < lo || n > hi {
				bad(name, fmt.Sprintf("must be a whole number from %d to %d", lo, hi))
			} else {
				*dst = n
			}
		}
	}
	intIn("DELEGATE_MAX_TIMEOUT", 1, delegate.MaxTimeoutSeconds, &c.MaxTimeout)

	// The defaults within the maxima.
	above := func(name, maxName, max string) {
		bad(name, fmt.Sprintf("is above %s (%s): jobs asking for nothing would be refused", maxName, max))
	}
	if c.MaxCPU > 0 && c.Defaults.CPU > c.MaxCPU {
		if getenv("DEFAULT_CPU") == "" {
			c.Defaults.CPU = c.MaxCPU
		} else {
			above("DEFAULT_CPU", "DELEGATE_MAX_CPU", strconv.FormatFloat(c.MaxCPU, 'g', -1, 64))
		}
	}
	for _, s := range []struct {
		name, maxName string
		def           *string
		max           int64
	}{{"DEFAULT_MEMORY", "DELEGATE_MAX_MEMORY", &c.Defaults.Memory, c.MaxMemory}, {"DEFAULT_DISK", "DELEGATE_MAX_DISK", &c.Defaults.Disk, c.MaxDisk}} {
		if n, err := delegate.ParseSize(*s.def); err == nil && s.max > 0 && n > s.max {
			if getenv(s.name) == "" {
				*s.def = sizeString(s.max)
			} else {
				above(s.name, s.maxName, sizeString(s.max))
			}
		}
	}
	if c.Defaults.Timeout > c.MaxTimeout {
		if getenv("DEFAULT_TIMEOUT") == "" {
			c.Defaults.Timeout = c.MaxTimeout
		} else {
			above("DEFAULT_TIMEOUT", "DELEGATE_MAX_TIMEOUT", strconv.Itoa(c.MaxTimeout))
		}
	}
}

// sizeString writes n bytes as a manifest writes sizes: the largest of
// K, M, G, T (powers of 1024) n is a whole number of.
func sizeString(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// MaximaHelp says what a job may ask for at most, for serve --help.
func (c *Config) MaximaHelp() string {
	show := func(set bool, s string) string {
		if !set {
			return "the manifest's bound"
		}
		return s
	}
	return fmt.Sprintf(`A job may ask for at most (a manifest over one gets an error naming it):
  DELEGATE_MAX_CPU      %s
  DELEGATE_MAX_MEMORY   %s
  DELEGATE_MAX_DISK     %s
  DELEGATE_MAX_TIMEOUT  %d seconds
For the local backend they are the host's own cores and memory unless set.`,
		show(c.MaxCPU > 0, strconv.FormatFloat(c.MaxCPU, 'g', -1, 64)+" cores"),
		show(c.MaxMemory > 0, sizeString(c.MaxMemory)), show(c.MaxDisk > 0, sizeString(c.MaxDisk)), c.MaxTimeout)
}

// addDataDirFlag lets --data-dir override the environment.
func (c *Config) addDataDirFlag(fs *pflag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "state directory (env DELEGATE_DATA_DIR)")
}

// addConcurrencyFlag lets --max-concurrent override the environment, for
// the commands that run jobs.
func (c *Config) addConcurrencyFlag(fs *pflag.FlagSet) {
	fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "jobs running at once (env DELEGATE_MAX_CONCURRENT)")
}

// check validates what flags may have changed.
func (c *Config) check() error {
	if c.MaxConcurrent < 1 || c.MaxConcurrent > 1024 {
		return fmt.Errorf("--max-concurrent: must be from 1 to 1024 (got %d)", c.MaxConcurrent)
	}
	if c.DataDir == "" {
		return fmt.Errorf("--data-dir: must not be empty")
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	c.DataDir = abs
	if rule := templateRule(c.Defaults.VMTemplate, c.DataDir); rule != "" {
		return fmt.Errorf("DEFAULT_VM_TEMPLATE=%q: %s", c.Defaults.VMTemplate, rule)
	}
	for _, root := range c.WorkspaceRoots {
		if rule := c.workspaceRootRule(root); rule != "" {
			return fmt.Errorf("DELEGATE_WORKSPACE_ROOTS: %s %s", root, rule)
		}
	}
	return nil
}

// LocalRootfsDir is where the local backend finds the root filesystems a
// job names in vmTemplate.
func (c *Config) LocalRootfsDir() string {
	if c.RootfsDir != "" {
		return c.RootfsDir
	}
	return filepath.Join(c.DataDir, "rootfs")
}

// templateRule says what is wrong with DEFAULT_VM_TEMPLATE, or "". It is
// the operator's, trusted, and may be a path (a name is the backend's to
// check), but never one that would show a job the host's root or
// delegate's own data (other jobs' workspaces, the database): not "/", not
// the data dir, nothing inside it and nothing above it.
func templateRule(tpl, dataDir string) string {
	if !strings.HasPrefix(tpl, "/") {
		return ""
	}
	if filepath.Clean(tpl) != tpl {
		return "must be a clean absolute path (no trailing slash, no . or ..)"
	}
	data, err := filepath.Abs(dataDir)
	if err != nil {
		return ""
	}
	within := func(p, dir string) bool { return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/") }
	related := func(a, b string) bool { return within(a, b) || within(b, a) }
	real := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	if related(tpl, data) || related(real(tpl), real(data)) {
		return fmt.Sprintf("must not be /, the data dir (%s), nor a directory inside or above it: a job would see delegate's own data", data)
	}
	return ""
}

// poolIDRe is a Proxmox pool id (pve-access-control's pve-poolid format:
// nested pools are parent/child).
var poolIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$`) })

// parseNodeMemory reads PROXMOX_NODE_MEMORY: a size for every node
// ("64G"), sizes by node ("pve1=64G,pve2=32G"), or both ("32G,pve1=64G").
func parseNodeMemory(v string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, part := range strings.Split(v, ",") {
		node, size, named := strings.Cut(strings.TrimSpace(part), "=")
		if !named {
			node, size = "", node
		}
		n, err := delegate.ParseSize(size)
		if err != nil || n < 1<<30 || (named && node == "") {
			return nil, errors.New("must be a size of at least 1G for every node (64G), sizes by node (pve1=64G,pve2=32G), or both (32G,pve1=64G)")
		}
		if _, dup := out[node]; dup {
			return nil, fmt.Errorf("%q is given twice", cmp.Or(node, "the size for every node"))
		}
		out[node] = n
	}
	return out, nil
}

// MaxPoolSize bounds PROXMOX_POOL_SIZE.
const MaxPoolSize = 100

// loadPool reads PROXMOX_POOL_*: the pool's shape defaults to the job
// defaults (DEFAULT_CPU, DEFAULT_MEMORY, DEFAULT_DISK), so that jobs that
// ask for nothing take its VMs.
func loadPool(getenv func(string) string, d delegate.Defaults, bad func(name, rule string)) PoolConfig {
	p := PoolConfig{CPU: d.CPU}
	p.MemoryBytes, _ = delegate.ParseSize(d.Memory)
	p.DiskBytes, _ = delegate.ParseSize(d.Disk)
	if v := getenv("PROXMOX_POOL_SIZE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxPoolSize {
			bad("PROXMOX_POOL_SIZE", fmt.Sprintf("must be a whole number from 0 (no pool) to %d", MaxPoolSize))
		} else {
			p.Size = n
		}
	}
	if v := getenv("PROXMOX_POOL_CPU"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0.01 || n > delegate.MaxCPU {
			bad("PROXMOX_POOL_CPU", fmt.Sprintf("must be a number of cores from 0.01 to %d", delegate.MaxCPU))
		} else {
			p.CPU = n
		}
	}
	if v := getenv("PROXMOX_POOL_NETWORK"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad("PROXMOX_POOL_NETWORK", "must be true (the pool's VMs keep a NIC, for forks' files over HTTP) or false")
		} else {
			p.Network = b
		}
	}
	for _, sz := range []struct {
		name string
		min  int64
		dst  *int64
	}{{"PROXMOX_POOL_MEMORY", delegate.MinMemoryBytes, &p.MemoryBytes}, {"PROXMOX_POOL_DISK", delegate.MinDiskBytes, &p.DiskBytes}} {
		if v := getenv(sz.name); v != "" {
			n, err := delegate.ParseSize(v)
			if err != nil || n < sz.min {
				bad(sz.name, fmt.Sprintf("must be a size like 512M or 2G, at least %dM", sz.min>>20))
			} else {
				*sz.dst = n
			}
		}
	}
	return p
}
