package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr []string // every variable the error must name
		check   func(t *testing.T, c Config)
	}{
		// $HOME as getenv has it: a command handed to a server is read
		// with its client's environment.
		{"defaults", map[string]string{"HOME": "/home/u"}, nil, func(t *testing.T, c Config) {
			if c.Defaults.Timeout != 3600 || c.Defaults.CPU != 2 || c.Defaults.Memory != "2G" || c.Defaults.Disk != "10G" ||
				c.CleanupInterval != 30*time.Second || c.MaxConcurrent != 4 || c.OutputLimit != 4<<20 || c.Backend != "local" {
				t.Errorf("defaults: %+v", c)
			}
			if c.DataDir != "/home/u/.local/state/delegate" {
				t.Errorf("data dir %q", c.DataDir)
			}
		}},
		{"no home", map[string]string{"TMPDIR": "/scratch"}, nil, func(t *testing.T, c Config) {
			if want := fmt.Sprintf("/scratch/delegate-%d", os.Getuid()); c.DataDir != want {
				t.Errorf("data dir %q; want %q", c.DataDir, want)
			}
		}},
		{"all set", map[string]string{
			"DEFAULT_TIMEOUT": "60", "DEFAULT_CPU": "0.5", "DEFAULT_MEMORY": "512M", "DEFAULT_DISK": "1G",
			"CLEANUP_INTERVAL_SECONDS": "5", "DEFAULT_VM_TEMPLATE": "/srv/rootfs", "DELEGATE_DATA_DIR": "/var/lib/delegate",
			"DELEGATE_MAX_CONCURRENT": "9", "DELEGATE_OUTPUT_LIMIT": "1M", "DELEGATE_LOG_LEVEL": "debug",
		}, nil, func(t *testing.T, c Config) {
			if c.Defaults.Timeout != 60 || c.Defaults.CPU != 0.5 || c.Defaults.Memory != "512M" || c.Defaults.Disk != "1G" ||
				c.CleanupInterval != 5*time.Second || c.Defaults.VMTemplate != "/srv/rootfs" || c.DataDir != "/var/lib/delegate" ||
				c.MaxConcurrent != 9 || c.OutputLimit != 1<<20 || c.LogLevel.String() != "DEBUG" {
				t.Errorf("parsed: %+v", c)
			}
		}},
		{"bad values", map[string]string{
			"DEFAULT_TIMEOUT": "0", "DEFAULT_CPU": "lots", "DEFAULT_MEMORY": "1M", "DEFAULT_DISK": "big",
			"CLEANUP_INTERVAL_SECONDS": "-3", "DELEGATE_MAX_CONCURRENT": "0", "DELEGATE_OUTPUT_LIMIT": "2G",
			"DELEGATE_LOG_LEVEL": "loud", "DELEGATE_BACKEND": "docker",
		}, []string{"DEFAULT_TIMEOUT", "DEFAULT_CPU", "DEFAULT_MEMORY", "DEFAULT_DISK", "CLEANUP_INTERVAL_SECONDS",
			"DELEGATE_MAX_CONCURRENT", "DELEGATE_OUTPUT_LIMIT", "DELEGATE_LOG_LEVEL", "DELEGATE_BACKEND"}, nil},
		{"kept sandboxes", map[string]string{
			"DELEGATE_MAX_SANDBOXES": "3", "DELEGATE_SANDBOX_IDLE": "90s", "DELEGATE_SANDBOX_PAUSE": "2h", "DELEGATE_SANDBOX_LIFETIME": "72h",
		}, nil, func(t *testing.T, c Config) {
			if c.MaxSandboxes != 3 || c.SandboxIdle != 90*time.Second || c.SandboxPause != 2*time.Hour || c.SandboxLifetime != 72*time.Hour {
				t.Errorf("parsed: %d %s %s %s", c.MaxSandboxes, c.SandboxIdle, c.SandboxPause, c.SandboxLifetime)
			}
		}},
		{"kept sandboxes default", nil, nil, func(t *testing.T, c Config) {
			if c.MaxSandboxes != 8 || c.SandboxIdle != 30*time.Minute || c.SandboxPause != 24*time.Hour || c.SandboxLifetime != 24*time.Hour {
				t.Errorf("defaults: %d %s %s %s", c.MaxSandboxes, c.SandboxIdle, c.SandboxPause, c.SandboxLifetime)
			}
		}},
		{"kept sandboxes bad", map[string]string{
			"DELEGATE_MAX_SANDBOXES": "0", "DELEGATE_SANDBOX_IDLE": "30", "DELEGATE_SANDBOX_PAUSE": "500ms", "DELEGATE_SANDBOX_LIFETIME": "1000h",
		}, []string{"DELEGATE_MAX_SANDBOXES", "DELEGATE_SANDBOX_IDLE", "DELEGATE_SANDBOX_PAUSE", "DELEGATE_SANDBOX_LIFETIME"}, nil},
		{"timeout too long", map[string]string{"DEFAULT_TIMEOUT": "86401"}, []string{"DEFAULT_TIMEOUT"}, nil},
		{"disk quota", map[string]string{"DELEGATE_QUOTA_DISK": "5G"}, nil, func(t *testing.T, c Config) {
			if c.Quotas.DiskBytes != 5<<30 {
				t.Errorf("DELEGATE_QUOTA_DISK=5G: %d", c.Quotas.DiskBytes)
			}
		}},
		{"disk quota default", nil, nil, func(t *testing.T, c Config) {
			if c.Quotas.DiskBytes != 20<<30 {
				t.Errorf("the default disk quota: %d", c.Quotas.DiskBytes)
			}
		}},
		{"disk quota bad", map[string]string{"DELEGATE_QUOTA_DISK": "lots"}, []string{"DELEGATE_QUOTA_DISK", "a size like 20G"}, nil},
		{"egress limits", map[string]string{
			"DELEGATE_EGRESS_MAX_CONNS": "64", "DELEGATE_EGRESS_CONN_RATE": "10", "DELEGATE_EGRESS_IDLE_TIMEOUT": "90s",
		}, nil, func(t *testing.T, c Config) {
			if c.EgressMaxConns != 64 || c.EgressConnRate != 10 || c.EgressIdleTimeout != 90*time.Second {
				t.Errorf("parsed: %d %d %s", c.EgressMaxConns, c.EgressConnRate, c.EgressIdleTimeout)
			}
		}},
		{"egress limits bad", map[string]string{
			"DELEGATE_EGRESS_MAX_CONNS": "2", "DELEGATE_EGRESS_CONN_RATE": "0", "DELEGATE_EGRESS_IDLE_TIMEOUT": "5",
		}, []string{"DELEGATE_EGRESS_MAX_CONNS", "DELEGATE_EGRESS_CONN_RATE", "DELEGATE_EGRESS_IDLE_TIMEOUT"}, nil},
		{"workspaces", map[string]string{
			"DELEGATE_DATA_DIR": "/var/lib/delegate", "DELEGATE_WORKSPACE_ROOTS": "/home/ann/src:/srv/projects",
			"DELEGATE_WORKSPACE_MAX_BYTES": "64M", "DELEGATE_WORKSPACE_MAX_FILES": "1000", "DELEGATE_WORKSPACE_GIT_ALLOW": "10.1.0.0/16, 192.0.2.7/32",
			"DELEGATE_CACHE_MAX": "2G",
		}, nil, func(t *testing.T, c Config) {
			if fmt.Sprint(c.WorkspaceRoots) != "[/home/ann/src /srv/projects]" || c.WorkspaceMaxBytes != 64<<20 || c.WorkspaceMaxFiles != 1000 ||
				fmt.Sprint(c.WorkspaceGitAllow) != "[10.1.0.0/16 192.0.2.7/32]" || c.CacheMaxBytes != 2<<30 {
				t.Errorf("parsed: %v %d %d %v %d", c.WorkspaceRoots, c.WorkspaceMaxBytes, c.WorkspaceMaxFiles, c.WorkspaceGitAllow, c.CacheMaxBytes)
			}
		}},
		{"workspaces default", nil, nil, func(t *testing.T, c Config) {
			if c.WorkspaceRoots != nil || c.WorkspaceMaxBytes != 256<<20 || c.WorkspaceMaxFiles != 50000 || c.CacheMaxBytes != 10<<30 {
				t.Errorf("defaults: %v %d %d %d", c.WorkspaceRoots, c.WorkspaceMaxBytes, c.WorkspaceMaxFiles, c.CacheMaxBytes)
			}
		}},
		{"workspace root /", map[string]string{"DELEGATE_WORKSPACE_ROOTS": "/"}, []string{"DELEGATE_WORKSPACE_ROOTS", "must not be /"}, nil},
		{"workspace root holding the data dir", map[string]string{"DELEGATE_DATA_DIR": "/var/lib/delegate", "DELEGATE_WORKSPACE_ROOTS": "/var/lib"},
			[]string{"DELEGATE_WORKSPACE_ROOTS", "/var/lib must neither hold nor lie in the data dir"}, nil},
		{"workspace root in the data dir", map[string]string{"DELEGATE_DATA_DIR": "/var/lib/delegate", "DELEGATE_WORKSPACE_ROOTS": "/var/lib/delegate/sandboxes"},
			[]string{"DELEGATE_WORKSPACE_ROOTS", "lie in the data dir"}, nil},
		{"workspace root holding the secrets", map[string]string{"DELEGATE_SECRETS_FILE": "/etc/delegate/secrets", "DELEGATE_WORKSPACE_ROOTS": "/etc"},
			[]string{"DELEGATE_WORKSPACE_ROOTS", "must not hold the secrets file"}, nil},
		{"workspace root holding the token", map[string]string{"DELEGATE_HTTP_TOKEN_FILE": "/srv/token", "DELEGATE_WORKSPACE_ROOTS": "/srv"},
			[]string{"DELEGATE_WORKSPACE_ROOTS", "must not hold the token file"}, nil},
		{"workspace bad values", map[string]string{"DELEGATE_WORKSPACE_ROOTS": "src", "DELEGATE_WORKSPACE_MAX_BYTES": "lots",
			"DELEGATE_WORKSPACE_MAX_FILES": "0", "DELEGATE_WORKSPACE_GIT_ALLOW": "lan", "DELEGATE_CACHE_MAX": "2T"},
			[]string{"DELEGATE_WORKSPACE_ROOTS", "clean absolute path", "DELEGATE_WORKSPACE_MAX_BYTES", "DELEGATE_WORKSPACE_MAX_FILES",
				"DELEGATE_WORKSPACE_GIT_ALLOW", "DELEGATE_CACHE_MAX"}, nil},
		{"rootfs dir", map[string]string{"DELEGATE_DATA_DIR": "/var/lib/delegate"}, nil, func(t *testing.T, c Config) {
			if got := c.LocalRootfsDir(); got != "/var/lib/delegate/rootfs" {
				t.Errorf("default rootfs dir %q", got)
			}
			c.RootfsDir = "/srv/rootfs"
			if got := c.LocalRootfsDir(); got != "/srv/rootfs" {
				t.Errorf("rootfs dir %q", got)
			}
		}},
		{"rootfs dir set", map[string]string{"DELEGATE_ROOTFS_DIR": "/srv/rootfs"}, nil, func(t *testing.T, c Config) {
			if c.LocalRootfsDir() != "/srv/rootfs" {
				t.Errorf("rootfs dir %q", c.LocalRootfsDir())
			}
		}},
		{"template by name", map[string]string{"DEFAULT_VM_TEMPLATE": "bookworm"}, nil, func(t *testing.T, c Config) {
			if c.Defaults.VMTemplate != "bookworm" {
				t.Errorf("template %q", c.Defaults.VMTemplate)
			}
		}},
		{"relative rootfs dir", map[string]string{"DELEGATE_ROOTFS_DIR": "rootfs"}, []string{"DELEGATE_ROOTFS_DIR"}, nil},
		// The operator's template may be a path, but never one that shows
		// a job the host or delegate's own data.
		{"template is the host's root", map[string]string{"DEFAULT_VM_TEMPLATE": "/"}, []string{"DEFAULT_VM_TEMPLATE"}, nil},
		{"template is the data dir", map[string]string{"DEFAULT_VM_TEMPLATE": "/var/lib/delegate", "DELEGATE_DATA_DIR": "/var/lib/delegate"},
			[]string{"DEFAULT_VM_TEMPLATE"}, nil},
		{"template in the data dir", map[string]string{"DEFAULT_VM_TEMPLATE": "/var/lib/delegate/sandboxes/sb-0123456789ab/workspace",
			"DELEGATE_DATA_DIR": "/var/lib/delegate"}, []string{"DEFAULT_VM_TEMPLATE"}, nil},
		{"template above the data dir", map[string]string{"DEFAULT_VM_TEMPLATE": "/var/lib", "DELEGATE_DATA_DIR": "/var/lib/delegate"},
			[]string{"DEFAULT_VM_TEMPLATE"}, nil},
		{"template not clean", map[string]string{"DEFAULT_VM_TEMPLATE": "/srv/rootfs/../.."}, []string{"DEFAULT_VM_TEMPLATE"}, nil},
		// The maxima: the host's own (8 cores, 32 GiB here) unless set.
		{"maxima from the host", nil, nil, func(t *testing.T, c Config) {
			if c.MaxCPU != 8 || c.MaxMemory != 32<<30 || c.MaxDisk != 32<<30 || c.MaxTimeout != 86400 {
				t.Errorf("maxima %v %v %v %v", c.MaxCPU, c.MaxMemory, c.MaxDisk, c.MaxTimeout)
			}
		}},
		{"maxima set", map[string]string{"DELEGATE_MAX_CPU": "4", "DELEGATE_MAX_MEMORY": "8G", "DELEGATE_MAX_DISK": "20G", "DELEGATE_MAX_TIMEOUT": "7200"}, nil,
			func(t *testing.T, c Config) {
				if c.MaxCPU != 4 || c.MaxMemory != 8<<30 || c.MaxDisk != 20<<30 || c.MaxTimeout != 7200 {
					t.Errorf("maxima %v %v %v %v", c.MaxCPU, c.MaxMemory, c.MaxDisk, c.MaxTimeout)
				}
			}},
		{"maxima under the defaults left unset", map[string]string{"DELEGATE_MAX_CPU": "1", "DELEGATE_MAX_MEMORY": "1G", "DELEGATE_MAX_DISK": "512M", "DELEGATE_MAX_TIMEOUT": "60"}, nil,
			func(t *testing.T, c Config) {
				if d := c.Defaults; d.CPU != 1 || d.Memory != "1G" || d.Disk != "512M" || d.Timeout != 60 {
					t.Errorf("defaults %+v, want them down to the maxima", d)
				}
			}},
		{"defaults set above the maxima", map[string]string{"DELEGATE_MAX_CPU": "1", "DEFAULT_CPU": "2", "DELEGATE_MAX_MEMORY": "1G", "DEFAULT_MEMORY": "2G",
			"DELEGATE_MAX_DISK": "1G", "DEFAULT_DISK": "2G", "DELEGATE_MAX_TIMEOUT": "60", "DEFAULT_TIMEOUT": "61"},
			[]string{"DEFAULT_CPU", "DEFAULT_MEMORY", "DEFAULT_DISK", "DEFAULT_TIMEOUT"}, nil},
		{"bad maxima", map[string]string{"DELEGATE_MAX_CPU": "129", "DELEGATE_MAX_MEMORY": "2T", "DELEGATE_MAX_DISK": "lots", "DELEGATE_MAX_TIMEOUT": "0"},
			[]string{"DELEGATE_MAX_CPU", "DELEGATE_MAX_MEMORY", "DELEGATE_MAX_DISK", "DELEGATE_MAX_TIMEOUT"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(func(k string) string { return tc.env[k] }, hostInfo{CPUs: 8, MemoryBytes: 32 << 30})
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, c)
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, name := range tc.wantErr {
				// A variable is named as NAME=value; other words (a
				// rule) as they are.
				named := strings.Contains(err.Error(), name+"=")
				if strings.ToUpper(name) != name {
					named = strings.Contains(err.Error(), name)
				}
				if !named {
					t.Errorf("error does not name %s: %v", name, err)
				}
			}
		})
	}
}

