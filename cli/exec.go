package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// execFlags are the flags of `delegate exec`.
type execFlags struct {
	envs       []string
	timeout    int
	timeoutSet bool
	noStdin    bool
	raw        bool
}

func (p *Program) execCmd(cfg *Config) *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG...]",
		Short: "Run a command in a kept sandbox",
		Long: `Run a command in a kept sandbox (see "delegate sandboxes"): with the files,
processes and network earlier commands left there. The command is a job like
any other ("delegate jobs status", "jobs logs"). Its stdout goes to stdout
and its stderr to stderr as they are written, and delegate exits with its
exit code (124 when it timed out, 130 when it was cancelled; Ctrl-C cancels
it, which kills its processes, not the sandbox). When delegate itself fails
(a bad flag, no such sandbox) it exits 125.

CMD and its arguments are run as they are given, without a shell: for shell
syntax (pipes, redirections, globs) run sh -c 'SCRIPT'. Standard input, when
it is a pipe or a file, is passed to the command (--no-stdin: none).`,
		Example: `  delegate exec sbx-3f2a -- make test
  delegate exec sbx-3f2a -- sh -c 'echo hi > f && cat f'
  delegate exec sbx-3f2a --env DEBUG=1 --timeout 600 -- ./run.sh --fast`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0:
				return usagef("missing ID and CMD")
			case dash == 0:
				return usagef("missing ID before --")
			case dash < 0 && len(args) == 1:
				return usagef("missing CMD (after --)")
			case dash < 0:
				return usagef("put -- between ID and CMD: delegate exec %s -- %s", args[0], strings.Join(args[1:], " "))
			case dash > 1:
				return usagef("unexpected argument %q before --", args[1])
			case len(args) == 1:
				return usagef("missing CMD after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			f.timeoutSet = cmd.Flags().Changed("timeout")
			return p.exec(cmd.Context(), *cfg, args[0], args[1:], f)
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringArrayVar(&f.envs, "env", nil, "environment variable `KEY=VALUE` (repeatable)")
	fs.Var(secondsFlag{&f.timeout}, "timeout", "timeout: seconds or e.g. 10m (default DEFAULT_TIMEOUT)")
	fs.BoolVar(&f.noStdin, "no-stdin", false, "do not pass standard input to the command")
	fs.BoolVar(&f.raw, "raw", false, "write the command's output byte for byte also on a terminal (escape sequences and all)")
	return cmd
}

// execManifest is the job that runs argv in sandbox id.
func execManifest(id string, argv []string, f execFlags) (delegate.Manifest, error) {
	if err := delegate.CheckSandboxID("ID", id); err != nil {
		return delegate.Manifest{}, usageError{err}
	}
	script, err := commandLine(argv)
	if err != nil {
		return delegate.Manifest{}, err
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: script, Sandbox: id, StatusMode: delegate.StatusModeStreaming}
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
	return m, nil
}

// exec runs argv in a kept sandbox and ends with its exit status (a
// jobExit).
func (p *Program) exec(ctx context.Context, cfg Config, id string, argv []string, f execFlags) (err error) {
	m, err := execManifest(id, argv, f)
	if err != nil {
		return err
	}
	if !f.noStdin {
		data, err := commandStdin(p.Stdin, p.Stderr)
		if err != nil {
			return err
		}
		if err := setStdin(&m, data); err != nil {
			return err
		}
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
	// No progress line: a command's output is all it says, as a shell's.
	j, err := p.follow(ctx, svc, job.ID, f.raw, newProgressLine(p.Stderr, true, job.ID))
	if err != nil {
		return err
	}
	// As a shell does, nothing is said of a command that exited (its code
	// says it): only of one that did not.
	// On a terminal, a person reads: the command's job id follows (its
	// status, logs and changes are read by it). To a file or a pipe, its
	// stderr is the command's alone.
	switch {
	case j.ExitCode == nil || j.Status == delegate.StatusTimeout || j.Status == delegate.StatusCancelled:
		fmt.Fprintln(p.Stderr, verdict(j.ID, j.Status, j.Duration(time.Now()), j.ExitCode, delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled), j.Error))
	case isTerminal(p.Stderr):
		fmt.Fprintf(p.Stderr, "delegate: %s exited %d ('delegate jobs status %s')\n", j.ID, *j.ExitCode, j.ID)
	}
	return jobExit(exitCode(j))
}

// stdinNote is how long reading standard input may take before delegate
// says what it waits for (a pipe that is never closed would otherwise
// look like a hang).
const stdinWait = 2 * time.Second

// maxCommandStdin is the most standard input a command is given: it
// travels in the job's manifest (manifest.stdin).
const maxCommandStdin = 1 << 20

// commandStdin reads standard input for the command when it is a pipe, a
// socket or a file: not a terminal, nor a character device (/dev/null).
func commandStdin(stdin io.Reader, stderr io.Writer) ([]byte, error) {
	if stdin == nil {
		return nil, nil
	}
	if f, ok := stdin.(*os.File); ok {
		fi, err := f.Stat()
		if err != nil || fi.Mode()&os.ModeCharDevice != 0 {
			return nil, nil
		}
	}
	note := time.AfterFunc(stdinWait, func() {
		fmt.Fprintln(stderr, "delegate: reading standard input for the command (end it with Ctrl-D, or give --no-stdin)")
	})
	data, err := io.ReadAll(io.LimitReader(stdin, maxCommandStdin+1))
	note.Stop()
	if err != nil {
		return nil, fmt.Errorf("standard input: %w", err)
	}
	if len(data) > maxCommandStdin {
		return nil, usagef("standard input: more than the %d bytes a command takes (copy it in with 'delegate cp', or give --no-stdin)", maxCommandStdin)
	}
	return data, nil
}

// setStdin gives the command its standard input (manifest.stdin).
func setStdin(m *delegate.Manifest, data []byte) error {
	if len(data) > 0 {
		m.Stdin = base64.StdEncoding.EncodeToString(data)
	}
	return nil
}

// commandLine writes argv as a POSIX shell command line that runs exactly
// argv: the job's script, run by /bin/sh (the task is the script input,
// never an argument list). A word made only of characters the shell
// gives no meaning is written as it is, so that the job's task reads as
// typed ("make test"); every other word is single-quoted, inside which
// the shell interprets nothing, and a quote in it is written as '"'"'.
// Words the shell would read otherwise in a command's first place (a
// reserved word such as "if", an assignment such as "A=b") are quoted
// too: they carry '=' or are in reservedWords.
func commandLine(argv []string) (string, error) {
	var b strings.Builder
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return "", usagef("argument %d of CMD has a NUL byte, which no command can be given", i+1)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		if plainWord(a) && !reservedWords[a] {
			b.WriteString(a)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(a, "'", `'"'"'`))
		b.WriteByte('\'')
	}
	return b.String(), nil
}

// plainWord: a non-empty word of letters, digits and _@%+,./:- alone.
func plainWord(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_@%+,./:-", c) >= 0) {
			return false
		}
	}
	return true
}

// reservedWords are the shell's reserved words (POSIX, and bash's and
// dash's own), recognised when unquoted in a command's first place.
var reservedWords = map[string]bool{
	"if": true, "then": true, "else": true, "elif": true, "fi": true, "do": true, "done": true, "case": true, "esac": true,
	"while": true, "until": true, "for": true, "in": true, "function": true, "select": true, "time": true, "coproc": true,
}
