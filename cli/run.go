package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
	"github.com/spf13/cobra"
)

// runFlags are the flags of `delegate run`.
type runFlags struct {
	script, manifest string
	timeout          int
	timeoutSet       bool // --timeout given, even as 0 (which the service refuses)
	memory           string
	cpu              float64
	quiet            bool
	raw              bool // the job's output as it is, also on a terminal
	files, envs      []string
	// The workspace source (--workspace DIR, or --git URL [--ref REF])
	// and the caches.
	workspace, git, ref string
	includeIgnored      bool
	caches              []string
}

func (p *Program) runCmd(cfg *Config) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run (--script CMD | --manifest FILE) [flags]",
		Short: "Run one job and print its output",
		Long: `Run one job in a new sandbox: its stdout goes to stdout and its stderr to
stderr as they are written, byte for byte, its progress to stderr too (-q for
none), and delegate exits with the job's exit code (124 when
it timed out, 130 when it was cancelled; Ctrl-C cancels it). When delegate
itself fails (a bad flag, an invalid manifest, no sandbox) it exits 125.

On a terminal the job's output is shown with its escape sequences other
than colours written out as text (\x1b]52;...), so that it cannot drive
the terminal, and delegate's verdict follows on a line of its own, on
stderr, after an attribute reset, prefixed "delegate: "; --raw writes the
output byte for byte there too (as always to a file or a pipe).

The job runs in statusMode streaming unless the manifest says otherwise, so
"delegate jobs logs ID --follow" can follow it from another terminal.`,
		Example: `  delegate run --script 'make test' --file Makefile --file src/main.c:src/main.c
  delegate run --manifest job.json --timeout 600
  echo '{"agentType":"script","task":"uname -a"}' | delegate run --manifest -`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (quote the script: --script 'cmd args')", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.timeoutSet = cmd.Flags().Changed("timeout")
			return p.run(cmd.Context(), *cfg, f)
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.script, "script", "", "shell script to run (agentType script)")
	fs.StringVar(&f.manifest, "manifest", "", "manifest JSON `FILE` (- for stdin)")
	fs.StringArrayVar(&f.files, "file", nil, "put `LOCAL[:REMOTE]` in the sandbox (repeatable; REMOTE relative to /workspace, default the base name)")
	fs.StringArrayVar(&f.envs, "env", nil, "environment variable `KEY=VALUE` (repeatable)")
	fs.IntVar(&f.timeout, "timeout", 0, "timeout in `seconds` (default: the manifest's, else DEFAULT_TIMEOUT)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M")
	fs.Float64Var(&f.cpu, "cpu", 0, "cpu cores")
	fs.StringVar(&f.workspace, "workspace", "", "copy `DIR` (a git work tree as git sees it) into /workspace; 'delegate jobs diff' and 'jobs apply' bring the job's changes back")
	fs.StringVar(&f.git, "git", "", "clone the https `URL` into /workspace instead")
	fs.StringVar(&f.ref, "ref", "", "the branch, tag or commit of --git")
	fs.BoolVar(&f.includeIgnored, "include-ignored", false, "with --workspace: copy the files git ignores too")
	fs.StringArrayVar(&f.caches, "cache", nil, "keep the `NAME` cache of this workspace between jobs: go, npm, pip, cargo (repeatable)")
	fs.BoolVarP(&f.quiet, "quiet", "q", false, "no progress on stderr")
	fs.BoolVar(&f.raw, "raw", false, "write the job's output byte for byte also on a terminal (escape sequences and all)")
	cfg.addConcurrencyFlag(fs)
	return cmd
}

