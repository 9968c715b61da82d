package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

func (p *Program) jobsCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "Read and manage stored jobs",
		Long: `Read and manage the jobs stored in the data dir, the same ones the server
sees: "jobs cancel" reaches a job that a running server is driving.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(p.jobsListCmd(cfg), p.jobsStatusCmd(cfg), p.jobsResultCmd(cfg), p.jobsLogsCmd(cfg),
		p.jobsCancelCmd(cfg), p.jobsReleaseCmd(cfg), p.jobsArtifactCmd(cfg), p.jobsArtifactsCmd(cfg),
		p.jobsQuestionsCmd(cfg), p.jobsAnswerCmd(cfg), p.jobsDiffCmd(cfg), p.jobsApplyCmd(cfg),
		p.jobsNetworkCmd(cfg), p.jobsAllowCmd(cfg))
	return cmd
}

// withService runs fn with the job service over the data dir.
func (p *Program) withService(ctx context.Context, cfg Config, fn func(delegate.JobService) error) error {
	return p.withServices(ctx, cfg, func(s Services) error { return fn(s.Jobs) })
}

// withServices runs fn with the services over the data dir.
func (p *Program) withServices(ctx context.Context, cfg Config, fn func(Services) error) (err error) {
	s, closeSvc, err := p.Open(ctx, cfg, newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)), false)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeSvc)
	return fn(s)
}

func (p *Program) printJSON(v any) error {
	enc := json.NewEncoder(p.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (p *Program) jobsListCmd(cfg *Config) *cobra.Command {
	var (
		status, cursor string
		limit          int
		asJSON         bool
	)
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List jobs, newest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st := delegate.Status(status)
			if status != "" && !st.Valid() {
				return usagef("--status: must be one of %s (got %q)", statusList(), status)
			}
			return p.withService(cmd.Context(), *cfg, func(svc delegate.JobService) error {
				page, err := svc.List(cmd.Context(), delegate.ListOptions{Status: st, Limit: limit, Cursor: cursor})
				if err != nil {
					return flagError(err)
				}
				if asJSON {
					return p.printJSON(page)
				}
				tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "JOB\tSTATUS\tEXIT\tSANDBOX\tCREATED\tTASK")
				for _, j := range page.Jobs {
					exit := delegate.ExitText(j.ExitCode, j.ExitReason)
					st := string(j.Status)
					if !j.Status.Terminal() && j.ExitCode != nil {
						st += " (ended, not recorded yet)" // its sandbox says so (JobSummary.Progress)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%q\n", j.ID, st, exit, dash(j.Sandbox), j.CreatedAt.Local().Format(time.DateTime), j.Task)
				}
				tw.Flush()
				if page.NextCursor != "" {
					fmt.Fprintf(p.Stderr, "more: delegate jobs list --cursor %s\n", page.NextCursor)
				}
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&status, "status", "", "only jobs with this status ("+statusList()+")")
	fs.IntVar(&limit, "limit", delegate.DefaultPageSize, fmt.Sprintf("jobs per page (at most %d)", delegate.MaxPageSize))
	fs.StringVar(&cursor, "cursor", "", "continue after the previous page (its next cursor)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func statusList() string {
	names := make([]string, len(delegate.Statuses))
	for i, s := range delegate.Statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// flagError turns the service's complaint about an option (a FieldError
// naming status, limit or cursor) into a usage error naming the flag.
func flagError(err error) error {
	var fe *delegate.FieldError
	if errors.As(err, &fe) {
		return usagef("--%s: %s", strings.ReplaceAll(fe.Field, "_", "-"), fe.Rule)
	}
	return err
}

// statusJSON is a job with its timeline, as `jobs status --json` prints it.
type statusJSON struct {
	*delegate.Job
	ExitReason delegate.ExitReason `json:"exit_reason,omitempty"`
	Timeline   []delegate.Event    `json:"timeline,omitempty"`
	Artifacts  []delegate.Artifact `json:"artifacts,omitempty"`
}

func (p *Program) jobsStatusCmd(cfg *Config) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status ID [flags]",
		Short: "Show a job's status and timeline",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				j, err := svc.Get(ctx, args[0])
				if err != nil {
					return err
				}
				timeline, err := svc.Timeline(ctx, j.ID)
				if err != nil {
					return err
				}
				var arts []delegate.Artifact
				if j.Status.Terminal() && len(j.Manifest.Artifacts) > 0 {
					if arts, err = svc.Artifacts(ctx, j.ID); err != nil {
						return err
					}
				}
				if asJSON {
					return p.printJSON(statusJSON{Job: j, ExitReason: delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled), Timeline: timeline, Artifacts: arts})
				}
				p.printStatus(j, timeline, arts)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the job, its manifest and timeline")
	return cmd
}

func (p *Program) printStatus(j *delegate.Job, timeline []delegate.Event, arts []delegate.Artifact) {
	w := p.Stdout
	fmt.Fprintf(w, "%s %s", j.ID, j.Status)
	if j.Progress != "" && j.Progress != string(j.Status) {
		fmt.Fprintf(w, " (%s)", safe(j.Progress))
	}
	if j.Error != "" {
		fmt.Fprintf(w, ": %s", safe(j.Error))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{name}, args...)...)
	}
	m := j.Manifest
	row("agent", "%s, statusMode %s, lifecycle %s, backend %s", m.AgentType, m.StatusMode, m.Lifecycle, j.Backend)
	switch {
	case j.Sandbox != "" && m.Sandbox != "":
		row("sandbox", "%s (a command in it)", j.Sandbox)
	case j.Sandbox != "":
		row("sandbox", "%s (made by this job)", j.Sandbox)
	}
	row("created", "%s", j.CreatedAt.Local().Format(time.DateTime))
	if !j.StartedAt.IsZero() {
		row("started", "%s", j.StartedAt.Local().Format(time.DateTime))
	}
	if !j.FinishedAt.IsZero() {
		row("finished", "%s, after %.1fs", j.FinishedAt.Local().Format(time.DateTime), j.Duration(time.Now()).Seconds())
	}
	if j.Status.Terminal() {
		row("exit code", "%s", delegate.ExitText(j.ExitCode, delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled)))
	}
	row("output", "%d bytes%s", j.OutputBytes, map[bool]string{true: " (truncated)"}[j.OutputTruncated])
	if j.OutputLostBytes > 0 {
		row("output lost", "%d bytes: %s", j.OutputLostBytes, j.OutputLost)
	}
	if j.CacheMissed != "" {
		row("cache", "%s", safe(j.CacheMissed))
	}
	tw.Flush()
	if j.Status.Terminal() {
		fmt.Fprint(w, artifactLines(j.ID, arts, "  "))
	}
	if len(timeline) > 0 {
		fmt.Fprintln(w, "timeline:")
		if j.TimelineDropped > 0 {
			fmt.Fprintf(w, "  (%d earlier entries dropped)\n", j.TimelineDropped)
		}
		for _, ev := range timeline {
			fmt.Fprintf(w, "  %s  %s\n", ev.Time.Local().Format("15:04:05.000"), safe(ev.Message))
		}
	}
}

// resultJSON is a result as `jobs result --json` prints it.
type resultJSON struct {
	*delegate.JobResult
	Output          string  `json:"output"`
	Stderr          string  `json:"stderr"`
	DurationSeconds float64 `json:"duration_seconds"`
}

func (p *Program) jobsResultCmd(cfg *Config) *cobra.Command {
	var asJSON, raw bool
	cmd := &cobra.Command{
		Use:   "result ID [flags]",
		Short: "Print a finished job's output and exit with its exit code",
		Long: `Print a finished job's stdout on stdout, its stderr then its outcome on
