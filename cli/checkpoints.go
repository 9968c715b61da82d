package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// Checkpoints and forks of kept sandboxes (issue 38): `delegate sandboxes
// checkpoint|rollback|fork|checkpoints`, over Services.Checkpoints.

// withCheckpoints runs fn with the checkpoint service over the data dir
// and a backend.
func (p *Program) withCheckpoints(ctx context.Context, cfg Config, fn func(delegate.CheckpointService) error) (err error) {
	s, closeSvc, err := p.Open(ctx, cfg, newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)), true)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeSvc)
	if s.Checkpoints == nil {
		return errors.New("this delegate keeps no checkpoints")
	}
	return fn(s.Checkpoints)
}

func (p *Program) sandboxesCheckpointCmd(cfg *Config) *cobra.Command {
	var name string
	var memory, asJSON bool
	cmd := &cobra.Command{
		Use:   "checkpoint ID [flags]",
		Short: "Save a kept sandbox's files; print the checkpoint's id",
		Long: `Save a kept sandbox's files as they are now (copy-on-write: no copy of
them is made) and print the checkpoint's id. The sandbox is paused for the
cut and its processes go on after it; a process holding a file of
/workspace open for writing makes it fail (end it first). A checkpoint
keeps files, not processes: a rollback or a fork starts them again from a
clean init. Its checkpoints go with the sandbox when it is released.`,
		Example: `  cp=$(delegate sandboxes checkpoint "$id" --name deps-installed)
  delegate sandboxes rollback "$id" "$cp"`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withCheckpoints(ctx, *cfg, func(svc delegate.CheckpointService) error {
				cp, err := svc.CheckpointSandbox(ctx, args[0], delegate.CheckpointOptions{Name: name, Memory: memory})
				if err != nil {
					return checkpointFlagError(err)
				}
				if asJSON {
					return p.printJSON(cp)
				}
				fmt.Fprintln(p.Stdout, cp.ID)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name of your own for it")
	cmd.Flags().BoolVar(&memory, "memory", false, "keep memory and processes too (refused where the backend cannot)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the checkpoint")
	return cmd
}

// checkpointFlagError names the flag for a field the service refused.
func checkpointFlagError(err error) error {
	var fe *delegate.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	if flag, ok := map[string]string{"name": "--name", "memory": "--memory", "count": "-n", "from": "ID"}[fe.Field]; ok {
		return fmt.Errorf("%s: %s", flag, fe.Rule)
	}
	return err
}

func (p *Program) sandboxesRollbackCmd(cfg *Config) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback ID CHECKPOINT",
		Short: "Bring a kept sandbox's files back to one of its checkpoints",
		Long: `Bring a kept sandbox's files back to one of its checkpoints: what was
written since is gone; a command running in it ends cancelled and its
processes start again from a clean init.`,
		Args: exactArgs("ID", "CHECKPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withCheckpoints(ctx, *cfg, func(svc delegate.CheckpointService) error {
				sb, err := svc.RollbackSandbox(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				fmt.Fprintf(p.Stdout, "%s rolled back to %s\n", sb.ID, args[1])
				return nil
			})
		},
	}
}

func (p *Program) sandboxesForkCmd(cfg *Config) *cobra.Command {
	var count int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "fork ID [flags]",
		Short: "Make new kept sandboxes from a sandbox or a checkpoint; print their ids",
		Long: `Make -n new kept sandboxes that start from the files of a sandbox (which is
checkpointed for them; its commands go on) or of a
checkpoint, and print their ids, one a line. Each has its own id, user
ids, network and egress token, with the source's limits and network
policy; what one writes, no other sees.`,
		Example: `  for f in $(delegate sandboxes fork "$id" -n 3); do delegate exec "$f" -- ./try-fix.sh & done; wait`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withCheckpoints(ctx, *cfg, func(svc delegate.CheckpointService) error {
				made, err := svc.ForkSandbox(ctx, delegate.ForkSpec{From: args[0], Count: count})
				if err != nil {
					return checkpointFlagError(err)
				}
				if asJSON {
					return p.printJSON(struct {
						Sandboxes []delegate.Sandbox `json:"sandboxes"`
					}{made})
				}
				for _, sb := range made {
					fmt.Fprintln(p.Stdout, sb.ID)
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many forks")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the sandboxes")
	return cmd
}

func (p *Program) sandboxesCheckpointsCmd(cfg *Config) *cobra.Command {
	var asJSON bool
	var del string
	cmd := &cobra.Command{
		Use:   "checkpoints ID [flags]",
		Short: "List a kept sandbox's checkpoints and the forks made from each",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withCheckpoints(ctx, *cfg, func(svc delegate.CheckpointService) error {
				if del != "" {
					if err := svc.DeleteCheckpoint(ctx, del); err != nil {
						return err
					}
					fmt.Fprintf(p.Stdout, "%s deleted\n", del)
					return nil
				}
				list, err := svc.ListCheckpoints(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					if list == nil {
						list = []delegate.Checkpoint{}
					}
					return p.printJSON(struct {
						Checkpoints []delegate.Checkpoint `json:"checkpoints"`
					}{list})
				}
				now := time.Now()
				tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CHECKPOINT\tNAME\tAGE\tBYTES\tFORKS")
				for _, c := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", c.ID, dash(safe(c.Name)), shortDuration(now.Sub(c.CreatedAt)), c.Bytes, len(c.Forks))
					for _, f := range c.Forks {
						fmt.Fprintf(tw, "  └ %s\t\t\t\t\n", f)
					}
				}
				tw.Flush()
				if len(list) == 0 {
					fmt.Fprintln(p.Stderr, "no checkpoints ('delegate sandboxes checkpoint ID' makes one)")
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&del, "delete", "", "delete this checkpoint instead of listing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
