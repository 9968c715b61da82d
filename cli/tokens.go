package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// Principals: `delegate tokens` makes, lists and revokes delegate's own
// tokens, `delegate audit` reads the audit trail. The CLI is the local
// operator (it opens the data dir itself: its file permissions are the
// boundary), so it may do all of it.

func (p *Program) withPrincipals(ctx context.Context, cfg Config, fn func(delegate.PrincipalService) error) error {
	return p.withServices(ctx, cfg, func(s Services) error {
		if s.Principals == nil {
			return errors.New("this delegate keeps no tokens")
		}
		return fn(s.Principals)
	})
}

func (p *Program) tokensCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tokens",
		Aliases: []string{"token"},
		Short:   "Make, list and revoke tokens of delegate's own (a principal each)",
		Long: `A token of delegate's own names a principal: who a request over HTTP comes
from. Every job and kept sandbox is its principal's; a principal without the
admin scope sees only its own (another's id answers as an unknown one), and
is held by the DELEGATE_QUOTA_* quotas. Scopes: jobs (submit and read jobs),
sandboxes (kept sandboxes and their files), admin (the operator's: everyone's
work, the admin tools). The store keeps only a hash of each token; a token
revoked stops working within a second on every server sharing the store.
DELEGATE_HTTP_TOKEN, stdio and this CLI are the local operator.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(p.tokensCreateCmd(cfg), p.tokensListCmd(cfg), p.tokensRevokeCmd(cfg))
	return cmd
}

func (p *Program) tokensCreateCmd(cfg *Config) *cobra.Command {
	var scopes, expires string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME [flags]",
		Short: "Make a token for principal NAME and print it, once",
		Example: `  delegate tokens create alice --scopes jobs,sandboxes --expires 30d
  DELEGATE_TOKEN=$(delegate tokens create ci-bot)`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := delegate.ParseScopes("scopes", scopes)
			if err != nil {
				return flagError(err)
			}
			ttl, err := parseExpires(expires)
			if err != nil {
				return usagef("--expires %s: must be a duration like 30d, 12h or 90m, or 0 for never (%v)", expires, err)
			}
			ctx := cmd.Context()
			return p.withPrincipals(ctx, *cfg, func(svc delegate.PrincipalService) error {
				secret, t, err := svc.CreateToken(ctx, delegate.TokenRequest{Principal: args[0], Scopes: sc, TTL: ttl})
				if err != nil {
					var fe *delegate.FieldError
					if errors.As(err, &fe) && fe.Field == "name" {
						return usagef("NAME %s", fe.Rule)
					}
					return flagError(err)
				}
				if asJSON {
					return p.printJSON(struct {
						Secret string `json:"token"`
						*delegate.Token
					}{secret, t})
				}
				fmt.Fprintln(p.Stdout, secret)
				fmt.Fprintf(p.Stderr, "token %s for %s (scopes %s, %s): shown this once; the server keeps only its hash. Revoke it with: delegate tokens revoke %s\n",
					t.ID, t.Principal, scopeList(t.Scopes), expiry(t), t.ID)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&scopes, "scopes", "jobs", "`LIST` of jobs, sandboxes, admin")
	cmd.Flags().StringVar(&expires, "expires", "0", "the token stops working after this long: 30d, 12h (0: never)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the token and its record")
	return cmd
}

// parseExpires reads a duration with days (30d) besides Go's units; 0 or
// "never" is no expiry.
func parseExpires(v string) (time.Duration, error) {
	if v == "0" || v == "never" || v == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 3650 {
			return 0, errors.New("days from 1 to 3650")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration")
	}
	if d < time.Minute {
		return 0, errors.New("under a minute")
	}
	return d, nil
}

func scopeList(sc []delegate.Scope) string {
	s := make([]string, len(sc))
	for i, x := range sc {
		s[i] = string(x)
	}
	return strings.Join(s, ",")
}

func expiry(t *delegate.Token) string {
	switch {
	case !t.RevokedAt.IsZero():
		return "revoked " + t.RevokedAt.Local().Format(time.RFC3339)
	case t.ExpiresAt.IsZero():
		return "never expires"
	case !t.Valid(time.Now()):
		return "expired " + t.ExpiresAt.Local().Format(time.RFC3339)
	}
	return "expires " + t.ExpiresAt.Local().Format(time.RFC3339)
}

func (p *Program) tokensListCmd(cfg *Config) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List the tokens (never their secrets), oldest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return p.withPrincipals(ctx, *cfg, func(svc delegate.PrincipalService) error {
				list, err := svc.Tokens(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return p.printJSON(struct {
						Tokens []delegate.Token `json:"tokens"`
					}{list})
				}
				tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TOKEN\tPRINCIPAL\tSCOPES\tCREATED\tSTATE")
				for i := range list {
					t := &list[i]
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Principal, scopeList(t.Scopes), t.CreatedAt.Local().Format(time.RFC3339), expiry(t))
				}
				tw.Flush()
				if len(list) == 0 {
					fmt.Fprintln(p.Stderr, "no tokens ('delegate tokens create NAME' makes one)")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (p *Program) tokensRevokeCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "revoke TOKEN_ID",
		Short: "Revoke a token: it stops working within a second, open sessions too",
		Args:  exactArgs("TOKEN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withPrincipals(ctx, *cfg, func(svc delegate.PrincipalService) error {
				t, err := svc.RevokeToken(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(p.Stdout, "%s of %s: %s\n", t.ID, t.Principal, expiry(t))
				return nil
			})
		},
	}
	return cmd
}

func (p *Program) auditCmd(cfg *Config) *cobra.Command {
	var principal, since string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit [flags]",
		Short: "Who did what: submitted, cancelled, released, answered, widened, applied, made or revoked a token",
		Long: `The audit trail, newest first: each action that changed something, with its
time and principal, kept in the store (every server sharing it writes to it).`,
		Example: `  delegate audit --since 24h
  delegate audit --principal alice --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := delegate.AuditFilter{Principal: principal, Limit: limit}
			if since != "" {
				d, err := parseExpires(since)
				if err != nil || d == 0 {
					t, terr := time.Parse(time.RFC3339, since)
					if terr != nil {
						return usagef("--since %s: must be a duration back from now like 24h or 7d, or a time like 2026-01-02T15:04:05Z", since)
					}
					f.Since = t
				} else {
					f.Since = time.Now().Add(-d)
				}
			}
			if limit < 0 || limit > delegate.MaxPageSize {
				return usagef("--limit: must be from 1 to %d (got %d)", delegate.MaxPageSize, limit)
			}
			ctx := cmd.Context()
			return p.withPrincipals(ctx, *cfg, func(svc delegate.PrincipalService) error {
				list, err := svc.Audit(ctx, f)
				if err != nil {
					return err
				}
				if asJSON {
					return p.printJSON(struct {
						Entries []delegate.AuditEntry `json:"entries"`
					}{list})
				}
				tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TIME\tPRINCIPAL\tACTION\tTARGET\tDETAIL")
				for _, e := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), e.Principal, e.Action, e.Target, strings.ReplaceAll(e.Detail, "\n", " "))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&principal, "principal", "", "only this principal's actions")
	cmd.Flags().StringVar(&since, "since", "", "only actions since: 24h, 7d, or a time (RFC 3339)")
	cmd.Flags().IntVar(&limit, "limit", 0, fmt.Sprintf("at most this many entries (default %d)", delegate.DefaultPageSize))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
