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

// runFlags are the flags of `delegate run`: one for each manifest field.
type runFlags struct {
	script, manifest string
	agent, task      string
	command, model   string
	timeout          int
	timeoutSet       bool // --timeout given, even as 0 (which the service refuses)
	memory, disk     string
	cpu              float64
	network          string
	rootfs           string
	statusMode       string
	keep             bool
	noStdin          bool
	quiet            bool
	raw              bool // the job's output as it is, also on a terminal
	files, envs      []string
	secrets          []string
	artifacts        []string
	// The workspace source (--workspace DIR, or --git URL [--ref REF])
	// and the caches.
	workspace, git, ref string
	includeIgnored      bool
	caches              []string
}

func (p *Program) runCmd(cfg *Config) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run (--script CMD | --task TEXT | --manifest FILE) [flags]",
		Short: "Run one job and print its output",
		Long: `Run one job in a new sandbox: its stdout goes to stdout and its stderr to
stderr as they are written, byte for byte, its progress to stderr too (-q for
none), and delegate exits with the job's exit code (124 when
it timed out, 130 when it was cancelled; Ctrl-C cancels it). When delegate
itself fails (a bad flag, an invalid manifest, no sandbox) it exits 125.

Every manifest field has a flag; with --manifest, the flags given override
its fields (--env, --secret, --artifact and --file add to them).

Standard input, when it is a pipe or a file, is the job's standard input
(at most 1 MiB; "echo in | delegate run --script cat" prints "in"); a
terminal or /dev/null gives none, and so does --no-stdin.

--file DIR sends a directory as its tree, read as you: files with their
execute bit, symbolic links as links (never followed); "--file ." puts the
current directory's contents in /workspace itself, "--file src" in
/workspace/src, "--file src:lib" in /workspace/lib.

--secret NAME sets $NAME in the job to the value of the secret NAME, which
delegate reads where the job runs, never from the command line: for
"delegate run", this command's environment, DELEGATE_SECRET_<NAME> (or
DELEGATE_SECRETS_FILE, lines NAME=value, mode 0600). Secrets are not
stored with the job, and their values are redacted from its output.

On a terminal the job's output is shown with its escape sequences other
than colours written out as text (\x1b]52;...), so that it cannot drive
the terminal, and delegate's verdict follows on a line of its own, on
stderr, after an attribute reset, prefixed "delegate: "; --raw writes the
output byte for byte there too (as always to a file or a pipe).

The job runs in statusMode streaming unless the manifest says otherwise, so
"delegate jobs logs ID --follow" can follow it from another terminal.`,
		Example: `  delegate run --file . --script 'go test ./...' --artifact 'coverage.out'
  delegate run --script 'make test' --file Makefile --file src/main.c:src/main.c
  DELEGATE_SECRET_API_KEY=... delegate run --secret API_KEY --network egress --script './deploy.sh'
  git diff | delegate run --script 'wc -l'
  delegate run --agent claude --task 'Fix the failing test' --file . --secret ANTHROPIC_API_KEY
  delegate run --manifest job.json --timeout 600
  echo '{"task":"uname -a"}' | delegate run --manifest -`,
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
	fs.StringVar(&f.task, "task", "", "the task: with --agent claude the prompt, with --agent custom data in $DELEGATE_TASK")
	fs.StringVar(&f.agent, "agent", "", "agentType: script (default), claude or custom")
	fs.StringVar(&f.command, "command", "", "agent.command: the shell script of --agent custom (or script)")
	fs.StringVar(&f.model, "model", "", "agent.claudeModel, for --agent claude (e.g. sonnet)")
	fs.StringArrayVar(&f.files, "file", nil, "put `LOCAL[:REMOTE]` in the sandbox, a file or a directory's tree (repeatable; REMOTE relative to /workspace, default the base name)")
	fs.StringArrayVar(&f.envs, "env", nil, "environment variable `KEY=VALUE` (repeatable)")
	fs.StringArrayVar(&f.secrets, "secret", nil, "set $`NAME` in the job to the secret NAME, read here from DELEGATE_SECRET_NAME or DELEGATE_SECRETS_FILE (repeatable)")
	fs.StringVar(&f.network, "network", "", "none (default), egress (every public host, through delegate's egress proxy), or an allowlist `pypi.org,*.pythonhosted.org,github.com:443`")
	fs.StringArrayVar(&f.artifacts, "artifact", nil, "keep the files matching `GLOB` (relative to /workspace; ** for any directories; repeatable)")
	fs.BoolVar(&f.keep, "keep", false, "keep the sandbox after the job (lifecycle persistent)")
	fs.StringVar(&f.rootfs, "rootfs", "", "vmTemplate: the root filesystem `NAME` in DELEGATE_ROOTFS_DIR (local), or the VM template (proxmox)")
	fs.Var(secondsFlag{&f.timeout}, "timeout", "timeout: seconds or e.g. 10m (default: the manifest's, else DEFAULT_TIMEOUT)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M")
	fs.Float64Var(&f.cpu, "cpu", 0, "cpu cores")
	fs.StringVar(&f.disk, "disk", "", "size of /workspace, e.g. 1G")
	fs.StringVar(&f.statusMode, "status-mode", "", "simple, detailed or streaming (default streaming)")
	fs.BoolVar(&f.noStdin, "no-stdin", false, "do not pass standard input to the job")
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
func (p *Program) run(ctx context.Context, cfg Config, f runFlags) (err error) {
	m, err := buildManifest(p.Stdin, p.Stderr, f)
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
	s, closeSvc, err := p.Open(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeSvc)
	svc := s.Jobs
	job, err := svc.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		return err
	}
	progress := newProgressLine(p.Stderr, f.quiet, job.ID)
	j, err := p.follow(ctx, svc, job.ID, f.raw, progress)
	if err != nil {
		return err
	}
	progress.done(j)
	if m.Workspace != nil && !f.quiet {
		p.tellChanges(ctx, s.Workspaces, j.ID)
	}
	if j.CacheMissed != "" && !f.quiet {
		fmt.Fprintln(p.Stderr, "delegate: cache "+safe(j.CacheMissed))
	}
	if j.Sandbox != "" {
		// The id the next command needs, even with -q.
		fmt.Fprintf(p.Stderr, "delegate: kept sandbox %s: 'delegate exec %s -- CMD' runs a command in it, 'delegate sandboxes release %s' ends it\n",
			j.Sandbox, j.Sandbox, j.Sandbox)
	}
	if len(j.Manifest.Artifacts) > 0 && !(f.quiet && j.Status == delegate.StatusSuccess) {
		arts, err := svc.Artifacts(context.WithoutCancel(ctx), j.ID)
		if err != nil {
			return err
		}
		printArtifacts(p.Stderr, j.ID, arts)
	}
	return jobExit(exitCode(j))
}

