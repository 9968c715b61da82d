// Package cli is delegate's command line: the commands, their flags and
// help, and what they print. The job commands (run, jobs) use a
// delegate.JobService and nothing else; the commands that need more of the
// program (serve, bench) call the functions that main wires in Program.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/oauthrs"
	"github.com/spf13/cobra"
)

// Exit statuses of the delegate command itself. `delegate run` and
// `delegate jobs result` otherwise exit with the job's own code.
const (
	ExitError = 1 // the command failed
	ExitUsage = 2 // a mistake in the command line or the configuration
	// ExitRunError is what `delegate run` exits with when delegate, not the
	// job, failed (like docker run): the job's own codes pass through.
	ExitRunError = 125
	// ExitTimeout and ExitCancelled stand for a job that timed out or was
	// cancelled (as timeout(1) and a shell's Ctrl-C do).
	ExitTimeout   = 124
	ExitCancelled = 130
)

// Program is what the commands need from the program around them.
type Program struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads the environment (os.Getenv; tests pass their own).
	Getenv  func(string) string
	Version string
	// Open opens the services over cfg's data dir. With runJobs they can
	// run jobs too (a sandbox backend and a started engine); without, they
	// only read and change stored jobs. close releases them, and says
	// what failed to close.
	Open func(ctx context.Context, cfg Config, log *slog.Logger, runJobs bool) (svc Services, close func() error, err error)
	// Serve runs the MCP server until ctx ends.
	Serve func(ctx context.Context, cfg Config, opts ServeOptions, log *slog.Logger) error
	// Bench runs the benchmarks and prints their figures on out.
	Bench func(ctx context.Context, cfg Config, opts BenchOptions, out io.Writer, log *slog.Logger) error
	// MigrateStore is `delegate store migrate` (store.go).
	MigrateStore MigrateStoreFunc
	// Servers is `delegate servers` (servers.go).
	Servers ServersFunc
	// ProxmoxGC and ProxmoxDrain are `delegate proxmox gc` and `drain`
	// (proxmox.go).
	ProxmoxGC    ProxmoxGCFunc
	ProxmoxDrain ProxmoxDrainFunc
	// Dir is the directory relative paths of the command line are taken
	// from ("": this process's own): the client's, for a command handed
	// to a server (HandOff).
	Dir string
	// HandOff is set when the command line came from another process
	// through a server's hand-off socket (internal/handoff, docs/cli.md):
	// the command runs here only when it would run as it would in the
	// process that sent it; otherwise Execute returns ExitDeclined having
	// read and written nothing, and says why in HandOff.Declined.
	HandOff *HandOff
	// PollInterval is how often a command that follows a job reads it
	// again (another process may be driving it). Default 200 ms.
	PollInterval time.Duration
}

// HandOff is a server's side of a handed command (Program.HandOff).
type HandOff struct {
	// Server is the configuration the server runs with.
	Server Config
	// Declined is why the command was not run, when it was not.
	Declined string
}

// ExitDeclined is what Execute returns for a handed command it did not
// run (Program.HandOff); never a process's status.
const ExitDeclined = -1

// declined ends a handed command before it does anything.
type declined struct{ why string }

func (d declined) Error() string { return "handed command declined: " + d.why }

// Services are the services the commands use, each by name: main wires
// them (the engine is every one), so that a service the engine stops
// implementing fails the build instead of a command at run time. Jobs is
// required; a command that needs a nil other says this delegate has none.
type Services struct {
	Jobs       delegate.JobService
	Sandboxes  delegate.SandboxService
	Questions  delegate.QuestionService
	Network    delegate.NetworkService
	Workspaces delegate.WorkspaceService
	Retention  delegate.RetentionService
	// Principals: delegate's own tokens and the audit trail.
	Principals delegate.PrincipalService
	// Checkpoints: sandboxes checkpoint|rollback|fork|checkpoints.
	Checkpoints delegate.CheckpointService
}

// closeInto closes what close releases, joining what failed to *err.
func closeInto(err *error, close func() error) {
	if cerr := close(); cerr != nil {
		*err = errors.Join(*err, cerr)
	}
}

// ServeOptions are the flags of `delegate serve`.
type ServeOptions struct {
	// HTTPAddr serves MCP over Streamable HTTP at this address; "" for stdio.
	HTTPAddr       string
	SessionTimeout time.Duration
	// MaxSessions caps the live MCP sessions over HTTP.
	MaxSessions int
	// TLSCert and TLSKey serve HTTPS.
	TLSCert, TLSKey string
	// Token guards /mcp, /metrics and the dashboard; nil: nothing (only
	// allowed on the loopback interface).
	Token *httpauth.Token
	// OAuth accepts an external issuer's access tokens at /mcp and
	// /metrics besides (DELEGATE_OAUTH_*); nil: none.
	OAuth *oauthrs.Verifier
}

// BenchOptions are the flags of `delegate bench`.
type BenchOptions struct {
	Runs int
	// Load runs this many sleeping jobs at once instead (0: no), each
	// sleeping for Sleep, with the concurrency limit raised to Load.
	Load  int
	Sleep time.Duration
	// ProxmoxSim measures Proxmox jobs against the simulator, with the
	// real-world latencies divided by Scale.
	ProxmoxSim bool
	Scale      float64
	// ControlPlane measures the control plane of these binaries' servers
	// instead (MCP calls, a full store, callbacks), side by side when two
	// are given: this build (the running binary) first.
	ControlPlane []string
	// StoreJobs is, with ControlPlane, the jobs in the store when
	// list_jobs and the memory are measured (0: the bench's default).
	StoreJobs int
}

