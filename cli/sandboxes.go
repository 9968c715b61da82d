package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// Kept sandboxes: `delegate sandboxes` opens, lists, shows and releases
// them, `delegate exec` (exec.go) runs a command in one, `delegate cp`
// copies a file in or out. The commands use Services.Sandboxes (the
// engine, as main wires it).

// withSandboxes runs fn with the sandbox service over the data dir; with
// runJobs, over a backend too (opening a sandbox, reaching its files,
// destroying it need one).
func (p *Program) withSandboxes(ctx context.Context, cfg Config, runJobs bool, fn func(delegate.SandboxService) error) (err error) {
	s, closeSvc, err := p.Open(ctx, cfg, newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)), runJobs)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeSvc)
	if s.Sandboxes == nil {
		return errors.New("this delegate keeps no sandboxes")
	}
	return fn(s.Sandboxes)
}

// sandboxHint is what to do about a sandbox that is not found; "" for
// any other error (Execute prints it in place of serviceExit's hint).
func sandboxHint(err error) string {
	var nf *delegate.NotFoundError
	if errors.As(err, &nf) && nf.Resource == "sandbox" {
		return "'delegate sandboxes list' shows the sandboxes."
	}
	return ""
}

func (p *Program) sandboxesCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandboxes",
		Aliases: []string{"sandbox"},
		Short:   "Open, list, show and release kept sandboxes",
		Long: `A kept sandbox outlives its commands: "delegate exec ID -- CMD" runs one
command after another in it, with the files, processes and network the
earlier ones left; "delegate cp" copies files in and out. It is made by
"sandboxes open", or by a job with lifecycle persistent. Commands of one
sandbox trust each other: each can read the others' files, environment and
secrets. A sandbox idle for its idle timeout (DELEGATE_SANDBOX_IDLE) is
paused, keeping its memory, and resumed by the next command or copy; it is
destroyed when it has been paused for DELEGATE_SANDBOX_PAUSE, when its
lifetime (DELEGATE_SANDBOX_LIFETIME) ends, or by "sandboxes release".`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(p.sandboxesOpenCmd(cfg), p.sandboxesListCmd(cfg), p.sandboxesShowCmd(cfg), p.sandboxesReleaseCmd(cfg),
		p.sandboxesCheckpointCmd(cfg), p.sandboxesRollbackCmd(cfg), p.sandboxesForkCmd(cfg), p.sandboxesCheckpointsCmd(cfg))
	return cmd
}

// sandboxFlags are the flags of `delegate sandboxes open`.
type sandboxFlags struct {
	memory, disk, rootfs, network string
	cpu                           float64
	idle, lifetime                int // seconds; 0 for the server's default
	asJSON                        bool
	// A project in it, as run's flags say one (sandboxopen.go).
	workspace, git, ref string
	includeIgnored      bool
	caches              []string
}

// spec is the SandboxSpec the flags ask for.
func (f sandboxFlags) spec() (delegate.SandboxSpec, error) {
	s := delegate.SandboxSpec{VMTemplate: f.rootfs, Network: networkFlag(f.network)}
	if f.memory != "" || f.cpu != 0 || f.disk != "" {
		s.Resources = &delegate.Resources{Memory: f.memory, CPU: f.cpu, Disk: f.disk}
	}
	for _, d := range []struct {
		flag string
		v    int
		to   *int
	}{{"--idle", f.idle, &s.IdleTimeout}, {"--lifetime", f.lifetime, &s.Lifetime}} {
		if d.v < 0 {
			return s, usagef("%s: must be at least 1s, like 30m or 2h (got %ds)", d.flag, d.v)
		}
		*d.to = d.v
	}
	if err := s.Validate(); err != nil {
		return s, usageError{sandboxFlagError(err)}
	}
	return s, nil
}

// sandboxFlagError names the flag for a spec field the service refused.
func sandboxFlagError(err error) error {
	var fe *delegate.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	flag, ok := map[string]string{
		"manifest.resources.memory": "--memory", "manifest.resources.cpu": "--cpu", "manifest.resources.disk": "--disk",
		"manifest.vmTemplate": "--rootfs", "manifest.network": "--network", "idle_timeout": "--idle", "lifetime": "--lifetime",
		"resources.memory": "--memory", "resources.cpu": "--cpu", "resources.disk": "--disk", "vmTemplate": "--rootfs", "network": "--network",
	}[fe.Field]
	if rest, cut := strings.CutPrefix(strings.TrimPrefix(fe.Field, "manifest."), "network."); cut {
		flag, ok = "--network ("+rest+")", true // a rule of an allowlist
	}
	if !ok {
		return err
	}
	return fmt.Errorf("%s: %s", flag, fe.Rule)
}