stderr, and exit with the job's exit code (124 when it timed out, 130 when it
was cancelled). "delegate jobs logs ID" prints the two interleaved, in the
order they were written. On a terminal the output's escape sequences other
than colours are written out as text unless --raw (see "delegate run
--help"); the outcome, prefixed "delegate: ", comes after an attribute
reset.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				res, err := svc.Result(ctx, args[0], delegate.ResultOptions{OutputTail: int(delegate.MaxOutputLimit)})
				if err != nil {
					return err
				}
				if asJSON {
					if err := p.printJSON(resultJSON{JobResult: res, Output: strings.ToValidUTF8(string(res.Output), "\uFFFD"),
						Stderr: strings.ToValidUTF8(string(res.Stderr), "\uFFFD"), DurationSeconds: float64(res.Duration.Milliseconds()) / 1000}); err != nil {
						return err
					}
				} else {
					stdout, finishOut := jobOutput(p.Stdout, raw)
					stderr, finishErr := jobOutput(p.Stderr, raw)
					if _, err := stdout.Write(res.Output); err != nil {
						return err
					}
					if _, err := stderr.Write(res.Stderr); err != nil {
						return err
					}
					if err := errors.Join(finishOut(), finishErr()); err != nil {
						return err
					}
					fmt.Fprintln(p.Stderr, verdict(res.JobID, res.Status, res.Duration, res.ExitCode, res.ExitReason, res.Error))
					printArtifacts(p.Stderr, res.JobID, res.Artifacts)
					if n := res.Network; n != nil {
						line := fmt.Sprintf("network: %d allowed, %d denied", n.Summary.Allowed, n.Summary.Denied)
						if len(n.Summary.DeniedNames) > 0 {
							line += " (" + strings.Join(n.Summary.DeniedNames, ", ") + "): delegate jobs network " + res.JobID
						}
						fmt.Fprintln(p.Stderr, safe(line))
					}
					if res.CacheMissed != "" {
						fmt.Fprintln(p.Stderr, "delegate: cache "+safe(res.CacheMissed))
					}
				}
				return jobExit(exitCode(&delegate.Job{Status: res.Status, ExitCode: res.ExitCode}))
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (output, stderr, exit code, error, artifacts...)")
	cmd.Flags().BoolVar(&raw, "raw", false, "write the output byte for byte also on a terminal")
	return cmd
}