// run runs one job and ends with its exit status (a jobExit).
func (p *Program) run(ctx context.Context, cfg Config, f runFlags) error {
	m, err := buildManifest(p.Stdin, f)
	if err != nil {
		return err
	}
	if m.Workspace != nil && m.Workspace.Dir != "" && f.workspace != "" {
		// The person running the CLI chose the directory: it is an
		// allowed root of this run (the server's rules for roots hold).
		if rule := cfg.workspaceRootRule(m.Workspace.Dir); rule != "" {
			return usagef("--workspace: %s %s", m.Workspace.Dir, rule)
		}
		cfg.WorkspaceRoots = append(cfg.WorkspaceRoots, m.Workspace.Dir)
	}
	log := newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn))
	svc, closeSvc, err := p.Open(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer closeSvc()
	job, err := svc.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		return err
	}
	progress := newProgressLine(p.Stderr, f.quiet, job.ID)
	stdout, finishOut := jobOutput(p.Stdout, f.raw)
	stderr, finishErr := jobOutput(p.Stderr, f.raw)
	finish := func() { finishOut(); finishErr() }
	defer finish() // the terminal's attributes back, whatever happens
	out := &logCopier{svc: svc, id: job.ID, w: stdout, errw: stderr, before: progress.clear}
	for {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		j, err := svc.Wait(wctx, job.ID)
		cancel()
		if err != nil {
			return err
		}
		// Not the command's context: after a Ctrl-C the output still counts.
		if _, err := out.copy(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, delegate.ErrNotFinished) {
			return err
		}
		if j.Status.Terminal() {
			finish()
			progress.done(j)
			if m.Workspace != nil && !f.quiet {
				p.tellChanges(ctx, svc, j.ID)
			}
			return jobExit(exitCode(j))
		}
		if ctx.Err() != nil {
			// Ctrl-C: cancel the job, and wait for it to be killed.
			progress.clear()
			fmt.Fprintf(p.Stderr, "delegate: cancelling %s\n", job.ID)
			if _, _, err := svc.Cancel(context.WithoutCancel(ctx), job.ID); err != nil {
				return err
			}
			ctx = context.WithoutCancel(ctx)
			continue
		}
		progress.show(j)
	}
}

// tellChanges says on stderr what the job changed in its workspace, and
// how to have it.
func (p *Program) tellChanges(ctx context.Context, svc delegate.JobService, id string) {
	ws, ok := svc.(delegate.WorkspaceService)
	if !ok {
		return
	}
	c, err := ws.Changes(context.WithoutCancel(ctx), id)
	switch {
	case err != nil:
		return
	case c.Error != "":
		fmt.Fprintf(p.Stderr, "delegate: the workspace's changes were not kept: %s\n", c.Error)
	case len(c.Files) == 0:
		fmt.Fprintf(p.Stderr, "delegate: the job changed nothing in its workspace\n")
	default:
		fmt.Fprintf(p.Stderr, "delegate: the job changed %s (%d added, %d modified, %d deleted): 'delegate jobs diff %s' shows them, 'delegate jobs apply %s' writes them back\n",
			files(c.Added+c.Modified+c.Deleted), c.Added, c.Modified, c.Deleted, id, id)
	}
}

// files says n files.
func files(n int) string {
	if n == 1 {
		return "1 file"
	}
	return fmt.Sprintf("%d files", n)
}

// logCopier copies a job's output to w as it comes: its stdout and
// stderr interleaved, or, with errw, its stderr to errw.
type logCopier struct {
	svc    delegate.JobService
	id     string
	w      io.Writer
	errw   io.Writer
	before func() // called before anything is written
	cursor string
}

// copy writes what is new and says whether all the output has been
// written (the job has ended). While a job that does not stream its
// output runs, it returns an error wrapping delegate.ErrNotFinished.
func (c *logCopier) copy(ctx context.Context) (done bool, err error) {
	for {
		l, err := c.svc.Logs(ctx, c.id, delegate.LogOptions{Cursor: c.cursor, MaxBytes: delegate.MaxLogBytes})
		if err != nil {
			return false, err
		}
		if len(l.Output) > 0 {
			if c.before != nil {
				c.before()
			}
			if err := c.write(l); err != nil {
				return false, err
			}
		}
		c.cursor = l.NextCursor
		if l.Done || len(l.Output) == 0 {
			return l.Done, nil
		}
	}
}

func (c *logCopier) write(l *delegate.LogPage) error {
	if c.errw == nil || len(l.Streams) == 0 {
		_, err := c.w.Write(l.Output)
		return err
	}
	for _, o := range l.Streams {
		w := c.w // output kept before the streams were told apart too
		if o.Stream == delegate.StreamStderr {
			w = c.errw
		}
		if _, err := w.Write(o.Data); err != nil {
			return err
		}
	}
	return nil
}

