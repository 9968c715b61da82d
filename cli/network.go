package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// networkService is the services' network side, where there is one.
func networkService(s Services) (delegate.NetworkService, error) {
	if s.Network == nil {
		return nil, fmt.Errorf("this delegate keeps no network logs")
	}
	return s.Network, nil
}

func (p *Program) jobsNetworkCmd(cfg *Config) *cobra.Command {
	var (
		denied, asJSON bool
		after          int64
		limit          int
	)
	cmd := &cobra.Command{
		Use:   "network ID [flags]",
		Short: "Show a job's network log: every connection and DNS query, allowed or denied and why",
		Long: `Show the network log of a job whose network goes through delegate's egress
proxy (network egress or an allowlist): its policy now, the counts, and each
connection and DNS query (time, how it came, the name and address, the port,
the bytes each way, allowed or denied and by which rule). ID may be a kept
sandbox's id (sbx-...) too.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withServices(ctx, *cfg, func(svc Services) error {
				ns, err := networkService(svc)
				if err != nil {
					return err
				}
				rep, err := ns.Network(ctx, args[0], delegate.NetworkLogOptions{After: after, Limit: limit, Denied: denied})
				if err != nil {
					return flagError(err)
				}
				if asJSON {
					return p.printJSON(rep)
				}
				p.printNetwork(rep)
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&denied, "denied", false, "only the denied attempts")
	fs.Int64Var(&after, "after", 0, "entries after this `SEQ` (the NEXT a page ends with)")
	fs.IntVar(&limit, "limit", delegate.DefaultNetworkPage, fmt.Sprintf("at most `N` entries (up to %d)", delegate.MaxNetworkLog))
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printNetwork prints a network report as a person reads it.
func (p *Program) printNetwork(rep *delegate.NetworkReport) {
	state := "live"
	if rep.Ended {
		state = "ended"
	}
	fmt.Fprintf(p.Stdout, "network %s (%s): %s\n", rep.Network, state, rep.Policy)
	if len(rep.Inject) > 0 {
		fmt.Fprintf(p.Stdout, "injected secrets: %s\n", strings.Join(rep.Inject, ", "))
	}
	s := rep.Summary
	fmt.Fprintf(p.Stdout, "%d allowed, %d denied; %d bytes sent, %d received", s.Allowed, s.Denied, s.Sent, s.Received)
	if s.Unlogged > 0 || s.Lost > 0 {
		fmt.Fprintf(p.Stdout, "; %d counted but not kept, %d lost", s.Unlogged, s.Lost)
	}
	fmt.Fprintln(p.Stdout)
	if len(s.DeniedNames) > 0 {
		fmt.Fprintf(p.Stdout, "denied: %s\n", strings.Join(s.DeniedNames, ", "))
	}
	if len(rep.Entries) == 0 {
		return
	}
	fmt.Fprintln(p.Stdout)
	tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tVIA\tTARGET\tADDRESS\tVERDICT\tBYTES OUT/IN\tRULE")
	for _, e := range rep.Entries {
		verdict := "allowed"
		if !e.Allowed {
			verdict = "denied"
		}
		if !e.Attempt() {
			verdict = "-"
		}
		target := e.Target()
		if e.QType != "" {
			target += " " + e.QType
		}
		rule := e.Rule
		if e.Injected != "" {
			rule += " (+" + e.Injected + ")"
		}
		if e.Err != "" {
			rule += ": " + e.Err
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", e.Seq, e.Time.Local().Format("15:04:05.000"), e.Via,
			safe(target), dash(e.Addr), verdict, e.Sent, e.Received, safe(rule))
	}
	tw.Flush()
	if rep.Next != 0 {
		fmt.Fprintf(p.Stdout, "more: --after %d\n", rep.Next)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (p *Program) jobsAllowCmd(cfg *Config) *cobra.Command {
	return &cobra.Command{
		Use:   "allow ID NAME...",
		Short: "Widen a running job's network allowlist",
		Long: `Add names to the allowlist of a running job (or of a kept sandbox, by its
id): pypi.org, *.pythonhosted.org (the names below it), github.com:443 (that
port only). The job's next attempt sees them, a request held for an answer
goes through, and the change is in the job's timeline and its network log.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("missing %s", []string{"ID and NAME", "NAME"}[len(args)])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withServices(ctx, *cfg, func(svc Services) error {
				ns, err := networkService(svc)
				if err != nil {
					return err
				}
				rep, err := ns.AllowNetwork(ctx, args[0], args[1:], "cli")
				if err != nil {
					var fe *delegate.FieldError
					if errors.As(err, &fe) {
						return usagef("%s: %s", fe.Field, fe.Rule)
					}
					return err
				}
				fmt.Fprintf(p.Stdout, "%s: %s\n", args[0], rep.Policy)
				return nil
			})
		},
	}
}