func (p *Program) jobsLogsCmd(cfg *Config) *cobra.Command {
	var follow, raw bool
	cmd := &cobra.Command{
		Use:   "logs ID [flags]",
		Short: "Print a job's output",
		Long: `Print a job's output: its stdout and stderr interleaved, in the order they
were written, on stdout. While it runs, its output is readable if it was
submitted in statusMode streaming (delegate run does that); with --follow,
the output of any other job is printed when the job ends. On a terminal its
escape sequences other than colours are written out as text unless --raw,
and a finished job's outcome follows on stderr, prefixed "delegate: ".`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				return p.logs(ctx, svc, args[0], follow, raw)
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing output until the job ends")
	cmd.Flags().BoolVar(&raw, "raw", false, "write the output byte for byte also on a terminal")
	return cmd
}

func (p *Program) logs(ctx context.Context, svc delegate.JobService, id string, follow, raw bool) error {
	stdout, finish := jobOutput(p.Stdout, raw)
	defer finish()
	out := &logCopier{svc: svc, id: id, w: stdout}
	for {
		done, err := out.copy(ctx)
		if done && stdout != p.Stdout {
			// On a terminal, the verdict after the output.
			if err := finish(); err != nil {
				return err
			}
			j, err := svc.Get(ctx, id)
			if err != nil {
				return err
			}
			fmt.Fprintln(p.Stderr, verdict(j.ID, j.Status, j.Duration(time.Now()), j.ExitCode, delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled), j.Error))
			return nil
		}
		switch {
		case errors.Is(err, delegate.ErrNotFinished) && follow:
			j, err := svc.Get(ctx, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(p.Stderr, "delegate: %s is %s in statusMode %s: its output is printed when it ends\n", id, j.Status, j.Manifest.StatusMode)
			if _, err := p.waitEnd(ctx, svc, id); err != nil || ctx.Err() != nil {
				return err
			}
			continue
		case err != nil:
			return err
		case done || !follow:
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.PollInterval):
		}
	}
}

