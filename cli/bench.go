package cli

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"
)

func (p *Program) benchCmd(cfg *Config) *cobra.Command {
	var opts BenchOptions
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure sandbox start and job round trip, or many jobs at once",
		Long: `Measure, in one run on this machine, plain exec of /bin/true, the sandbox
start of /bin/true and a full job round trip through the engine, and print
medians with ratios to plain exec. With --proxmox-sim, measure Proxmox jobs,
cold (a clone each) and warm (from a pool of booted VMs), against the
simulator at a real cluster's timings (divided by --scale, if given): submit
to running, submit to done and API calls per job.

With --load N, submit N jobs that sleep for --sleep, all at once, with the
concurrency limit raised to N, and print the time until every submission
was accepted, until every job was running and until every job was done,
the memory each running sandbox adds, and the jobs lost (must be 0).`,
		Example: `  delegate bench
  delegate bench --load 1000 --sleep 30s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Runs < 1 {
				return usagef("--runs: must be at least 1")
			}
			if opts.Load < 0 || (opts.Load > 0 && opts.ProxmoxSim) {
				return usagef("--load: must be a positive number of jobs, without --proxmox-sim")
			}
			if opts.Sleep <= 0 {
				return usagef("--sleep: must be positive")
			}
			if opts.ProxmoxSim {
				if opts.Scale < 1 {
					return usagef("--scale: must be at least 1")
				}
				if !cmd.Flags().Changed("runs") {
					opts.Runs = 3 // each cold run takes ~20 s at real timings
				}
				opts.Runs = min(opts.Runs, 10)
			}
			return p.Bench(cmd.Context(), *cfg, opts, p.Stdout, newLogger(p.Stderr, slog.LevelWarn))
		},
	}
	fs := cmd.Flags()
	fs.IntVarP(&opts.Runs, "runs", "n", 30, "runs of each measurement (with --proxmox-sim: default 3, at most 10)")
	fs.BoolVar(&opts.ProxmoxSim, "proxmox-sim", false, "measure Proxmox jobs against a simulator with real-world latencies instead")
	fs.Float64Var(&opts.Scale, "scale", 1, "with --proxmox-sim: divide the simulated latencies by this (1: real timings)")
	fs.IntVar(&opts.Load, "load", 0, "run `N` sleeping jobs at once instead, with the concurrency limit raised to N")
	fs.DurationVar(&opts.Sleep, "sleep", 20*time.Second, "with --load: how long each job sleeps")
	return cmd
}
