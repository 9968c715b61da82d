package cli

import (
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"
)

func (p *Program) benchCmd(cfg *Config) *cobra.Command {
	var (
		opts         BenchOptions
		controlPlane bool
		against      string
	)
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
the memory each running sandbox adds, and the jobs lost (must be 0).

With --control-plane, measure this binary's server as an agent and its
jobs use it (submit_job and get_job_status over stdio, list_jobs and the
memory with the store full, callbacks from running jobs under their
per-job limits, the answer to a job over its rate); with --against OLD,
the same for another build's binary, alternating round by round, with
the ratio of each figure (scripts/bench-compare builds OLD from a git
revision).`,
		Example: `  delegate bench
  delegate bench --load 1000 --sleep 30s
  delegate bench --control-plane --against /tmp/delegate-old -n 9`,
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
			if (against != "" || opts.StoreJobs != 0) && !controlPlane {
				return usagef("--against, --store-jobs: only with --control-plane")
			}
			if opts.StoreJobs < 0 {
				return usagef("--store-jobs: must be a positive number of jobs")
			}
			if controlPlane {
				if opts.Load > 0 || opts.ProxmoxSim {
					return usagef("--control-plane: not with --load or --proxmox-sim")
				}
				self, err := os.Executable()
				if err != nil {
					return err
				}
				opts.ControlPlane = []string{self}
				if against != "" {
					if _, err := exec.LookPath(against); err != nil {
						return usagef("--against: %v", err)
					}
					opts.ControlPlane = append(opts.ControlPlane, against)
				}
				if !cmd.Flags().Changed("runs") {
					opts.Runs = 5
				}
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
	fs.BoolVar(&controlPlane, "control-plane", false, "measure the server's control plane (MCP calls, store, callbacks) instead; -n rounds (default 5)")
	fs.StringVar(&against, "against", "", "with --control-plane: another build's `binary`, measured side by side")
	fs.IntVar(&opts.StoreJobs, "store-jobs", 0, "with --control-plane: `jobs` in the store when list_jobs and memory are measured (default 2000)")
	return cmd
}