// usageError is a mistake in the command line.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// configError is an invalid setting in the environment.
type configError struct{ error }

// jobExit ends the command with a job's exit status; what to say about the
// job has already been printed.
type jobExit int

func (e jobExit) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Execute runs the command line args (without the program name) and
// returns the exit status. Errors are printed once, on stderr.
func Execute(ctx context.Context, p Program, args []string) int {
	if p.PollInterval <= 0 {
		p.PollInterval = 200 * time.Millisecond
	}
	if p.Getenv == nil {
		p.Getenv = func(string) string { return "" }
	}
	root := p.root()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var code jobExit
	if errors.As(err, &code) {
		return int(code)
	}
	var d declined
	if errors.As(err, &d) && p.HandOff != nil {
		p.HandOff.Declined = d.why
		return ExitDeclined
	}
	name := "delegate"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(p.Stderr, "%s: %v\n", name, err)
	// exec, like run, passes a command's exit codes through.
	inRun := cmd != nil && (cmd.Name() == "run" || cmd.Name() == "exec") && cmd.Parent() == root
	var usage usageError
	var config configError
	if errors.As(err, &usage) {
		fmt.Fprintf(p.Stderr, "Run '%s --help' for usage.\n", name)
		if inRun {
			return ExitRunError
		}
		return ExitUsage
	}
	exit, hint := serviceExit(err)
	if h := sandboxHint(err); h != "" {
		hint = h
	}
	if hint != "" {
		fmt.Fprintln(p.Stderr, hint)
	}
	switch {
	case inRun:
		return ExitRunError
	case errors.As(err, &config):
		return ExitUsage
	}
	return exit
}

func (p *Program) root() *cobra.Command {
	cfg, cfgErr := LoadConfig(p.Getenv)
	root := &cobra.Command{
		Use:   "delegate",
		Short: "Run jobs in isolated sandboxes, for AI agents (over MCP) and people",
		Long: "delegate runs jobs in isolated sandboxes, for AI agents (over MCP) and people.\n\n" +
			"Configuration comes from the environment; flags override it.",
		Version: p.Version,
		Args:    cobra.ArbitraryArgs,
		// The commands print their own errors, once (see Execute).
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Name() == "help" || cmd.Name() == "version" {
				return nil // they read no configuration
			}
			if p.Dir != "" && !filepath.IsAbs(cfg.DataDir) {
				cfg.DataDir = filepath.Join(p.Dir, cfg.DataDir)
			}
			var err error
			if cfgErr != nil {
				err = configError{cfgErr}
			} else if cerr := cfg.check(); cerr != nil {
				err = usageError{cerr}
			}
			if p.HandOff != nil {
				// Before anything is said: a refusal is silent, and the
				// process that sent the command runs it (and says what
				// is wrong with its settings).
				if err != nil {
					return declined{"the settings: " + err.Error()}
				}
				if why := p.HandOff.refusal(cmd, cfg); why != "" {
					return declined{why}
				}
			}
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return cmd.Help()
		},
	}
	root.SetIn(p.Stdin)
	root.SetOut(p.Stdout)
	root.SetErr(p.Stderr)
	root.SetVersionTemplate("delegate {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// The settings table joins the usage template when usage is first
	// written, not at every start: building it (a tabwriter over every
	// setting) was 2% of a CLI command's start (issue 41, item 2).
	root.SetUsageFunc(func(c *cobra.Command) error {
		root.SetUsageFunc(nil) // cobra's own from now on
		root.SetUsageTemplate(root.UsageTemplate() + environmentHelp())
		return c.UsageFunc()(c)
	})
	root.CompletionOptions.DisableDefaultCmd = true
	cfg.addDataDirFlag(root.PersistentFlags())
	root.AddCommand(
		p.serveCmd(&cfg),
		p.runCmd(&cfg),
		p.jobsCmd(&cfg),
		p.sandboxesCmd(&cfg), p.execCmd(&cfg), p.cpCmd(&cfg),
		p.pveSimCmd(&cfg),
		p.benchCmd(&cfg),
		p.gcCmd(&cfg),
		p.proxmoxCmd(&cfg),
		p.storeCmd(&cfg),
		p.tokensCmd(&cfg), p.auditCmd(&cfg),
		p.serversCmd(&cfg),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  noArgs,
			Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "delegate", p.Version) },
		},
	)
	return root
}

// environmentHelp is the settings table shown with the root command's
// usage only.
func environmentHelp() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, v := range envVars() {
		line := v.help
		if v.def != "" {
			line += " (default " + v.def + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", v.name, line)
	}
	tw.Flush()
	text := strings.ReplaceAll(b.String(), "{{", "{{`{{`}}")
	return "{{if not .HasParent}}\nEnvironment:\n" + text + "{{end}}"
}

func unknownCommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return usageError{errors.New(msg)}
}

// noArgs and exactArgs check positional arguments as usage errors.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < len(names) {
			return usagef("missing %s", strings.Join(names[len(args):], " and "))
		}
		if len(args) > len(names) {
			return usagef("unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