func (p *Program) sandboxesOpenCmd(cfg *Config) *cobra.Command {
	var f sandboxFlags
	cmd := &cobra.Command{
		Use:   "open [flags]",
		Short: "Open a kept sandbox and print its id",
		Long: `Open a kept sandbox with no command run yet, and print its id on stdout
(--json: all of it). Limits the flags leave out are the server's defaults.
With --workspace DIR or --git URL the project is copied into /workspace first
(as run --keep does: 'delegate jobs diff ID' and 'jobs apply ID' bring its
changes back), and --cache keeps a cache of it.`,
		Example: `  id=$(delegate sandboxes open --memory 1G --idle 10m)
  delegate exec "$id" -- uname -a
  id=$(delegate sandboxes open --workspace . --cache go)`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if f.workspace != "" || f.git != "" || len(f.caches) > 0 || f.ref != "" || f.includeIgnored {
				return p.openWithProject(ctx, *cfg, f)
			}
			spec, err := f.spec()
			if err != nil {
				return err
			}
			return p.withSandboxes(ctx, *cfg, true, func(svc delegate.SandboxService) error {
				sb, err := svc.OpenSandbox(ctx, spec)
				if err != nil {
					return sandboxFlagError(err)
				}
				if f.asJSON {
					return p.printJSON(sb)
				}
				fmt.Fprintln(p.Stdout, sb.ID)
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M (kept while it is paused)")
	fs.Float64Var(&f.cpu, "cpu", 0, "cpu cores")
	fs.StringVar(&f.disk, "disk", "", "workspace disk, e.g. 1G")
	fs.StringVar(&f.rootfs, "rootfs", "", "root file system (local) or VM template (Proxmox)")
	fs.StringVar(&f.network, "network", "", "none (default), egress, or an allowlist `pypi.org,github.com:443`")
	fs.Var(secondsFlag{&f.idle}, "idle", "idle this long, it is paused: seconds or e.g. 30m (default DELEGATE_SANDBOX_IDLE)")
	fs.Var(secondsFlag{&f.lifetime}, "lifetime", "destroyed after this long: seconds or e.g. 8h (default DELEGATE_SANDBOX_LIFETIME)")
	fs.StringVar(&f.workspace, "workspace", "", "copy `DIR` (a git work tree as git sees it) into /workspace; 'delegate jobs diff ID' and 'jobs apply ID' bring the changes back")
	fs.StringVar(&f.git, "git", "", "clone the `URL` (https, or a repository's path under an allowed root) into /workspace instead")
	fs.StringVar(&f.ref, "ref", "", "the branch, tag or commit of --git")
	fs.BoolVar(&f.includeIgnored, "include-ignored", false, "with --workspace: copy the files git ignores too")
	fs.StringArrayVar(&f.caches, "cache", nil, "keep the `NAME` cache of the project: go, npm, pip, cargo (repeatable)")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON: the sandbox")
	return cmd
}

func (p *Program) sandboxesListCmd(cfg *Config) *cobra.Command {
	var all, asJSON bool
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List kept sandboxes, newest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return p.withSandboxes(ctx, *cfg, false, func(svc delegate.SandboxService) error {
				list, err := svc.ListSandboxes(ctx, delegate.SandboxListOptions{All: all})
				if err != nil {
					return flagError(err)
				}
				if asJSON {
					// The shape of "jobs list --json": an object, its list
					// named.
					if list == nil {
						list = []delegate.Sandbox{}
					}
					return p.printJSON(struct {
						Sandboxes []delegate.Sandbox `json:"sandboxes"`
					}{list})
				}
				now := time.Now()
				tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SANDBOX\tSTATE\tAGE\tIDLE\tCOMMANDS\tEXPIRES")
				for _, sb := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", sb.ID, sb.State, shortDuration(now.Sub(sb.CreatedAt)), idleFor(&sb, now),
						sb.Commands, expiresIn(&sb, now))
				}
				tw.Flush()
				if len(list) == 0 && !all {
					fmt.Fprintln(p.Stderr, "no kept sandboxes ('delegate sandboxes open' opens one; --all lists those gone too)")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "also those released or gone")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// idleFor is how long a sandbox has been idle ("-" while a command runs
// in it, or once it is gone).
func idleFor(sb *delegate.Sandbox, now time.Time) string {
	if sb.State != delegate.SandboxIdle && sb.State != delegate.SandboxPaused {
		return "-"
	}
	return shortDuration(now.Sub(sb.LastUsedAt))
}

// expiresIn is how long until its lifetime ends ("-" once it is gone).
func expiresIn(sb *delegate.Sandbox, now time.Time) string {
	if sb.State.Terminal() || sb.ExpiresAt.IsZero() {
		return "-"
	}
	return "in " + shortDuration(sb.ExpiresAt.Sub(now))
}

// shortDuration is d to two units: 45s, 12m05s, 3h07m, 2d04h.
func shortDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 48*3600:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
}

func (p *Program) sandboxesShowCmd(cfg *Config) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID [flags]",
		Short: "Show a kept sandbox: its state, limits, times and commands",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withSandboxes(ctx, *cfg, false, func(svc delegate.SandboxService) error {
				sb, err := svc.GetSandbox(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return p.printJSON(sb)
				}
				p.printSandbox(sb, time.Now())
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (p *Program) printSandbox(sb *delegate.Sandbox, now time.Time) {
	w := p.Stdout
	fmt.Fprintf(w, "%s %s", sb.ID, sb.State)
	if sb.Reason != "" {
		fmt.Fprintf(w, ": %s", safe(sb.Reason))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{name}, args...)...)
	}
	at := func(t time.Time) string { return t.Local().Format(time.DateTime) }
	if sb.JobID != "" {
		row("made by", "%s (lifecycle persistent)", sb.JobID)
	}
	r := sb.Resources
	network := sb.Network
	if network.IsZero() {
		network.Mode = delegate.NetworkNone
	}
	row("limits", "%g CPU, %s memory, %s disk, network %s", r.CPU, dash(r.Memory), dash(r.Disk), network)
	row("backend", "%s%s", sb.Backend, map[bool]string{true: ", " + safe(sb.Template)}[sb.Template != ""])
	row("created", "%s (%s ago)", at(sb.CreatedAt), shortDuration(now.Sub(sb.CreatedAt)))
	if !sb.LastUsedAt.IsZero() {
		row("last used", "%s (%s ago)", at(sb.LastUsedAt), shortDuration(now.Sub(sb.LastUsedAt)))
	}
	if !sb.PausedAt.IsZero() && sb.State == delegate.SandboxPaused {
		row("paused", "%s", at(sb.PausedAt))
	}
	if sb.State.Terminal() {
		if !sb.EndedAt.IsZero() {
			row("ended", "%s", at(sb.EndedAt))
		}
	} else {
		if sb.IdleTimeout > 0 {
			row("timers", "paused after %s idle, destroyed after %s paused", sb.IdleTimeout, sb.PauseTimeout)
		}
		row("expires", "%s (%s)", at(sb.ExpiresAt), expiresIn(sb, now))
	}
	row("commands", "%d run, %d running", sb.Commands, sb.Running)
	tw.Flush()
}

func (p *Program) sandboxesReleaseCmd(cfg *Config) *cobra.Command {
	return &cobra.Command{
		Use:   "release ID",
		Short: "Destroy a kept sandbox, its files and its processes",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withSandboxes(ctx, *cfg, true, func(svc delegate.SandboxService) error {
				sb, released, err := svc.ReleaseSandbox(ctx, args[0])
				if err != nil {
					return err
				}
				if released {
					fmt.Fprintf(p.Stdout, "%s released\n", sb.ID)
				} else {
					fmt.Fprintf(p.Stdout, "%s was %s already", sb.ID, sb.State)
					if sb.Reason != "" {
						fmt.Fprintf(p.Stdout, ": %s", safe(sb.Reason))
					}
					fmt.Fprintln(p.Stdout)
				}
				return nil
			})
		},
	}
}

// A cp operand is ID:PATH in a sandbox, or a local path ("-" for the
// standard streams). A local path that looks like ID:PATH is written
// ./ID:PATH.
type cpOperand struct {
	sandbox, path string
}

func parseOperand(s string) cpOperand {
	if id, p, ok := strings.Cut(s, ":"); ok && delegate.CheckSandboxID("", id) == nil {
		return cpOperand{sandbox: id, path: p}
	}
	return cpOperand{path: s}
}

func (p *Program) cpCmd(cfg *Config) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "cp [-r] SRC DST",
		Short: "Copy a file, or a directory's tree (-r), into or out of a kept sandbox",
		Long: fmt.Sprintf(`Copy one file into a kept sandbox (cp LOCAL ID:PATH) or out of one
(cp ID:PATH LOCAL). PATH is relative to the sandbox's /workspace; parent
directories are made. LOCAL "-" is standard input or output; a LOCAL
directory receives the file under its base name. A file copied in keeps its
permissions; one copied out is read %d bytes at a time.

With -r, a directory's tree is copied as a tar stream, permissions and times
kept; a destination that is a directory receives it under the source's base
name (as cp -r does). Links come in as links; on the way out a link is
refused and nothing is written, as 'jobs apply' refuses one.`, delegate.MaxFileRead),
		Example: `  delegate cp main.go sbx-3f2a:src/main.go
  delegate cp sbx-3f2a:out/report.txt .
  delegate cp sbx-3f2a:build.log - | tail
  delegate cp -r testdata sbx-3f2a:testdata
  delegate cp -r sbx-3f2a:out ./out`,
		Args: exactArgs("SRC", "DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseOperand(args[0]), parseOperand(args[1])
			switch {
			case src.sandbox != "" && dst.sandbox != "":
				return usagef("copy between a sandbox and a local file: both %q and %q name sandboxes", args[0], args[1])
			case src.sandbox == "" && dst.sandbox == "":
				return usagef("name the sandbox's side as ID:PATH (neither %q nor %q does; write a local file with a colon as ./%s)",
					args[0], args[1], args[0])
			case src.sandbox != "" && src.path == "" || dst.sandbox != "" && dst.path == "":
				return usagef("ID:PATH needs a PATH after the colon")
			}
			ctx := cmd.Context()
			if recursive {
				if dst.sandbox != "" {
					return p.copyTreeIn(ctx, *cfg, src.path, dst)
				}
				return p.copyTreeOut(ctx, *cfg, src, dst.path)
			}
			if dst.sandbox != "" {
				// The local side is read first: its mistakes need no service.
				data, mode, err := p.readLocal(src.path)
				if err != nil {
					return err
				}
				return p.withSandboxes(ctx, *cfg, true, func(svc delegate.SandboxService) error {
					if err := svc.WriteSandboxFile(ctx, dst.sandbox, dst.path, data, mode); err != nil {
						return err
					}
					fmt.Fprintf(p.Stderr, "%s:%s: %d bytes\n", dst.sandbox, safe(dst.path), len(data))
					return nil
				})
			}
			target := dst.path
			if target != "-" {
				if fi, err := os.Stat(target); err == nil && fi.IsDir() {
					target = filepath.Join(target, path.Base(src.path))
				}
				if fi, err := os.Stat(filepath.Dir(target)); err != nil || !fi.IsDir() {
					return usagef("%s: no such directory to copy into", filepath.Dir(target))
				}
			}
			return p.withSandboxes(ctx, *cfg, true, func(svc delegate.SandboxService) error {
				return p.copyOut(ctx, svc, src, target)
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy a directory's tree, as a tar stream")
	return cmd
}

// readLocal reads the file cp copies in ("-": standard input) and the
// permissions it gets there.
func (p *Program) readLocal(local string) ([]byte, fs.FileMode, error) {
	if local == "-" {
		data, err := io.ReadAll(p.Stdin)
		if err != nil {
			return nil, 0, fmt.Errorf("standard input: %w", err)
		}
		return data, 0o644, nil
	}
	fi, err := os.Stat(local)
	if err != nil {
		return nil, 0, usageError{err}
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, usagef("%s: not a regular file (cp copies one file; cp -r a directory's tree)", local)
	}
	data, err := os.ReadFile(local)
	return data, fi.Mode().Perm(), err
}

// copyOut reads a sandbox's file a read at a time into target ("-":
// standard output).
func (p *Program) copyOut(ctx context.Context, svc delegate.SandboxService, src cpOperand, target string) (err error) {
	var w io.Writer = p.Stdout
	var tmp *os.File
	if target != "-" {
		// A temporary file beside the target, renamed over it once the
		// whole file is in: a failed copy leaves no half file.
		if tmp, err = os.CreateTemp(filepath.Dir(target), ".delegate-cp-*"); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		w = tmp
	}
	var offset int64
	for {
		fc, err := svc.ReadSandboxFile(ctx, src.sandbox, src.path, offset, delegate.MaxFileRead)
		if err != nil {
			return err
		}
		if _, err := w.Write(fc.Data); err != nil {
			return err
		}
		offset += int64(len(fc.Data))
		if fc.EOF {
			break
		}
		if len(fc.Data) == 0 {
			return fmt.Errorf("%s:%s: the sandbox returned no bytes at offset %d of %d", src.sandbox, safe(src.path), offset, fc.Size)
		}
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return err
	}
	fmt.Fprintf(p.Stderr, "%s: %d bytes\n", target, offset)
	return nil
}