// follow writes a job's output as it comes (stdout to stdout, stderr to
// stderr) and its progress on stderr until the job ends, and returns it
// ended, the terminal's attributes restored. A Ctrl-C (ctx done) cancels
// the job, whose end it still waits for.
func (p *Program) follow(ctx context.Context, svc delegate.JobService, id string, raw bool, progress *progressLine) (*delegate.Job, error) {
	stdout, finishOut := jobOutput(p.Stdout, raw)
	stderr, finishErr := jobOutput(p.Stderr, raw)
	defer func() { finishOut(); finishErr() }() // whatever happens
	out := &logCopier{svc: svc, id: id, w: stdout, errw: stderr, before: progress.clear}
	for {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		j, err := svc.Wait(wctx, id)
		cancel()
		if err != nil {
			return nil, err
		}
		// Not the command's context: after a Ctrl-C the output still counts.
		if _, err := out.copy(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, delegate.ErrNotFinished) {
			return nil, err
		}
		if j.Status.Terminal() {
			return j, nil
		}
		if ctx.Err() != nil {
			// Ctrl-C: cancel the job (a command in a kept sandbox: its
			// processes, not the sandbox), and wait for it to be killed.
			progress.clear()
			fmt.Fprintf(p.Stderr, "delegate: cancelling %s\n", id)
			if _, _, err := svc.Cancel(context.WithoutCancel(ctx), id); err != nil {
				return nil, err
			}
			ctx = context.WithoutCancel(ctx)
			continue
		}
		progress.show(j)
	}
}

