package cli

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"
)

// ServersFunc is `delegate servers`: the servers that share the store
// listed on out (as JSON with asJSON), or, with drain set, that server
// (an id, or its unique start) told to drain.
type ServersFunc func(ctx context.Context, cfg Config, drain string, asJSON bool, out io.Writer) error

func (p *Program) serversCmd(cfg *Config) *cobra.Command {
	var asJSON bool
	run := func(cmd *cobra.Command, drain string) error {
		if p.Servers == nil {
			return errors.New("this delegate cannot list servers")
		}
		return p.Servers(cmd.Context(), *cfg, drain, asJSON, cmd.OutOrStdout())
	}
	cmd := &cobra.Command{
		Use:   "servers",
		Short: "List the servers that share the store, their leases and what each holds",
		Long: `List the delegate servers that share the store (DELEGATE_STORE, PostgreSQL):
each one's lease (renewed every third of DELEGATE_LEASE_TTL on the database's
clock; a server whose lease expired is dead to the others, which adopt its
jobs), its host and HTTP address, and the jobs and kept sandboxes it drives.
Servers on a SQLite store (one host) hold no lease and are not listed.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd, "") },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the servers as JSON")
	drain := &cobra.Command{
		Use:   "drain SERVER",
		Short: "Make a server take no new jobs; its running jobs go on",
		Long: `Mark a server draining: it refuses new jobs (submit them to another server)
and finishes what it runs. Stop it then (SIGTERM): its lease ends at once and
the other servers adopt what it still drives, without waiting for the lease to
run out. SERVER is its id as 'delegate servers' shows it, or the id's start.`,
		Example: `  delegate servers
  delegate servers drain web-2/4711`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("drain: name one server (its id as 'delegate servers' shows it)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return run(cmd, args[0]) },
	}
	cmd.AddCommand(drain)
	return cmd
}
