package cli

import (
	"path/filepath"
	"reflect"
	"strings"

	"github.com/delegate-dev/delegate/oauthrs"
	"github.com/spf13/cobra"
)

// refusal says why a server may not run a handed command here (""
// when it may): where it would not run as it would in the process that
// sent it. Only run and exec are taken, with the server's settings, and
// without what this process would read as itself rather than as the
// client: the secrets (the server resolves them from its own
// environment), a manifest or --file by a relative path, a workspace
// directory (the client's run allows it as a root).
func (h *HandOff) refusal(cmd *cobra.Command, cfg Config) string {
	if cmd.Parent() == nil || cmd.Parent().Parent() != nil || (cmd.Name() != "run" && cmd.Name() != "exec") {
		return "only run and exec are handed to a server"
	}
	fl := cmd.Flags()
	for _, name := range []string{"manifest", "secret", "workspace", "max-concurrent"} {
		if fl.Changed(name) {
			return "--" + name + " is read by the command's own process"
		}
	}
	if fl.Changed("agent") {
		if a, _ := fl.GetString("agent"); a != "script" {
			return "--agent " + a + " may read secrets"
		}
	}
	if fl.Changed("file") {
		specs, _ := fl.GetStringArray("file")
		for _, spec := range specs {
			if local, _, _ := strings.Cut(spec, ":"); !filepath.IsAbs(local) {
				return "--file " + local + ": a relative path"
			}
		}
	}
	if !sameJobSettings(cfg, h.Server) {
		return "the settings differ from the server's"
	}
	return ""
}

// sameJobSettings: a and b run a job alike. What only a server uses
// (its MCP tools, its HTTP tokens) and what the server decides for the
// jobs it runs (how many at once, the level of its log) are left out.
func sameJobSettings(a, b Config) bool {
	norm := func(c Config) Config {
		c.LogLevel = 0
		c.MaxConcurrent = 0
		c.Toolsets = nil
		c.ProxmoxAllowElevated = false
		c.proxmoxErr = nil
		c.HTTPToken, c.HTTPTokenFile = "", ""
		c.OAuth = oauthrs.Config{}
		c.Proxmox.Logger = nil
		return c
	}
	a, b = norm(a), norm(b)
	return reflect.DeepEqual(a, b)
}
