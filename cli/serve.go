package cli

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/spf13/cobra"
)

func (p *Program) serveCmd(cfg *Config) *cobra.Command {
	var opts ServeOptions
	var toolsets string
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Serve MCP on stdio, or over Streamable HTTP at ADDR/mcp with a dashboard",
		Long: `Serve the MCP tools on stdio (nothing but MCP is written to stdout; logs go
to stderr), or with --http over Streamable HTTP at http://ADDR/mcp, with the
dashboard at http://ADDR/, Prometheus metrics at /metrics and GET /health
beside it. A callback server for jobs listens on CALLBACK_PORT.

With DELEGATE_HTTP_TOKEN (or DELEGATE_HTTP_TOKEN_FILE) set, /mcp, /metrics
and the dashboard require it (Authorization: Bearer, or the dashboard's
sign-in form); /health stays open. With DELEGATE_OAUTH_ISSUERS and
DELEGATE_OAUTH_RESOURCE set, /mcp also accepts those issuers' JWT access
tokens, and /.well-known/oauth-protected-resource tells MCP clients where
to get them (docs/security.md). Serving beyond the loopback interface with
neither a token nor an issuer is refused.

A second 'serve --http' on the data dir of a stdio server shows that
server's jobs in the dashboard.

` + cfg.MaximaHelp(),
		Example: `  claude mcp add -s user delegate -- delegate serve
  delegate serve --http 127.0.0.1:8080
  DELEGATE_HTTP_TOKEN=$(openssl rand -hex 32) delegate serve --http 0.0.0.0:8080 --tls-cert cert.pem --tls-key key.pem`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.check(cmd.Context(), *cfg); err != nil {
				return err
			}
			if cmd.Flags().Changed("toolsets") {
				if err := cfg.UseToolsets(toolsets); err != nil {
					return usageError{err}
				}
			}
			// stdout is the MCP channel in stdio mode: logs go to stderr only.
			return p.Serve(cmd.Context(), *cfg, opts, newLogger(p.Stderr, cfg.LogLevel))
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&opts.HTTPAddr, "http", "", "serve MCP Streamable HTTP and the dashboard at `ADDR` (e.g. 127.0.0.1:8080) instead of stdio")
	fs.DurationVar(&opts.SessionTimeout, "session-timeout", 30*time.Minute, "close idle HTTP sessions after this long")
	fs.IntVar(&opts.MaxSessions, "max-sessions", httpapi.DefaultMaxSessions, "live MCP sessions kept at most over HTTP; past it the longest idle is closed")
	fs.StringVar(&opts.TLSCert, "tls-cert", "", "serve HTTPS with this certificate `FILE` (PEM; with --tls-key)")
	fs.StringVar(&opts.TLSKey, "tls-key", "", "the private key `FILE` of --tls-cert (PEM)")
	fs.StringVar(&toolsets, "toolsets", strings.Join(cfg.Toolsets, ","), "MCP tools to offer: `LIST` of jobs, proxmox (env DELEGATE_TOOLSETS)")
	cfg.addConcurrencyFlag(fs)
	return cmd
}

// check validates the HTTP options and loads the token.
func (o *ServeOptions) check(ctx context.Context, cfg Config) error {
	if o.HTTPAddr == "" {
		for name, v := range map[string]string{"--tls-cert": o.TLSCert, "--tls-key": o.TLSKey} {
			if v != "" {
				return usagef("%s: only with --http", name)
			}
		}
		return nil
	}
	if o.MaxSessions < 1 || o.MaxSessions > 1_000_000 {
		return usagef("--max-sessions: must be from 1 to 1000000 (got %d)", o.MaxSessions)
	}
	if o.SessionTimeout < time.Second {
		return usagef("--session-timeout: must be at least 1s (got %s)", o.SessionTimeout)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return usagef("--tls-cert and --tls-key: give both, or neither")
	}
	if _, _, err := net.SplitHostPort(o.HTTPAddr); err != nil {
		return usagef("--http %s: must be HOST:PORT, like 127.0.0.1:8080", o.HTTPAddr)
	}
	var err error
	if o.OAuth, err = cfg.OAuthVerifier(); err != nil {
		return configError{err}
	}
	token, err := cfg.LoadHTTPToken()
	if err != nil {
		return configError{err}
	}
	if token != "" {
		name := "DELEGATE_HTTP_TOKEN"
		if cfg.HTTPTokenFile != "" {
			name = "DELEGATE_HTTP_TOKEN_FILE"
		}
		if o.Token, err = httpauth.New(token); err != nil {
			return configError{fmt.Errorf("%s: %w", name, err)}
		}
		return nil
	}
	// With an issuer, its access tokens are the authentication: every
	// request needs one (or a token of delegate's own; the dashboard
	// signs in with one of those), none is let through as the operator.
	if o.OAuth == nil && !loopbackOnly(ctx, o.HTTPAddr) {
		return configError{fmt.Errorf("--http %s accepts connections from other machines, and no token is set: "+
			"set DELEGATE_HTTP_TOKEN (or DELEGATE_HTTP_TOKEN_FILE) so that /mcp, the dashboard and /metrics require it, "+
			"or DELEGATE_OAUTH_ISSUERS so that they require an issuer's access token, "+
			"or serve on 127.0.0.1", o.HTTPAddr)}
	}
	return nil
}

// loopbackOnly reports whether a listen address reaches this machine's
// loopback interface only. No host, 0.0.0.0 or :: is every interface; a
// name counts as loopback if all its addresses are.
func loopbackOnly(ctx context.Context, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}