func TestFlagsOverrideEnv(t *testing.T) {
	c, err := LoadConfig(func(k string) string {
		return map[string]string{"DELEGATE_DATA_DIR": "/from/env", "DELEGATE_MAX_CONCURRENT": "2"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	c.addDataDirFlag(fs)
	c.addConcurrencyFlag(fs)
	if err := fs.Parse([]string{"--data-dir", "/from/flag", "--max-concurrent", "7"}); err != nil {
		t.Fatal(err)
	}
	if err := c.check(); err != nil || c.DataDir != "/from/flag" || c.MaxConcurrent != 7 {
		t.Fatalf("flags did not override: %+v %v", c, err)
	}
	c.MaxConcurrent = 0
	if err := c.check(); err == nil || !strings.Contains(err.Error(), "-max-concurrent") {
		t.Fatalf("bad flag value: %v", err)
	}
}

// TestTemplateAfterDataDirFlag: --data-dir may move the data dir under the
// default template; check sees it, naming the variable.
func TestTemplateAfterDataDirFlag(t *testing.T) {
	c, err := LoadConfig(func(k string) string {
		return map[string]string{"DEFAULT_VM_TEMPLATE": "/srv/rootfs", "DELEGATE_DATA_DIR": "/var/lib/delegate"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	c.DataDir = "/srv/rootfs/state"
	if err := c.check(); err == nil || !strings.Contains(err.Error(), "DEFAULT_VM_TEMPLATE") {
		t.Fatalf("check: %v", err)
	}
	// Through a symbolic link too.
	dir := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if rule := templateRule(filepath.Join(dir, "link"), filepath.Join(dir, "data")); rule == "" {
		t.Fatal("a link to a directory above the data dir was accepted")
	}
	if rule := templateRule("/srv/rootfs", "/srv/rootfs-data"); rule != "" {
		t.Fatalf("a sibling with a common prefix was refused: %s", rule)
	}
}

func TestParseNodeMemory(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]int64
	}{
		{"64G", map[string]int64{"": 64 << 30}},
		{"pve1=64G,pve2=32G", map[string]int64{"pve1": 64 << 30, "pve2": 32 << 30}},
		{"32G, pve1=64G", map[string]int64{"": 32 << 30, "pve1": 64 << 30}},
		{"512M", nil},
		{"pve1=", nil},
		{"=4G", nil},
		{"4G,8G", nil},
		{"pve1=4G,pve1=8G", nil},
		{"lots", nil},
	}
	for _, tc := range tests {
		got, err := parseNodeMemory(tc.in)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q accepted: %v", tc.in, got)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v", tc.in, got, err)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %v", tc.in, got)
			}
		}
	}
	// Through the environment, the error names the variable.
	_, err := LoadConfig(func(k string) string {
		return map[string]string{"DELEGATE_BACKEND": "proxmox", "PROXMOX_HOST": "pve", "PROXMOX_USER": "u@pve", "PROXMOX_TOKEN_NAME": "t",
			"PROXMOX_TOKEN_VALUE": "v", "DEFAULT_VM_TEMPLATE": "tpl", "PROXMOX_NODE_MEMORY": "1M"}[k]
	})
	if err == nil || !strings.Contains(err.Error(), "PROXMOX_NODE_MEMORY=") {
		t.Errorf("err = %v", err)
	}
}

// TestToolsetsConfig: DELEGATE_TOOLSETS (default jobs) and --toolsets,
// PROXMOX_ALLOW_ELEVATED; unknown names and a proxmox toolset without the
// PROXMOX_* token fail, naming the variables.
func TestToolsetsConfig(t *testing.T) {
	token := map[string]string{"PROXMOX_HOST": "pve.example", "PROXMOX_USER": "delegate@pve", "PROXMOX_TOKEN_NAME": "jobs",
		"PROXMOX_TOKEN_VALUE": "secret"}
	env := func(extra map[string]string, withToken bool) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			if withToken {
				return token[k]
			}
			return ""
		}
	}
	tests := []struct {
		name      string
		env       map[string]string
		token     bool
		want      []string // the toolsets
		elevated  bool
		wantError []string // what the error must name
	}{
		{"default", nil, false, []string{"jobs"}, false, nil},
		{"both, elevated", map[string]string{"DELEGATE_TOOLSETS": "jobs, proxmox", "PROXMOX_ALLOW_ELEVATED": "true"}, true,
			[]string{"jobs", "proxmox"}, true, nil},
		{"proxmox alone, twice", map[string]string{"DELEGATE_TOOLSETS": "proxmox,proxmox"}, true, []string{"proxmox"}, false, nil},
		{"unknown", map[string]string{"DELEGATE_TOOLSETS": "jobs,docker"}, true, nil, false,
			[]string{`DELEGATE_TOOLSETS="jobs,docker"`, `unknown toolset "docker"`, "jobs, proxmox"}},
		{"empty list", map[string]string{"DELEGATE_TOOLSETS": ","}, false, nil, false, []string{"DELEGATE_TOOLSETS", "at least one"}},
		{"proxmox without a token", map[string]string{"DELEGATE_TOOLSETS": "proxmox"}, false, nil, false,
			[]string{"DELEGATE_TOOLSETS includes proxmox", "PROXMOX_HOST: must be set", "PROXMOX_TOKEN_VALUE: must be set"}},
		{"bad elevated", map[string]string{"PROXMOX_ALLOW_ELEVATED": "yes please"}, false, nil, false, []string{"PROXMOX_ALLOW_ELEVATED=", "true or false"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(env(tc.env, tc.token))
			if tc.wantError != nil {
				if err == nil {
					t.Fatal("accepted")
				}
				for _, w := range tc.wantError {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not say %q: %v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Toolsets, tc.want) || c.ProxmoxAllowElevated != tc.elevated {
				t.Errorf("toolsets %v elevated %v", c.Toolsets, c.ProxmoxAllowElevated)
			}
		})
	}

	// --toolsets overrides the environment, with the same rules.
	c, err := LoadConfig(env(nil, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UseToolsets("proxmox"); err == nil || !strings.Contains(err.Error(), "PROXMOX_HOST: must be set") {
		t.Errorf("--toolsets proxmox without a token: %v", err)
	}
	if err := c.UseToolsets("jobs,nope"); err == nil || !strings.Contains(err.Error(), "--toolsets (env DELEGATE_TOOLSETS)") {
		t.Errorf("--toolsets nope: %v", err)
	}
	c, _ = LoadConfig(env(nil, true))
	if err := c.UseToolsets("proxmox"); err != nil || !c.HasToolset("proxmox") || c.HasToolset("jobs") || c.Proxmox.Host != "pve.example" {
		t.Errorf("--toolsets proxmox: %v %v %+v", err, c.Toolsets, c.Proxmox)
	}
}

func TestPoolConfig(t *testing.T) {
	base := map[string]string{"DELEGATE_BACKEND": "proxmox", "PROXMOX_HOST": "pve", "PROXMOX_USER": "u@pve", "PROXMOX_TOKEN_NAME": "jobs",
		"PROXMOX_TOKEN_VALUE": "v", "DEFAULT_VM_TEMPLATE": "tpl"}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr []string
		want    PoolConfig
	}{
		// The pool's shape is the job defaults' unless set.
		{"defaults", nil, nil, PoolConfig{Size: 0, CPU: 2, MemoryBytes: 2 << 30, DiskBytes: 10 << 30}},
		{"job defaults", map[string]string{"PROXMOX_POOL_SIZE": "2", "DEFAULT_CPU": "1", "DEFAULT_MEMORY": "512M", "DEFAULT_DISK": "4G"}, nil,
			PoolConfig{Size: 2, CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 4 << 30}},
		{"its own shape", map[string]string{"PROXMOX_POOL_SIZE": "3", "PROXMOX_POOL_CPU": "0.5", "PROXMOX_POOL_MEMORY": "1G", "PROXMOX_POOL_DISK": "8G"}, nil,
			PoolConfig{Size: 3, CPU: 0.5, MemoryBytes: 1 << 30, DiskBytes: 8 << 30}},
		{"bad", map[string]string{"PROXMOX_POOL_SIZE": "-1", "PROXMOX_POOL_CPU": "0", "PROXMOX_POOL_MEMORY": "1M", "PROXMOX_POOL_DISK": "lots"},
			[]string{"PROXMOX_POOL_SIZE", "PROXMOX_POOL_CPU", "PROXMOX_POOL_MEMORY", "PROXMOX_POOL_DISK"}, PoolConfig{}},
		{"too big", map[string]string{"PROXMOX_POOL_SIZE": "101"}, []string{"PROXMOX_POOL_SIZE"}, PoolConfig{}},
		{"with a NIC", map[string]string{"PROXMOX_POOL_SIZE": "2", "PROXMOX_POOL_NETWORK": "true"}, nil,
			PoolConfig{Size: 2, CPU: 2, MemoryBytes: 2 << 30, DiskBytes: 10 << 30, Network: true}},
		{"not a bool", map[string]string{"PROXMOX_POOL_NETWORK": "sometimes"}, []string{"PROXMOX_POOL_NETWORK"}, PoolConfig{}},
		{"not a number", map[string]string{"PROXMOX_POOL_SIZE": "two"}, []string{"PROXMOX_POOL_SIZE"}, PoolConfig{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(func(k string) string {
				if v, ok := tc.env[k]; ok {
					return v
				}
				return base[k]
			})
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if c.ProxmoxPool != tc.want {
					t.Fatalf("%+v, want %+v", c.ProxmoxPool, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, name := range tc.wantErr {
				// A variable is named as NAME=value; other words (a
				// rule) as they are.
				named := strings.Contains(err.Error(), name+"=")
				if strings.ToUpper(name) != name {
					named = strings.Contains(err.Error(), name)
				}
				if !named {
					t.Errorf("error does not name %s: %v", name, err)
				}
			}
		})
	}
}
