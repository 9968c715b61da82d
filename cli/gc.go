package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// loadRetention reads DELEGATE_RETENTION and DELEGATE_MIN_FREE.
func (c *Config) loadRetention(getenv func(string) string, bad func(name, rule string)) {
	if v := getenv("DELEGATE_RETENTION"); v != "" {
		d, err := parseRetention(v)
		if err != nil {
			bad("DELEGATE_RETENTION", "must be a duration like 30d, 72h or 90m, at least 1m; 0 keeps everything")
		} else {
			c.Retention = d
		}
	}
	if v := getenv("DELEGATE_MIN_FREE"); v != "" {
		if v == "0" {
			c.MinFree = -1 // no floor
		} else if n, err := delegate.ParseSize(v); err != nil || n <= 0 {
			bad("DELEGATE_MIN_FREE", "must be a size like 512M or 2G; 0 sets no floor")
		} else {
			c.MinFree = n
		}
	}
}

// parseRetention reads a duration, with days (30d) besides Go's units; 0
// is -1: kept forever.
func parseRetention(v string) (time.Duration, error) {
	if v == "0" {
		return -1, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 36500 {
			return 0, errors.New("bad days")
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			return 0, err
		}
	}
	if d < time.Minute {
		return 0, errors.New("under a minute")
	}
	return d, nil
}

func (p *Program) gcCmd(cfg *Config) *cobra.Command {
	var dry bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove finished jobs past their retention, and what they kept",
		Long: `Remove what ended more than DELEGATE_RETENTION ago (default 30d): finished
jobs with their output, timeline, artifacts, questions, workspace and network
log; kept sandboxes released or gone; and the artifact files no job left
names. A running server does the same every hour. --dry-run prints what
would go and removes nothing. The database file does not shrink: the space
it frees is reused by new jobs.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return p.withServices(cmd.Context(), *cfg, func(s Services) error {
				gc := s.Retention
				if gc == nil {
					return errors.New("this delegate prunes nothing")
				}
				pr, err := gc.GC(cmd.Context(), delegate.PruneOptions{DryRun: dry})
				if err != nil {
					return err
				}
				printPruned(cmd, pr, dry)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&dry, "dry-run", false, "print what would be removed, and remove nothing")
	return cmd
}

func printPruned(cmd *cobra.Command, p *delegate.Pruned, dry bool) {
	out := cmd.OutOrStdout()
	if p.Before.IsZero() {
		fmt.Fprintln(out, "Retention is off (DELEGATE_RETENTION=0): nothing is removed.")
		return
	}
	verb := "Removed"
	if dry {
		verb = "Would remove"
	}
	fmt.Fprintf(out, "%s what ended before %s:\n", verb, p.Before.Local().Format("2006-01-02 15:04:05"))
	fmt.Fprintf(out, "  %d jobs: %s (output %s, workspaces %s)\n", p.Jobs, delegate.FormatBytes(p.Bytes),
		delegate.FormatBytes(p.OutputBytes), delegate.FormatBytes(p.WorkspaceBytes))
	fmt.Fprintf(out, "  %d artifact files: %s\n", p.ArtifactFiles, delegate.FormatBytes(p.ArtifactBytes))
	fmt.Fprintf(out, "  %d kept sandboxes, %d networks\n", p.Sandboxes, p.Networks)
}
