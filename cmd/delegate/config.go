package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/pve"
)

// config is everything the environment and flags decide. Environment names
// follow the seed where it had one; flags override the environment.
type config struct {
	DataDir         string
	Backend         string
	MaxConcurrent   int
	OutputLimit     int64
	CleanupInterval time.Duration
	Defaults        delegate.Defaults
	LogLevel        slog.Level

	CallbackHost       string
	CallbackPort       int
	CallbackPublicURL  string
	HeartbeatThreshold time.Duration
	SecretsFile        string

	// Proxmox (DELEGATE_BACKEND=proxmox).
	Proxmox       pve.Config
	ProxmoxBridge string
	ProxmoxVLAN   int
	// ProxmoxAgentTimeout bounds the wait for a new VM's guest agent.
	ProxmoxAgentTimeout time.Duration
}

// envVar documents one setting; the README's table is written from these.
type envVar struct {
	name, def, help string
}

var envVars = []envVar{
	{"DELEGATE_DATA_DIR", "$XDG_STATE_HOME/delegate or ~/.local/state/delegate", "state directory: jobs.db, sandboxes"},
	{"DELEGATE_BACKEND", "local", "sandbox backend: local or proxmox"},
	{"DELEGATE_MAX_CONCURRENT", "4", "jobs running at once; more wait as pending"},
	{"DELEGATE_OUTPUT_LIMIT", "4M", "output kept per job (the rest is counted, not kept)"},
	{"DELEGATE_LOG_LEVEL", "info", "debug, info, warn or error (logs go to stderr)"},
	{"DEFAULT_TIMEOUT", "3600", "job timeout in seconds when the manifest has none (1..86400)"},
	{"DEFAULT_CPU", "2", "cpu cores per job"},
	{"DEFAULT_MEMORY", "2G", "memory per job"},
	{"DEFAULT_DISK", "10G", "size of /workspace per job"},
	{"DEFAULT_VM_TEMPLATE", "(host view)", "default vmTemplate (local: a rootfs directory)"},
	{"CLEANUP_INTERVAL_SECONDS", "30", "how often orphaned sandboxes are looked for"},
	{"CALLBACK_HOST", "127.0.0.1", "address the callback server binds"},
	{"CALLBACK_PORT", "8765", "port of the callback server (0: none)"},
	{"CALLBACK_PUBLIC_URL", "http://CALLBACK_HOST:CALLBACK_PORT", "callback base URL handed to sandboxes"},
	{"HEARTBEAT_THRESHOLD_SECONDS", "120", "a running job silent this long fails with lost heartbeat"},
	{"DELEGATE_SECRETS_FILE", "", "file of NAME=value secret lines (mode 0600)"},
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "delegate")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "delegate")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("delegate-%d", os.Getuid()))
}

// loadConfig reads the environment. Every error names the variable.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DataDir:         defaultDataDir(),
		Backend:         "local",
		MaxConcurrent:   4,
		OutputLimit:     4 << 20,
		CleanupInterval: 30 * time.Second,
		Defaults:        delegate.Defaults{Timeout: 3600, CPU: 2, Memory: "2G", Disk: "10G"},
		LogLevel:        slog.LevelInfo,

		CallbackHost:       "127.0.0.1",
		CallbackPort:       8765,
		HeartbeatThreshold: 120 * time.Second,
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
	if v := getenv("DELEGATE_OUTPUT_LIMIT"); v != "" {
		n, err := delegate.ParseSize(v)
		if err != nil || n < 1024 || n > 1<<30 {
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
	cleanup := 30
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
	heartbeat := 120
	intIn("HEARTBEAT_THRESHOLD_SECONDS", 1, 86400, &heartbeat)
	c.HeartbeatThreshold = time.Duration(heartbeat) * time.Second
	str("DELEGATE_SECRETS_FILE", &c.SecretsFile)
	if c.Backend == "proxmox" {
		pc, err := pve.ConfigFromEnv(getenv)
		if err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), "invalid Proxmox configuration:\n  "))
		}
		c.Proxmox = pc
		str("PROXMOX_JOB_BRIDGE", &c.ProxmoxBridge)
		intIn("PROXMOX_JOB_VLAN", 0, 4094, &c.ProxmoxVLAN)
		agent := 300
		intIn("PROXMOX_AGENT_TIMEOUT", 1, 3600, &agent)
		c.ProxmoxAgentTimeout = time.Duration(agent) * time.Second
		if c.Defaults.VMTemplate == "" {
			errs = append(errs, "DEFAULT_VM_TEMPLATE: must be set for the proxmox backend (a template's name or vmid)")
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("invalid configuration:\n  %s", strings.Join(errs, "\n  "))
	}
	return c, nil
}

// addFlags lets flags override the environment for the settings that make
// sense per command.
func (c *config) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "state directory (env DELEGATE_DATA_DIR)")
	fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "jobs running at once (env DELEGATE_MAX_CONCURRENT)")
}

// check validates what flags may have changed.
func (c *config) check() error {
	if c.MaxConcurrent < 1 || c.MaxConcurrent > 1024 {
		return fmt.Errorf("-max-concurrent: must be from 1 to 1024 (got %d)", c.MaxConcurrent)
	}
	if c.DataDir == "" {
		return fmt.Errorf("-data-dir: must not be empty")
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("-data-dir: %w", err)
	}
	c.DataDir = abs
	return nil
}