// waitEnd waits until the job has finished or ctx is done.
func (p *Program) waitEnd(ctx context.Context, svc delegate.JobService, id string) (*delegate.Job, error) {
	for {
		j, err := svc.Wait(ctx, id)
		if err != nil || j.Status.Terminal() || ctx.Err() != nil {
			return j, err
		}
	}
}

func (p *Program) jobsCancelCmd(cfg *Config) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a job that has not finished",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				j, cancelled, err := svc.Cancel(ctx, args[0])
				if err != nil {
					return err
				}
				if cancelled {
					fmt.Fprintf(p.Stdout, "%s cancelled\n", j.ID)
				} else {
					fmt.Fprintf(p.Stdout, "%s had already finished: %s\n", j.ID, j.Status)
				}
				return nil
			})
		},
	}
}

func (p *Program) jobsReleaseCmd(cfg *Config) *cobra.Command {
	return &cobra.Command{
		Use:   "release ID",
		Short: "Destroy the sandbox a finished job kept (run --keep)",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				j, released, err := svc.Release(ctx, args[0])
				if err != nil {
					return err
				}
				if released {
					fmt.Fprintf(p.Stdout, "%s: sandbox released\n", j.ID)
				} else {
					fmt.Fprintf(p.Stdout, "%s: no sandbox kept (already released, or the job was not run with --keep)\n", j.ID)
				}
				return nil
			})
		},
	}
}

