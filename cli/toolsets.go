package cli

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate/pve"
)

// Toolsets are the groups of MCP tools `delegate serve` can offer:
// "jobs", today's job tools, "proxmox", the Proxmox admin tools
// (package pvetools), and "checkpoints", with jobs: sandbox_checkpoint
// and open_sandbox's from and count (forks). DefaultToolsets is jobs
// alone, so a job-running agent's context stays small.
var Toolsets = []string{"jobs", "proxmox", "checkpoints"}

// DefaultToolsets is DELEGATE_TOOLSETS' default.
const DefaultToolsets = "jobs"

// parseToolsets reads a comma-separated list of toolsets.
func parseToolsets(v string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(Toolsets, name) {
			return nil, fmt.Errorf("unknown toolset %q: must be a comma-separated list of %s", name, strings.Join(Toolsets, ", "))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("must name at least one toolset of %s", strings.Join(Toolsets, ", "))
	}
	return out, nil
}

// HasToolset reports whether serve offers the tools of a toolset.
func (c *Config) HasToolset(name string) bool { return slices.Contains(c.Toolsets, name) }

// loadToolsets reads DELEGATE_TOOLSETS and PROXMOX_ALLOW_ELEVATED. The
// proxmox toolset needs the PROXMOX_* token even with the local backend:
// its variables are read then too (their error is kept for a --toolsets
// flag that asks for it).
func (c *Config) loadToolsets(getenv func(string) string, bad func(name, rule string), errs *[]string) {
	c.Toolsets = []string{DefaultToolsets}
	if v := getenv("DELEGATE_TOOLSETS"); v != "" {
		sets, err := parseToolsets(v)
		if err != nil {
			bad("DELEGATE_TOOLSETS", err.Error())
		} else {
			c.Toolsets = sets
		}
	}
	if v := getenv("PROXMOX_ALLOW_ELEVATED"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad("PROXMOX_ALLOW_ELEVATED", "must be true or false")
		}
		c.ProxmoxAllowElevated = b
	}
	if c.Backend != "proxmox" {
		c.Proxmox, c.proxmoxErr = pve.ConfigFromEnv(getenv)
		if c.proxmoxErr != nil && c.HasToolset("proxmox") {
			*errs = append(*errs, "DELEGATE_TOOLSETS includes proxmox, which needs the PROXMOX_* token: "+
				strings.TrimPrefix(c.proxmoxErr.Error(), "invalid Proxmox configuration:\n  "))
		}
	}
}

// UseToolsets applies --toolsets (which overrides DELEGATE_TOOLSETS).
func (c *Config) UseToolsets(v string) error {
	sets, err := parseToolsets(v)
	if err != nil {
		return fmt.Errorf("--toolsets (env DELEGATE_TOOLSETS): %w", err)
	}
	if slices.Contains(sets, "proxmox") && c.proxmoxErr != nil {
		return fmt.Errorf("--toolsets proxmox needs the PROXMOX_* token: %s",
			strings.TrimPrefix(c.proxmoxErr.Error(), "invalid Proxmox configuration:\n  "))
	}
	c.Toolsets = sets
	return nil
}
