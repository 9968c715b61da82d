package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate/mcpserver"
)

const jobsUsage = `usage:
  delegate jobs list [--status S] [--limit N] [--cursor C] [--json]
  delegate jobs status ID [--json]
  delegate jobs result ID [--json]     output on stdout, outcome on stderr
  delegate jobs cancel ID
  delegate jobs artifact ID NAME [-o FILE]   (default: stdout)
  delegate jobs logs ID [--follow]`

func cmdJobs(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("%s", jobsUsage)
	}
	sub := args[0]
	fs := flag.NewFlagSet("jobs "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	status := fs.String("status", "", "only jobs with this status (list)")
	limit := fs.Int("limit", 20, "jobs per page (list)")
	cursor := fs.String("cursor", "", "next_cursor of the previous page (list)")
	outPath := fs.String("o", "", "write the artifact to FILE instead of stdout (artifact)")
	follow := fs.Bool("follow", false, "keep printing output until the job ends (logs)")
	cfg.addFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := cfg.check(); err != nil {
		return usageError{err}
	}
	id := ""
	switch sub {
	case "list":
		if fs.NArg() != 0 {
			return usagef("jobs list takes no argument (got %q)", fs.Arg(0))
		}
	case "status", "result", "cancel", "logs":
		if fs.NArg() != 1 {
			return usagef("jobs %s needs one job id\n%s", sub, jobsUsage)
		}
		id = fs.Arg(0)
	case "artifact":
		if fs.NArg() != 2 {
			return usagef("jobs artifact needs a job id and an artifact name\n%s", jobsUsage)
		}
		id = fs.Arg(0)
	default:
		return usagef("unknown jobs command %q\n%s", sub, jobsUsage)
	}
	a, err := openApp(ctx, cfg, newLogger(stderr, max(cfg.LogLevel, slogWarn)), false, "")
	if err != nil {
		return err
	}
	defer a.Close()
	printJSON := func(v any) error {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	switch sub {
	case "list":
		st, err := parseStatus(*status)
		if err != nil {
			return err
		}
		out, err := mcpserver.List(ctx, a.eng, mcpserver.ListIn{Status: st, Limit: *limit, Cursor: *cursor})
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATUS\tEXIT\tCREATED\tTASK")
		for _, j := range out.Jobs {
			exit := "-"
			if j.ExitCode != nil {
				exit = fmt.Sprint(*j.ExitCode)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%q\n", j.JobID, j.Status, exit, j.CreatedAt.Local().Format(time.DateTime), j.Task)
		}
		tw.Flush()
		if out.NextCursor != "" {
			fmt.Fprintf(stderr, "more: delegate jobs list --cursor %s\n", out.NextCursor)
		}
	case "status":
		j, err := a.eng.Get(ctx, id)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(j)
		}
		fmt.Fprintf(stdout, "%s %s", j.ID, j.Status)
		if j.Progress != "" && j.Progress != string(j.Status) {
			fmt.Fprintf(stdout, " (%s)", j.Progress)
		}
		if j.Error != "" {
			fmt.Fprintf(stdout, ": %s", j.Error)
		}
		fmt.Fprintln(stdout)
	case "result":
		res, err := mcpserver.Result(ctx, a.eng, id, int(a.eng.OutputLimit()))
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(res)
		}
		io.WriteString(stdout, res.Output)
		line := fmt.Sprintf("%s %s in %.1fs", res.JobID, res.Status, res.DurationSeconds)
		if res.ExitCode != nil {
			line += fmt.Sprintf(", exit code %d", *res.ExitCode)
		}
		if res.Error != "" {
			line += ": " + res.Error
		}
		fmt.Fprintln(stderr, line)
	case "logs":
		cursor := ""
		for {
			l, err := mcpserver.Logs(ctx, a.eng, mcpserver.LogsIn{JobID: id, Cursor: cursor, MaxBytes: 1 << 20})
			if err != nil {
				return err
			}
			io.WriteString(stdout, l.Output)
			cursor = l.NextCursor
			if l.Done || (!*follow && l.Output == "") {
				return nil
			}
			if l.Output == "" {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	case "artifact":
		art, data, err := a.eng.ReadArtifact(ctx, id, fs.Arg(1))
		if err != nil {
			return err
		}
		if *outPath == "" {
			_, err = stdout.Write(data)
			return err
		}
		if err := os.WriteFile(*outPath, data, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "%s: %d bytes, sha256 %s\n", *outPath, art.Size, art.SHA256)
	case "cancel":
		j, cancelled, err := a.eng.Cancel(ctx, id)
		if err != nil {
			return err
		}
		if cancelled {
			fmt.Fprintf(stdout, "%s cancelled\n", j.ID)
		} else {
			fmt.Fprintf(stdout, "%s had already finished: %s\n", j.ID, j.Status)
		}
	}
	return nil
}
