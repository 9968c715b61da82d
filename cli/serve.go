package cli

import (
	"time"

	"github.com/spf13/cobra"
)

func (p *Program) serveCmd(cfg *Config) *cobra.Command {
	var opts ServeOptions
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Serve MCP on stdio, or over Streamable HTTP at ADDR/mcp",
		Long: `Serve the MCP tools on stdio (nothing but MCP is written to stdout; logs go
to stderr), or with --http over Streamable HTTP at http://ADDR/mcp, with
GET /health beside it. A callback server for jobs listens on CALLBACK_PORT.`,
		Example: `  claude mcp add -s user delegate -- delegate serve
  delegate serve --http 127.0.0.1:8080`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// stdout is the MCP channel in stdio mode: logs go to stderr only.
			return p.Serve(cmd.Context(), *cfg, opts, newLogger(p.Stderr, cfg.LogLevel))
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&opts.HTTPAddr, "http", "", "serve MCP Streamable HTTP at `ADDR` (e.g. 127.0.0.1:8080) instead of stdio")
	fs.DurationVar(&opts.SessionTimeout, "session-timeout", 30*time.Minute, "close idle HTTP sessions after this long")
	cfg.addConcurrencyFlag(fs)
	return cmd
}