// tellChanges says on stderr what the job changed in its workspace, and
// how to have it.
func (p *Program) tellChanges(ctx context.Context, ws delegate.WorkspaceService, id string) {
	if ws == nil {
		return
	}
	c, err := ws.Changes(context.WithoutCancel(ctx), id)
	switch {
	case err != nil:
		return
	case c.Error != "":
		fmt.Fprintf(p.Stderr, "delegate: the workspace's changes were not kept: %s\n", safe(c.Error))
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

// exitCode is the status a command ends with for a finished job, by the
// rule of exit.go (docs/cli.md, "Exit codes"): the job's exit code when it
// exited or was killed for its memory, 124 for a timeout, 130 for a
// cancel, 125 when delegate failed it (it has no exit code, or its
// command exited 0 and the job failed all the same).
func exitCode(j *delegate.Job) int {
	switch {
	case j.Status == delegate.StatusTimeout:
		return ExitTimeout
	case j.Status == delegate.StatusCancelled:
		return ExitCancelled
	case j.ExitCode != nil && (*j.ExitCode != 0 || j.Status == delegate.StatusSuccess):
		return *j.ExitCode
	case j.Status == delegate.StatusSuccess:
		return 0
	}
	// Failed before its command ran or without an exit status (the
	// sandbox could not be made, or was lost), or failed though its
	// command exited 0 (its end or its output could not be kept): never
	// 0 for a job that did not succeed.
	return ExitRunError
}

func buildManifest(stdin io.Reader, stderr io.Writer, f runFlags) (delegate.Manifest, error) {
	var m delegate.Manifest
	switch {
	case f.manifest != "" && (f.script != "" || f.task != ""):
		return m, usagef("give --script (or --task) or --manifest, not both")
	case f.script != "" && f.task != "":
		return m, usagef("give --script or --task, not both (--script is --agent script --task)")
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
		if f.agent != "" && f.agent != string(delegate.AgentScript) {
			return m, usagef("--script runs a shell script: give --task with --agent %s", f.agent)
		}
		m = delegate.Manifest{AgentType: delegate.AgentScript, Task: f.script}
	case f.task != "" || f.command != "":
		m = delegate.Manifest{Task: f.task}
	default:
		return m, usagef("give --script CMD, --task TEXT (with --agent) or --manifest FILE")
	}
	if f.agent != "" {
		m.AgentType = delegate.AgentType(f.agent)
	}
	if f.command != "" || f.model != "" {
		if m.Agent == nil {
			m.Agent = &delegate.AgentConfig{}
		}
		if f.command != "" {
			m.Agent.Command = f.command
		}
		if f.model != "" {
			m.Agent.ClaudeModel = f.model
		}
	}
	if f.statusMode != "" {
		m.StatusMode = delegate.StatusMode(f.statusMode)
	}
	if m.StatusMode == "" {
		m.StatusMode = delegate.StatusModeStreaming
	}
	for _, spec := range f.files {
		localPath, remote, err := fileSpec(spec)
		if err != nil {
			return m, err
		}
		files, err := localFiles(stderr, spec, localPath, remote)
		if err != nil {
			return m, err
		}
		m.Files = append(m.Files, files...)
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
	for _, s := range f.secrets {
		if strings.Contains(s, "=") {
			// A value on the command line would be in the shell's
			// history and every process list.
			return m, usagef("--secret %q: give the secret's NAME; its value is read from DELEGATE_SECRET_<NAME> (or DELEGATE_SECRETS_FILE), never from the command line", s)
		}
		m.Secrets = append(m.Secrets, s)
	}
	m.Artifacts = append(m.Artifacts, f.artifacts...)
	m.Network = networkFlag(f.network)
	if f.keep {
		m.Lifecycle = delegate.LifecyclePersistent
	}
	if f.rootfs != "" {
		m.VMTemplate = f.rootfs
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
	if f.memory != "" || f.cpu != 0 || f.disk != "" {
		if m.Resources == nil {
			m.Resources = &delegate.Resources{}
		}
		if f.memory != "" {
			m.Resources.Memory = f.memory
		}
		if f.cpu != 0 {
			m.Resources.CPU = f.cpu
		}
		if f.disk != "" {
			m.Resources.Disk = f.disk
		}
	}
	if !f.noStdin && f.manifest != "-" && m.AgentType != delegate.AgentClaude {
		data, err := jobStdin(stdin, stderr)
		if err != nil {
			return m, err
		}
		if len(data) > 0 {
			m.Stdin = base64.StdEncoding.EncodeToString(data)
		}
	}
	return m, nil
}

// localFiles reads --file's LOCAL: a file, or a directory's tree.
func localFiles(stderr io.Writer, spec, localPath, remote string) ([]delegate.File, error) {
	fi, err := os.Stat(localPath)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	if fi.IsDir() {
		if remote == "/" {
			remote = "." // "--file /": the contents in /workspace itself, as for "."
		}
		files, skipped, err := treeFiles(localPath, remote)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", localPath, err)
		}
		if len(skipped) > 0 {
			fmt.Fprintf(stderr, "delegate: --file %s: %d special files (sockets, FIFOs, devices) not sent, such as %s\n", localPath, len(skipped), safe(skipped[0]))
		}
		return files, nil
	}
	if remote == "." || remote == "/" {
		return nil, usagef("--file %q: name the file in the sandbox with LOCAL:REMOTE", spec)
	}
	data, err := os.ReadFile(localPath)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	return []delegate.File{{Path: remote, Content: base64.StdEncoding.EncodeToString(data)}}, nil
}

// stdinNote is how long reading standard input may take before delegate
// says what it is waiting for (a pipe that is never closed would
// otherwise look like a hang).
const stdinNote = 2 * time.Second

// jobStdin reads standard input for the job: when it is a pipe, a socket
// or a file; not a terminal nor a character device (/dev/null). At most
// delegate.MaxStdinBytes.
func jobStdin(stdin io.Reader, stderr io.Writer) ([]byte, error) {
	if stdin == nil {
		return nil, nil
	}
	if f, ok := stdin.(*os.File); ok {
		fi, err := f.Stat()
		if err != nil || fi.Mode()&os.ModeCharDevice != 0 {
			return nil, nil
		}
	}
	note := time.AfterFunc(stdinNote, func() {
		fmt.Fprintln(stderr, "delegate: reading standard input for the job (end it with Ctrl-D, or give --no-stdin)")
	})
	data, err := io.ReadAll(io.LimitReader(stdin, delegate.MaxStdinBytes+1))
	note.Stop()
	if err != nil {
		return nil, fmt.Errorf("standard input: %w", err)
	}
	if len(data) > delegate.MaxStdinBytes {
		return nil, usagef("standard input: more than the %d bytes a job takes (send it as a file: --file, or give --no-stdin)", delegate.MaxStdinBytes)
	}
	return data, nil
}

// fileSpec reads --file LOCAL[:REMOTE]: without REMOTE a file or a
// directory lands in /workspace under its base name ("." and "/": the
// directory's contents in /workspace itself).
func fileSpec(spec string) (localPath, remote string, err error) {
	localPath, remote, ok := strings.Cut(spec, ":")
	if localPath == "" || (ok && remote == "") {
		return "", "", usagef("--file %q: must be LOCAL or LOCAL:REMOTE", spec)
	}
	if !ok {
		remote = filepath.Base(localPath)
		if remote == ".." {
			return "", "", usagef("--file %q: name the place in the sandbox with LOCAL:REMOTE", spec)
		}
	}
	return localPath, remote, nil
}

// networkFlag is a --network flag's network: none, egress, or an
// allowlist of comma-separated names (the zero Network when not given).
func networkFlag(flag string) delegate.Network {
	switch mode := delegate.NetworkMode(flag); mode {
	case "":
		return delegate.Network{}
	case delegate.NetworkNone, delegate.NetworkEgress:
		return delegate.Network{Mode: mode}
	default:
		return delegate.Allowlist(strings.Split(flag, ",")...)
	}
}

// secondsFlag is a duration flag read as delegate reads durations
// everywhere (a manifest, MCP's arguments): seconds ("600") or a duration
// of whole seconds ("10m", "1h30m"), delegate.ParseSeconds.
type secondsFlag struct{ n *int }

func (f secondsFlag) String() string {
	if f.n == nil || *f.n == 0 {
		return ""
	}
	return (time.Duration(*f.n) * time.Second).String()
}

func (f secondsFlag) Set(s string) error {
	n, err := delegate.ParseSeconds(s)
	var fe *delegate.FieldError
	if errors.As(err, &fe) {
		return errors.New(fe.Rule)
	}
	*f.n = n
	return nil
}

func (secondsFlag) Type() string { return "duration" }
