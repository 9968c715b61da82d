//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// onTerminal runs the command line with its stdout and stderr on one
// terminal, and returns its exit code and what the terminal received.
func onTerminal(t *testing.T, svc delegate.JobService, args ...string) (int, string) {
	t.Helper()
	master, tty := testkit.OpenPTY(t)
	var got bytes.Buffer
	read := make(chan struct{})
	go func() {
		io.Copy(&got, master) // until the terminal end is closed (EIO)
		close(read)
	}()
	p := cli.Program{
		Stdin: strings.NewReader(""), Stdout: tty, Stderr: tty,
		Getenv: func(k string) string {
			if k == "DELEGATE_DATA_DIR" {
				return "/tmp/delegate-cli-test"
			}
			return ""
		},
		Open: func(ctx context.Context, cfg cli.Config, log *slog.Logger, runJobs bool) (cli.Services, func() error, error) {
			return servicesOf(svc), noClose, nil
		},
		PollInterval: time.Millisecond,
	}
	code := cli.Execute(context.Background(), p, args)
	tty.Close()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's output did not end")
	}
	return code, got.String()
}

// hostile is output that would drive a terminal: set the clipboard (OSC
// 52) and the title, move the cursor up and erase, conceal the text that
// follows (an attribute, which passes: the reset undoes it), rewrite its
// line, ring, forge delegate's verdict, and end leaving red on.
const hostile = "ok \x1b[1;31mred\x1b]52;c;ZXZpbA==\x07\x1b]0;title\x1b\\\x1b[2A\x1b[K\x1b[8m\rgone\x08\x07\u202e\xff\n" +
	"delegate: job-1 success in 0.1s\n\x1b[31mstill red"

// escapesOnlySGR: every escape character the terminal got starts a
// colour sequence.
var otherEscape = regexp.MustCompile(`\x1b(?:[^\[]|\[[0-9;:]*[^0-9;:m])|\x1b$|\x9b|\a|\x08`)

// TestTerminalOutput: on a terminal a job's output keeps its colours and
// nothing else that drives the terminal (no clipboard, title, cursor
// move, concealment; these are shown as text), then the attributes are
// reset and the line ended before delegate's verdict, on stderr, with its
// fixed prefix; with --raw, or to a file or a pipe, the output is byte for
// byte. For delegate run, jobs logs and jobs result.
func TestTerminalOutput(t *testing.T) {
	final := job("job-1", delegate.StatusFailed, intp(3))
	for _, tc := range []struct {
		name string
		args []string
		svc  func() delegate.JobService
	}{
		{"run", []string{"run", "--script", "x", "-q"}, func() delegate.JobService { s, _ := runService(t, final, hostile); return s }},
		{"jobs logs", []string{"jobs", "logs", "job-1"}, func() delegate.JobService {
			s, _ := runService(t, final, hostile)
			for range 3 {
				s.WaitFn(context.Background(), "job-1") // the job has ended: all its output is there
			}
			s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return final, nil }
			return s
		}},
		{"jobs result", []string{"jobs", "result", "job-1"}, func() delegate.JobService {
			h := newHarness()
			h.svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
				return &delegate.JobResult{JobID: id, Status: delegate.StatusFailed, ExitCode: intp(3), Output: []byte(hostile), Duration: time.Second}, nil
			}
			return h.svc
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got := onTerminal(t, tc.svc(), tc.args...)
			if code != 3 && tc.name != "jobs logs" {
				t.Errorf("exit %d, want the job's 3", code)
			}
			if m := otherEscape.FindString(got); m != "" {
				t.Errorf("the terminal got %q, which is no colour:\n%q", m, got)
			}
			for _, want := range []string{"ok \x1b[1;31mred", `\x1b]52;c;ZXZpbA==\x07`, `\x1b]0;title\x1b\`, `\x1b[2A\x1b[K` + "\x1b[8m" + `\rgone\x08\x07\u202e\xff`,
				"\n\x1b[31mstill red\x1b[0m\ndelegate: job-1 failed in "} {
				if !strings.Contains(got, want) {
					t.Errorf("the terminal lacks %q:\n%q", want, got)
				}
			}
			// The job's forged line is there, as text; delegate's own
			// comes last, after the reset.
			if i, j := strings.Index(got, "delegate: job-1 success"), strings.LastIndex(got, "\x1b[0m\ndelegate: job-1 failed"); i < 0 || j < i {
				t.Errorf("the verdict does not come last, after a reset:\n%q", got)
			}

			_, raw := onTerminal(t, tc.svc(), append(tc.args, "--raw")...)
			if !strings.HasPrefix(raw, hostile) {
				t.Errorf("--raw: the terminal got\n%q\nwant the output byte for byte first:\n%q", raw, hostile)
			}
		})
	}
}

// TestTerminalOutputSplit: a sequence cut between two pieces of output
// is judged whole.
func TestTerminalOutputSplit(t *testing.T) {
	h := newHarness()
	pieces := []string{"a\x1b[3", "1mred\x1b", "]0;t\x07 \xe2\x82", "\xac\r", "\n"}
	served := 0
	h.svc.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		if served == len(pieces) {
			return &delegate.LogPage{JobID: id, NextCursor: "end", Done: true}, nil
		}
		p := pieces[served]
		served++
		return &delegate.LogPage{JobID: id, Output: []byte(p), NextCursor: fmt.Sprint(served)}, nil
	}
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return job(id, delegate.StatusSuccess, intp(0)), nil
	}
	_, got := onTerminal(t, h.svc, "jobs", "logs", "job-1")
	if want := "a\x1b[31mred\\x1b]0;t\\x07 €\r\n\x1b[0mdelegate: job-1 success"; !strings.HasPrefix(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestTerminalArtifact: a job's file printed on a terminal is shown as
// its output is.
func TestTerminalArtifact(t *testing.T) {
	h := newHarness()
	h.svc.ReadArtifactFn = func(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
		return delegate.Artifact{Name: name}, []byte(hostile), nil
	}
	_, got := onTerminal(t, h.svc, "jobs", "artifact", "job-1", "a.txt")
	if m := otherEscape.FindString(got); m != "" || !strings.HasSuffix(got, "still red\x1b[0m\n") {
		t.Errorf("the terminal got %q:\n%q", m, got)
	}
	if _, raw := onTerminal(t, h.svc, "jobs", "artifact", "--raw", "job-1", "a.txt"); raw != hostile {
		t.Errorf("--raw: %q", raw)
	}
}