func (p *Program) jobsArtifactCmd(cfg *Config) *cobra.Command {
	var outPath string
	var raw bool
	cmd := &cobra.Command{
		Use:   "artifact ID NAME [flags]",
		Short: "Print or save a file kept from a job",
		Args:  exactArgs("ID", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				art, data, err := svc.ReadArtifact(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				if outPath == "" {
					// A job's file: on a terminal, as a job's output.
					stdout, finish := jobOutput(p.Stdout, raw)
					if _, err = stdout.Write(data); err != nil {
						return err
					}
					return finish()
				}
				if err := os.WriteFile(outPath, data, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(p.Stderr, "%s: %d bytes, sha256 %s\n", outPath, art.Size, art.SHA256)
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&outPath, "output", "o", "", "write the artifact to `FILE` instead of stdout")
	cmd.Flags().BoolVar(&raw, "raw", false, "write it byte for byte also on a terminal")
	return cmd
}

func (p *Program) jobsArtifactsCmd(cfg *Config) *cobra.Command {
	var outDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "artifacts ID [--out DIR] [flags]",
		Short: "List the files kept from a job, or save them all",
		Long: `List the files kept from a job (its manifest's artifacts: name, size,
sha256, or why one was not kept), or with --out DIR save every kept one
under DIR, by its name (a path relative to /workspace), creating DIR and
the directories within it. Nothing is written outside DIR, also through
links that are already in it.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				arts, err := svc.Artifacts(ctx, args[0])
				if err != nil {
					return err
				}
				if outDir == "" {
					if asJSON {
						if arts == nil {
							arts = []delegate.Artifact{}
						}
						return p.printJSON(arts)
					}
					return p.listArtifacts(args[0], arts)
				}
				return p.saveArtifacts(ctx, svc, args[0], arts, outDir)
			})
		},
	}
	cmd.Flags().StringVarP(&outDir, "out", "o", "", "save every kept artifact under `DIR`")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func (p *Program) listArtifacts(id string, arts []delegate.Artifact) error {
	if len(arts) == 0 {
		fmt.Fprintf(p.Stderr, "delegate: %s kept no artifacts (a job keeps the files its manifest's artifacts globs match: run --artifact GLOB)\n", id)
		return nil
	}
	tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tSHA256")
	for _, a := range arts {
		sum := a.SHA256
		if a.Skipped != "" {
			sum = "not kept: " + a.Skipped
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", safe(a.Name), a.Size, safe(sum))
	}
	return tw.Flush()
}

// saveArtifacts writes every kept artifact under dir. The names are the
// job's (a job names its files): they are opened through an os.Root, so
// that none lands outside dir, whatever it says or links dir holds.
func (p *Program) saveArtifacts(ctx context.Context, svc delegate.JobService, id string, arts []delegate.Artifact, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, a := range arts {
		if !filepath.IsLocal(filepath.FromSlash(a.Name)) {
			return fmt.Errorf("artifact %q: not a relative path; nothing saved", a.Name)
		}
	}
	// Several at once (10,000 small ones took minutes one by one); the
	// lines are printed in the listing's order, and the first error
	// stops what has not started.
	lines := make([]string, len(arts))
	var (
		next  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	failed := func() bool { mu.Lock(); defer mu.Unlock(); return first != nil }
	save := func(i int) error {
		a := arts[i]
		if a.Skipped != "" {
			lines[i] = fmt.Sprintf("delegate: %s not kept: %s\n", safe(a.Name), safe(a.Skipped))
			return nil
		}
		name := filepath.FromSlash(a.Name)
		_, data, err := svc.ReadArtifact(ctx, id, a.Name)
		if err != nil {
			return err
		}
		if d := filepath.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("save %s: %w", safe(a.Name), err)
			}
		}
		if err := root.WriteFile(name, data, 0o644); err != nil {
			return fmt.Errorf("save %s: %w", safe(a.Name), err)
		}
		lines[i] = fmt.Sprintf("%s: %d bytes, sha256 %s\n", safe(filepath.Join(dir, name)), a.Size, a.SHA256)
		return nil
	}
	for range min(artifactSavers, len(arts)) {
		wg.Go(func() {
			for !failed() {
				i := int(next.Add(1)) - 1
				if i >= len(arts) {
					return
				}
				if err := save(i); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	saved := 0
	for i, line := range lines {
		fmt.Fprint(p.Stderr, line)
		if line != "" && arts[i].Skipped == "" {
			saved++
		}
	}
	if first != nil {
		return first
	}
	fmt.Fprintf(p.Stderr, "delegate: saved %d of %d artifacts in %s\n", saved, len(arts), safe(dir))
	return nil
}

// artifactSavers is how many artifacts jobs artifacts --out reads and
// writes at once.
const artifactSavers = 8

// artifactLines lists a finished job's artifacts for a person, each line
// starting with prefix: what was kept and what was not, and why, then how
// to save them.
func artifactLines(id string, arts []delegate.Artifact, prefix string) string {
	if len(arts) == 0 {
		return ""
	}
	var b strings.Builder
	kept := 0
	for _, a := range arts {
		if a.Skipped != "" {
			fmt.Fprintf(&b, "%sartifact %s, %d bytes, not kept: %s\n", prefix, safe(a.Name), a.Size, safe(a.Skipped))
			continue
		}
		kept++
		fmt.Fprintf(&b, "%sartifact %s, %d bytes\n", prefix, safe(a.Name), a.Size)
	}
	if kept > 0 {
		fmt.Fprintf(&b, "%s'delegate jobs artifacts %s --out DIR' saves them\n", prefix, id)
	}
	return b.String()
}

// printArtifacts lists a finished job's artifacts after its verdict, on
// delegate's lines.
func printArtifacts(w io.Writer, id string, arts []delegate.Artifact) {
	fmt.Fprint(w, artifactLines(id, arts, "delegate: "))
}