// exitCode is the status a command ends with for a finished job.
func exitCode(j *delegate.Job) int {
	switch {
	case j.Status == delegate.StatusTimeout:
		return ExitTimeout
	case j.Status == delegate.StatusCancelled:
		return ExitCancelled
	case j.ExitCode != nil:
		return *j.ExitCode
	case j.Status == delegate.StatusSuccess:
		return 0
	}
	// Failed before its command ran or without an exit status (the
	// sandbox could not be made, or was lost): delegate's failure.
	return ExitRunError
}

func buildManifest(stdin io.Reader, f runFlags) (delegate.Manifest, error) {
	var m delegate.Manifest
	switch {
	case f.script != "" && f.manifest != "":
		return m, usagef("give --script or --manifest, not both")
	case f.manifest != "":
		var data []byte
		var err error
		if f.manifest == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(f.manifest)
		}
		if err != nil {
			return m, fmt.Errorf("--manifest: %w", err)
		}
		// Validated by the service, after the flags are applied.
		if m, err = jsonin.DecodeManifest(data); err != nil {
			return m, fmt.Errorf("--manifest %s: %w", f.manifest, err)
		}
	case f.script != "":
		m = delegate.Manifest{AgentType: delegate.AgentScript, Task: f.script}
	default:
		return m, usagef("give --script CMD or --manifest FILE")
	}
	if m.StatusMode == "" {
		m.StatusMode = delegate.StatusModeStreaming
	}
	for _, spec := range f.files {
		localPath, remote, err := fileSpec(spec)
		if err != nil {
			return m, err
		}
		data, err := os.ReadFile(localPath)
		if err != nil {
			return m, fmt.Errorf("--file: %w", err)
		}
		m.Files = append(m.Files, delegate.File{Path: remote, Content: base64.StdEncoding.EncodeToString(data)})
	}
	for _, e := range f.envs {
		k, v, ok := strings.Cut(e, "=")
		if !ok || k == "" {
			return m, usagef("--env %q: must be KEY=VALUE", e)
		}
		if m.Env == nil {
			m.Env = map[string]string{}
		}
		m.Env[k] = v
	}
	if f.timeoutSet {
		m.Timeout = new(f.timeout)
	}
	switch {
	case f.workspace != "" && f.git != "":
		return m, usagef("give --workspace DIR or --git URL, not both")
	case f.workspace != "":
		abs, err := filepath.Abs(f.workspace)
		if err != nil {
			return m, usagef("--workspace: %v", err)
		}
		m.Workspace = &delegate.WorkspaceSource{Dir: abs, IncludeIgnored: f.includeIgnored}
	case f.git != "":
		m.Workspace = &delegate.WorkspaceSource{Git: f.git, Ref: f.ref, IncludeIgnored: f.includeIgnored}
	case f.ref != "" || f.includeIgnored:
		return m, usagef("--ref and --include-ignored go with --workspace or --git")
	}
	m.Caches = append(m.Caches, f.caches...)
	if f.memory != "" || f.cpu != 0 {
		if m.Resources == nil {
			m.Resources = &delegate.Resources{}
		}
		if f.memory != "" {
			m.Resources.Memory = f.memory
		}
		if f.cpu != 0 {
			m.Resources.CPU = f.cpu
		}
	}
	return m, nil
}

// fileSpec reads --file LOCAL[:REMOTE]: without REMOTE the file lands in
// /workspace under its base name.
func fileSpec(spec string) (localPath, remote string, err error) {
	localPath, remote, ok := strings.Cut(spec, ":")
	if localPath == "" || (ok && remote == "") {
		return "", "", usagef("--file %q: must be LOCAL or LOCAL:REMOTE", spec)
	}
	if !ok {
		remote = filepath.Base(localPath)
		if remote == "/" || remote == "." || remote == ".." {
			return "", "", usagef("--file %q: name the file in the sandbox with LOCAL:REMOTE", spec)
		}
	}
	return localPath, remote, nil
}
