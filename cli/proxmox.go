package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/spf13/cobra"
)

// ProxmoxGCOptions are the flags of `delegate proxmox gc`.
type ProxmoxGCOptions struct {
	OlderThan time.Duration
	Unstamped bool
	Act       bool
}

// ProxmoxGCFunc is `delegate proxmox gc`: it reads the cluster with the
// PROXMOX_* settings getenv gives, prints a line per VM on out, and
// removes them with Act.
type ProxmoxGCFunc func(ctx context.Context, getenv func(string) string, opts ProxmoxGCOptions, out io.Writer, log *slog.Logger) error

// ProxmoxDrainFunc is `delegate proxmox drain NODE`: it marks the node
// drained (undo: no longer) and prints what of delegate's is still on it.
type ProxmoxDrainFunc func(ctx context.Context, getenv func(string) string, node string, undo bool, out io.Writer, log *slog.Logger) error

// proxmoxCmd is `delegate proxmox`: what an operator of a Proxmox
// cluster runs by hand.
func (p *Program) proxmoxCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proxmox",
		Short: "Look after delegate's VMs on a Proxmox VE cluster",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var opts ProxmoxGCOptions
	gc := &cobra.Command{
		Use:   "gc",
		Short: "Remove the VMs of delegate servers that are gone (a dry run unless --act)",
		Long: `Find the VMs of delegate servers that no longer exist: each server stamps its
VMs (jobs', kept sandboxes', its warm pool's) with the time it last saw them, a
tag delegate-seen-<unix time> renewed every 5 minutes; a VM whose stamp is
older than --older-than belongs to a server that is gone (its data dir lost,
its host rebuilt). What is judged is what Proxmox shows, never a store: another
live server's VMs are stamped, and safe. Prints each VM and why; removes them
(stop, destroy) only with --act. Uses the PROXMOX_* settings of serve.`,
		Example: `  delegate proxmox gc
  delegate proxmox gc --older-than 72h --act`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.ProxmoxGC == nil {
				return errors.New("this delegate has no Proxmox support")
			}
			return p.ProxmoxGC(cmd.Context(), p.Getenv, opts, cmd.OutOrStdout(), newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)))
		},
	}
	gc.Flags().DurationVar(&opts.OlderThan, "older-than", 24*time.Hour, "a VM not stamped for this long is taken")
	gc.Flags().BoolVar(&opts.Unstamped, "unstamped", false, "also take delegate's VMs with no stamp (made by a delegate before stamps)")
	gc.Flags().BoolVar(&opts.Act, "act", false, "remove them (without it, only say what would go)")
	var undo bool
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Place no new VM on a node, and list delegate's VMs still on it",
		Long: `Mark a node drained: no delegate server places a new VM there (the mark is a
line of the node's notes, which every server reads before it places a VM, at
least every 30 s), and the warm pools give up their idle VMs there. What runs
there goes on to its end; kept sandboxes live on until released or expired
(or a migration moves them). Lists delegate's VMs still on the node. --undo
ends the drain. Needs Sys.Modify on / (and Sys.Audit on / for the servers to
see it). Uses the PROXMOX_* settings of serve.`,
		Example: `  delegate proxmox drain pve2
  delegate proxmox drain pve2 --undo`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if p.ProxmoxDrain == nil {
				return errors.New("this delegate has no Proxmox support")
			}
			return p.ProxmoxDrain(cmd.Context(), p.Getenv, args[0], undo, cmd.OutOrStdout(), newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)))
		},
	}
	drain.Flags().BoolVar(&undo, "undo", false, "end the drain: the node takes VMs again")
	cmd.AddCommand(gc, drain)
	return cmd
}
