package cli

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
)

// Defaults of the workspace settings (the figures).
const (
	defaultWorkspaceMaxBytes = 256 << 20
	defaultWorkspaceMaxFiles = 50_000
	defaultCacheMax          = 10 << 30
)

// loadWorkspaces reads DELEGATE_WORKSPACE_* and DELEGATE_CACHE_MAX.
func (c *Config) loadWorkspaces(getenv func(string) string, bad func(name, rule string)) {
	if v := getenv("DELEGATE_WORKSPACE_ROOTS"); v != "" {
		for _, root := range filepath.SplitList(v) {
			if root == "" {
				continue
			}
			if rule := c.workspaceRootRule(root); rule != "" {
				bad("DELEGATE_WORKSPACE_ROOTS", root+" "+rule)
				continue
			}
			c.WorkspaceRoots = append(c.WorkspaceRoots, root)
		}
	}
	for _, s := range []struct {
		name     string
		min, max int64
		dst      *int64
	}{
		{"DELEGATE_WORKSPACE_MAX_BYTES", 1 << 20, delegate.MaxSizeBytes, &c.WorkspaceMaxBytes},
		{"DELEGATE_CACHE_MAX", 1 << 20, delegate.MaxSizeBytes, &c.CacheMaxBytes},
	} {
		if v := getenv(s.name); v != "" {
			n, err := delegate.ParseSize(v)
			if err != nil || n < s.min || n > s.max {
				bad(s.name, "must be a size like 256M or 10G, from 1M to 1T")
			} else {
				*s.dst = n
			}
		}
	}
	if v := getenv("DELEGATE_WORKSPACE_MAX_FILES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10_000_000 {
			bad("DELEGATE_WORKSPACE_MAX_FILES", "must be a whole number from 1 to 10000000")
		} else {
			c.WorkspaceMaxFiles = n
		}
	}
	if v := getenv("DELEGATE_WORKSPACE_GIT_ALLOW"); v != "" {
		for _, s := range strings.Split(v, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(s))
			if err != nil {
				bad("DELEGATE_WORKSPACE_GIT_ALLOW", fmt.Sprintf("%q is not an address range like 10.1.0.0/16 or 192.0.2.7/32", s))
				continue
			}
			c.WorkspaceGitAllow = append(c.WorkspaceGitAllow, p.Masked())
		}
	}
}

// workspaceRootRule says what is wrong with an allowed root, or "": it
// must be a clean absolute path, not /, and hold none of delegate's own
// files — the data dir (other jobs' workspaces, the database), the
// secrets file, the token file — nor lie inside the data dir, by its path
// or by the path its links lead to.
func (c *Config) workspaceRootRule(root string) string {
	if !filepath.IsAbs(root) || filepath.Clean(root) != root {
		return "must be a clean absolute path (no trailing slash, no . or ..)"
	}
	if root == "/" {
		return "must not be /: a job could import every file of the machine"
	}
	within := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	real := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	data, err := filepath.Abs(c.DataDir)
	if err != nil {
		data = c.DataDir
	}
	for _, r := range []string{root, real(root)} {
		if data != "" && (within(data, r) || within(real(data), r) || within(r, data) || within(r, real(data))) {
			return fmt.Sprintf("must neither hold nor lie in the data dir (%s): a job would import delegate's own data", data)
		}
		for _, f := range []struct{ what, path string }{{"the secrets file (DELEGATE_SECRETS_FILE)", c.SecretsFile}, {"the token file (DELEGATE_HTTP_TOKEN_FILE)", c.HTTPTokenFile}} {
			if f.path == "" {
				continue
			}
			p, _ := filepath.Abs(f.path)
			if within(p, r) || within(real(p), r) {
				return fmt.Sprintf("must not hold %s, %s", f.what, p)
			}
		}
	}
	return ""
}
