package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/mock"
)

// The command line in process, over a mock JobService.

type result struct {
	code           int
	stdout, stderr string
	opened         []cli.Config // what Open was given
	runJobs        []bool
}

type harness struct {
	svc *mock.JobService
	// sbx, if set, is the service's SandboxService (sandboxes_test.go).
	sbx *mock.SandboxService
	// other, if set, is the service Open returns instead of svc.
	other delegate.JobService
	// closeErr is what closing the services reports.
	closeErr error
	env      map[string]string
	stdin    string
	serve    func(cli.ServeOptions) error
	bench    func(cli.BenchOptions) error
}

func (h *harness) run(t *testing.T, args ...string) result {
	t.Helper()
	return h.runCtx(t, context.Background(), args...)
}

func (h *harness) runCtx(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var r result
	var stdout, stderr bytes.Buffer
	var mu sync.Mutex
	p := cli.Program{
		Stdin: strings.NewReader(h.stdin), Stdout: &stdout, Stderr: &stderr,
		Getenv:  func(k string) string { return h.env[k] },
		Version: "1.2.3",
		Open: func(ctx context.Context, cfg cli.Config, log *slog.Logger, runJobs bool) (cli.Services, func() error, error) {
			mu.Lock()
			r.opened, r.runJobs = append(r.opened, cfg), append(r.runJobs, runJobs)
			mu.Unlock()
			if h.sbx != nil {
				return servicesOf(struct {
					*mock.JobService
					*mock.SandboxService
				}{h.svc, h.sbx}), h.close, nil
			}
			if h.other != nil {
				return servicesOf(h.other), h.close, nil
			}
			return servicesOf(h.svc), h.close, nil
		},
		Serve: func(ctx context.Context, cfg cli.Config, opts cli.ServeOptions, log *slog.Logger) error {
			return h.serve(opts)
		},
		Bench: func(ctx context.Context, cfg cli.Config, opts cli.BenchOptions, out io.Writer, log *slog.Logger) error {
			return h.bench(opts)
		},
		PollInterval: time.Millisecond,
	}
	r.code = cli.Execute(ctx, p, args)
	r.stdout, r.stderr = stdout.String(), stderr.String()
	return r
}

func (h *harness) close() error { return h.closeErr }

func newHarness() *harness {
	return &harness{svc: &mock.JobService{}, env: map[string]string{"DELEGATE_DATA_DIR": "/tmp/delegate-cli-test"}}
}

func intp(n int) *int { return &n }

func job(id string, status delegate.Status, exit *int) *delegate.Job {
	return &delegate.Job{ID: id, Status: status, ExitCode: exit, Progress: string(status),
		Manifest:  delegate.Manifest{AgentType: delegate.AgentScript, Task: "make", StatusMode: delegate.StatusModeStreaming},
		CreatedAt: time.Now().Add(-time.Minute), StartedAt: time.Now().Add(-time.Minute), FinishedAt: time.Now()}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"}, {}, {"jobs"}, {"jobs", "--help"}, {"help", "jobs"}, {"jobs", "status", "--help"},
		{"jobs", "logs", "-h"}, {"jobs", "list", "--help"}, {"jobs", "result", "--help"}, {"jobs", "cancel", "--help"},
		{"jobs", "artifact", "--help"}, {"run", "--help"}, {"serve", "--help"}, {"bench", "--help"},
		{"pve-sim", "--help"}, {"help", "pve-sim"}, {"version", "--help"},
	} {
		r := newHarness().run(t, args...)
		want := "delegate " + strings.Join(args, " ")
		if len(args) > 0 && args[0] == "help" {
			want = "delegate " + strings.Join(args[1:], " ")
		}
		want = strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(want, " --help"), " -h"))
		out := r.stdout + r.stderr
		if r.code != 0 || !strings.Contains(out, "Usage:") || !strings.Contains(out, want) {
			t.Errorf("%v: exit %d, no usage line for %q:\n%s", args, r.code, want, out)
		}
	}
	r := newHarness().run(t, "--help")
	if !strings.Contains(r.stdout, "DELEGATE_DATA_DIR") || !strings.Contains(r.stdout, "Environment:") {
		t.Errorf("the root help lists no environment:\n%s", r.stdout)
	}
	if r := newHarness().run(t, "jobs", "--help"); strings.Contains(r.stdout, "Environment:") {
		t.Errorf("the environment is repeated in every command's help")
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if r := newHarness().run(t, args...); r.code != 0 || r.stdout != "delegate 1.2.3\n" {
			t.Errorf("%v: %d %q", args, r.code, r.stdout)
		}
	}
}

// TestUsageErrors: exit 2 (125 for run), the message printed once, with
// the way to the command's help.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
		code int
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate" for "delegate"`, 2},
		{[]string{"sevre"}, `did you mean "serve"?`, 2},
		{[]string{"jobs", "frob"}, `unknown command "frob" for "delegate jobs"`, 2},
		{[]string{"jobs", "status"}, "missing ID", 2},
		{[]string{"jobs", "status", "a", "b"}, `unexpected argument "b"`, 2},
		{[]string{"jobs", "artifact", "job-1"}, "missing NAME", 2},
		{[]string{"jobs", "list", "--status", "done"}, "--status: must be one of pending", 2},
		{[]string{"jobs", "list", "--bogus"}, "unknown flag: --bogus", 2},
		{[]string{"jobs", "list", "--limit", "x"}, `invalid argument "x" for "--limit"`, 2},
		{[]string{"serve", "extra"}, `unexpected argument "extra"`, 2},
		{[]string{"serve", "--max-concurrent", "0"}, "--max-concurrent: must be from 1 to 1024", 2},
		{[]string{"bench", "-n", "0"}, "--runs: must be at least 1", 2},
		{[]string{"pve-sim", "--nodes", "0"}, "--nodes: must be from 1 to 64", 2},
		{[]string{"pve-sim", "--bogus"}, "unknown flag: --bogus", 2},
		{[]string{"run"}, "give --script CMD, --task TEXT (with --agent) or --manifest FILE", 125},
		{[]string{"run", "--script", "x", "--manifest", "m.json"}, "not both", 125},
		{[]string{"run", "--script", "x", "oops"}, `unexpected argument "oops" (quote the script`, 125},
		{[]string{"run", "--bogus"}, "unknown flag: --bogus", 125},
		{[]string{"run", "--script", "x", "--file", ":remote"}, "must be LOCAL or LOCAL:REMOTE", 125},
		{[]string{"run", "--script", "x", "--env", "NOEQUALS"}, "must be KEY=VALUE", 125},
		{[]string{"run", "--script", "x", "--file", "/nonexistent/file"}, "no such file", 125},
	}
	for _, tc := range tests {
		r := newHarness().run(t, tc.args...)
		if r.code != tc.code || strings.Count(r.stderr, tc.want) != 1 {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q once", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
		if r.stdout != "" {
			t.Errorf("%v: stdout %q", tc.args, r.stdout)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	h := newHarness()
	h.env["DEFAULT_TIMEOUT"] = "0"
	for _, tc := range []struct {
		args []string
		code int
	}{{[]string{"jobs", "list"}, 2}, {[]string{"run", "--script", "x"}, 125}} {
		r := h.run(t, tc.args...)
		if r.code != tc.code || strings.Count(r.stderr, "DEFAULT_TIMEOUT") != 1 || len(r.opened) != 0 {
			t.Errorf("%v: exit %d, stderr %q", tc.args, r.code, r.stderr)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help", "jobs"}, {"version"}} {
		if r := h.run(t, args...); r.code != 0 {
			t.Errorf("%v with a bad environment: %d %s", args, r.code, r.stderr)
		}
	}
}

// TestFlagsAnywhere: flags before, between and after arguments.
func TestFlagsAnywhere(t *testing.T) {
	h := newHarness()
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return job(id, delegate.StatusSuccess, intp(0)), nil
	}
	h.svc.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil }
	for _, args := range [][]string{
		{"jobs", "status", "job-1", "--json"},
		{"jobs", "status", "--json", "job-1"},
		{"jobs", "--data-dir", "/tmp/x", "status", "job-1", "--json"},
		{"--data-dir", "/tmp/x", "jobs", "status", "job-1", "--json"},
		{"jobs", "status", "job-1", "--json", "--data-dir=/tmp/x"},
	} {
		r := h.run(t, args...)
		var got map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got["job_id"] != "job-1" {
			t.Errorf("%v: exit %d, stdout %q stderr %q", args, r.code, r.stdout, r.stderr)
		}
		if strings.Contains(strings.Join(args, " "), "/tmp/x") && (len(r.opened) != 1 || r.opened[0].DataDir != "/tmp/x") {
			t.Errorf("%v: --data-dir not applied: %+v", args, r.opened)
		}
	}
	h.svc.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		return &delegate.LogPage{JobID: id, Output: []byte("all\n"), NextCursor: "4", Done: true}, nil
	}
	for _, args := range [][]string{{"jobs", "logs", "job-1", "--follow"}, {"jobs", "logs", "-f", "job-1"}} {
		if r := h.run(t, args...); r.code != 0 || r.stdout != "all\n" {
			t.Errorf("%v: exit %d, stdout %q stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestServeAndBenchFlags(t *testing.T) {
	h := newHarness()
	var serveOpts cli.ServeOptions
	h.serve = func(o cli.ServeOptions) error { serveOpts = o; return nil }
	if r := h.run(t, "serve", "--http", "127.0.0.1:0", "--session-timeout", "1m"); r.code != 0 ||
		serveOpts != (cli.ServeOptions{HTTPAddr: "127.0.0.1:0", SessionTimeout: time.Minute, MaxSessions: 1000}) {
		t.Errorf("serve: %d %+v %s", r.code, serveOpts, r.stderr)
	}
	h.serve = func(cli.ServeOptions) error { return fmt.Errorf("--http: address already in use") }
	if r := h.run(t, "serve", "--http", "127.0.0.1:1"); r.code != 1 || strings.Count(r.stderr, "already in use") != 1 {
		t.Errorf("serve failing: %d %q", r.code, r.stderr)
	}
	var benchOpts cli.BenchOptions
	h.bench = func(o cli.BenchOptions) error { benchOpts = o; return nil }
	if r := h.run(t, "bench", "-n", "50", "--proxmox-sim", "--scale", "20"); r.code != 0 ||
		!reflect.DeepEqual(benchOpts, cli.BenchOptions{Runs: 10, ProxmoxSim: true, Scale: 20, Sleep: 20 * time.Second}) {
		t.Errorf("bench: %d %+v", r.code, benchOpts)
	}
	if r := h.run(t, "bench", "--control-plane", "--against", "/bin/true"); r.code != 0 ||
		len(benchOpts.ControlPlane) != 2 || benchOpts.ControlPlane[1] != "/bin/true" || benchOpts.Runs != 5 {
		t.Errorf("bench --control-plane: %d %+v %s", r.code, benchOpts, r.stderr)
	}
	for _, args := range [][]string{{"bench", "--against", "/bin/true"}, {"bench", "--control-plane", "--load", "5"},
		{"bench", "--control-plane", "--against", "/no/such/binary"}} {
		if r := h.run(t, args...); r.code != 2 || !strings.Contains(r.stderr, "--") {
			t.Errorf("%v: %d %q, want a usage error", args, r.code, r.stderr)
		}
	}
}

// runService is a mock that runs one job: Wait reports it running twice,
// then as it ends.
func runService(t *testing.T, final *delegate.Job, output string) (*mock.JobService, *delegate.Manifest) {
	var submitted delegate.Manifest
	var mu sync.Mutex
	waits := 0
	svc := &mock.JobService{
		SubmitFn: func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
			if err := m.Validate(); err != nil {
				return nil, err
			}
			submitted = m
			return &delegate.Job{ID: final.ID, Status: delegate.StatusPending, Manifest: m}, nil
		},
		WaitFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			mu.Lock()
			defer mu.Unlock()
			waits++
			if waits < 3 {
				return &delegate.Job{ID: id, Status: delegate.StatusRunning, Progress: "running"}, nil
			}
			return final, nil
		},
		LogsFn: func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
			mu.Lock()
			defer mu.Unlock()
			// The output comes in two pieces while the job runs.
			n := min(len(output), waits*len(output)/2)
			var at int
			fmt.Sscan(opts.Cursor, &at)
			return &delegate.LogPage{JobID: id, Output: []byte(output[at:n]), NextCursor: fmt.Sprint(n), Done: waits >= 3 && n == len(output),
				Streams: streams(output[at:n])}, nil
		},
	}
	return svc, &submitted
}

// streams is output all from stdout, as pieces of a log page.
func streams(output string) []delegate.Output {
	return delegate.AppendOutput(nil, delegate.StreamStdout, []byte(output))
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	local := filepath.Join(dir, "input.txt")
	os.WriteFile(local, []byte("data"), 0o644)
	h := newHarness()
	svc, submitted := runService(t, job("job-1", delegate.StatusFailed, intp(7)), "line 1\nline 2\n")
	h.svc = svc
	r := h.run(t, "run", "--file", local, "--file", local+":in/copy.txt", "--env", "A=b=c", "--script", "make", "--timeout", "60", "-q")
	if r.code != 7 || r.stdout != "line 1\nline 2\n" || !strings.Contains(r.stderr, "job-1 failed") {
		t.Fatalf("run: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	m := *submitted
	data := base64.StdEncoding.EncodeToString([]byte("data"))
	if len(m.Files) != 2 || m.Files[0].Path != "input.txt" || m.Files[1].Path != "in/copy.txt" || m.Files[0].Content != data {
		t.Errorf("files: %+v", m.Files)
	}
	if m.StatusMode != delegate.StatusModeStreaming || m.Env["A"] != "b=c" || m.Timeout == nil || *m.Timeout != 60 || m.Task != "make" {
		t.Errorf("manifest: %+v", m)
	}
	if len(r.runJobs) != 1 || !r.runJobs[0] {
		t.Errorf("run must open a service that runs jobs: %v", r.runJobs)
	}

	// A manifest's own statusMode is kept; - reads stdin.
	h.stdin = `{"agentType":"script","task":"x","statusMode":"detailed"}`
	h.svc, submitted = runService(t, job("job-2", delegate.StatusSuccess, intp(0)), "")
	if r := h.run(t, "run", "--manifest", "-"); r.code != 0 || submitted.StatusMode != delegate.StatusModeDetailed {
		t.Errorf("manifest from stdin: %d %+v %s", r.code, submitted, r.stderr)
	}

	for _, tc := range []struct {
		final *delegate.Job
		code  int
	}{
		{job("j", delegate.StatusSuccess, intp(0)), 0},
		{job("j", delegate.StatusFailed, intp(125)), 125},
		{job("j", delegate.StatusTimeout, nil), 124},
		{job("j", delegate.StatusCancelled, nil), 130},
		{job("j", delegate.StatusFailed, nil), 125}, // never ran: delegate's failure
	} {
		h.svc, _ = runService(t, tc.final, "")
		if r := h.run(t, "run", "--script", "x"); r.code != tc.code {
			t.Errorf("%s exit %v: code %d, want %d", tc.final.Status, tc.final.ExitCode, r.code, tc.code)
		}
	}

	// The service refuses the manifest: 125, said once.
	h.svc, _ = runService(t, job("j", delegate.StatusSuccess, nil), "")
	if r := h.run(t, "run", "--script", "x", "--timeout", "999999"); r.code != 125 || strings.Count(r.stderr, "manifest.timeout") != 1 {
		t.Errorf("invalid manifest: %d %q", r.code, r.stderr)
	}
}

// TestRunCancelledByCtrlC: the job is cancelled, and delegate waits for
// it to end.
func TestRunCancelledByCtrlC(t *testing.T) {
	h := newHarness()
	var ctx context.Context
	h.svc, ctx = ctrlCService(t)
	if r := h.runCtx(t, ctx, "run", "--script", "sleep 100"); r.code != 130 || !strings.Contains(r.stderr, "cancelling job-1") {
		t.Fatalf("Ctrl-C: exit %d stderr %q", r.code, r.stderr)
	}
}

// ctrlCService is a job service whose job is interrupted as it is
// submitted: the context returned ends (the person's Ctrl-C), and the job
// runs until it is cancelled, which must come with a live context.
func ctrlCService(t *testing.T) (*mock.JobService, context.Context) {
	ctx, interrupt := context.WithCancel(context.Background())
	t.Cleanup(interrupt)
	var mu sync.Mutex
	cancelled := false
	return &mock.JobService{
		SubmitFn: func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
			interrupt()
			return &delegate.Job{ID: "job-1", Status: delegate.StatusPending}, nil
		},
		WaitFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			mu.Lock()
			defer mu.Unlock()
			if cancelled {
				return job(id, delegate.StatusCancelled, nil), nil
			}
			return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
		},
		CancelFn: func(ctx context.Context, id string) (*delegate.Job, bool, error) {
			if ctx.Err() != nil {
				t.Error("cancel with a cancelled context")
			}
			mu.Lock()
			defer mu.Unlock()
			cancelled = true
			return job(id, delegate.StatusCancelled, nil), true, nil
		},
		LogsFn: func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
			return &delegate.LogPage{JobID: id, NextCursor: "0"}, nil
		},
	}, ctx
}

// TestLogsFollowWaitsForNonStreamingJob: a job that does not stream its
// output has it printed when it ends.
func TestLogsFollowWaitsForNonStreamingJob(t *testing.T) {
	h := newHarness()
	var mu sync.Mutex
	ended := false
	running := &delegate.Job{ID: "job-1", Status: delegate.StatusRunning, Manifest: delegate.Manifest{StatusMode: delegate.StatusModeSimple}}
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return running, nil }
	h.svc.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		mu.Lock()
		defer mu.Unlock()
		ended = true
		return job(id, delegate.StatusSuccess, intp(0)), nil
	}
	h.svc.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			return nil, fmt.Errorf("job %s is running in statusMode simple: %w", id, delegate.ErrNotFinished)
		}
		return &delegate.LogPage{JobID: id, Output: []byte("the end\n"), NextCursor: "8", Done: true}, nil
	}
	r := h.run(t, "jobs", "logs", "job-1", "--follow")
	if r.code != 0 || r.stdout != "the end\n" || !strings.Contains(r.stderr, "printed when it ends") {
		t.Fatalf("follow: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	// Without --follow: the service's rule, said once.
	ended = false
	if r := h.run(t, "jobs", "logs", "job-1"); r.code != 1 || strings.Count(r.stderr, "job not finished") != 1 {
		t.Errorf("no follow: exit %d stderr %q", r.code, r.stderr)
	}
}

// TestLogsFollowStreaming follows pages until the job is done.
func TestLogsFollowStreaming(t *testing.T) {
	h := newHarness()
	pages := []delegate.LogPage{
		{Output: []byte("a"), NextCursor: "1"}, {NextCursor: "1"}, {Output: []byte("b"), NextCursor: "2"}, {NextCursor: "2", Done: true},
	}
	var cursors []string
	h.svc.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		cursors = append(cursors, opts.Cursor)
		p := pages[0]
		pages = pages[1:]
		return &p, nil
	}
	r := h.run(t, "jobs", "logs", "job-1", "-f")
	if r.code != 0 || r.stdout != "ab" || strings.Join(cursors, ",") != ",1,1,2" {
		t.Fatalf("exit %d stdout %q cursors %v", r.code, r.stdout, cursors)
	}
}

func TestJobsStatusShowsTimeline(t *testing.T) {
	h := newHarness()
	j := job("job-1", delegate.StatusRunning, nil)
	j.Progress = "step 2/3"
	j.TimelineDropped = 7
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return j, nil }
	h.svc.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) {
		return []delegate.Event{{Time: time.Now(), Message: "step 1/3"}, {Time: time.Now(), Message: "step 2/3"}}, nil
	}
	r := h.run(t, "jobs", "status", "job-1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "job-1 running (step 2/3)\n") || !strings.Contains(r.stdout, "timeline:") ||
		!strings.Contains(r.stdout, "step 1/3") || !strings.Contains(r.stdout, "(7 earlier entries dropped)") {
		t.Fatalf("status: %d\n%s", r.code, r.stdout)
	}
	r = h.run(t, "jobs", "status", "job-1", "--json")
	var got struct {
		JobID           string           `json:"job_id"`
		Timeline        []delegate.Event `json:"timeline"`
		TimelineDropped int64            `json:"timeline_dropped"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.JobID != "job-1" || len(got.Timeline) != 2 || got.TimelineDropped != 7 {
		t.Fatalf("status --json: %v %s", err, r.stdout)
	}
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return nil, fmt.Errorf("job %s: %w", id, delegate.ErrNotFound)
	}
	if r := h.run(t, "jobs", "status", "job-nope"); r.code != 1 || strings.Count(r.stderr, "not found") != 1 {
		t.Errorf("unknown job: %d %q", r.code, r.stderr)
	}
}

// TestRunSplitsStreams: the job's stdout goes to stdout and its stderr
// to stderr, byte for byte, as the pages of its log bring them; the
// outcome comes after on stderr.
func TestRunSplitsStreams(t *testing.T) {
	h := newHarness()
	pages := [][]delegate.Output{
		{{Stream: delegate.StreamStdout, Data: []byte("out\n")}, {Stream: delegate.StreamStderr, Data: []byte("err\xff\n")}},
		{{Stream: delegate.StreamStderr, Data: []byte("no newline")}, {Stream: delegate.StreamStdout, Data: []byte("end\n")}},
		// Output kept before the streams were told apart goes to stdout.
		{{Stream: delegate.StreamCombined, Data: []byte("both")}},
	}
	var served int
	h.svc = &mock.JobService{
		SubmitFn: func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
			return &delegate.Job{ID: "job-1", Status: delegate.StatusPending, Manifest: m}, nil
		},
		WaitFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			return job(id, delegate.StatusFailed, intp(2)), nil
		},
		LogsFn: func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
			if served == len(pages) {
				return &delegate.LogPage{JobID: id, NextCursor: "x", Done: true}, nil
			}
			p := pages[served]
			served++
			return &delegate.LogPage{JobID: id, Output: delegate.JoinOutput(p), Streams: p, NextCursor: fmt.Sprint(served)}, nil
		},
	}
	r := h.run(t, "run", "--script", "x", "-q")
	if r.code != 2 || r.stdout != "out\nend\nboth" || !strings.HasPrefix(r.stderr, "err\xff\nno newline") || !strings.Contains(r.stderr, "job-1 failed") {
		t.Fatalf("run: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestJobsResultExitsWithTheJobsCode(t *testing.T) {
	for _, tc := range []struct {
		status delegate.Status
		exit   *int
		code   int
	}{
		{delegate.StatusFailed, intp(3), 3},
		{delegate.StatusSuccess, intp(0), 0},
		{delegate.StatusTimeout, nil, 124},
		// Its command exited 0, and the job failed all the same (its end
		// could not be read, its output was lost): not 0 (issue 35).
		{delegate.StatusFailed, intp(0), 125},
	} {
		h := newHarness()
		var got delegate.ResultOptions
		h.svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
			got = opts
			return &delegate.JobResult{JobID: id, Status: tc.status, ExitCode: tc.exit, Output: []byte("out\xff\n"), Stderr: []byte("err\n"),
				Duration: time.Second, Error: "why"}, nil
		}
		r := h.run(t, "jobs", "result", "job-1")
		if r.code != tc.code || r.stdout != "out\xff\n" || !strings.HasPrefix(r.stderr, "err\ndelegate: job-1 "+string(tc.status)+" in 1.0s") {
			t.Errorf("%s: exit %d stdout %q stderr %q", tc.status, r.code, r.stdout, r.stderr)
		}
		if got.OutputTail < int(delegate.MaxOutputLimit) {
			t.Errorf("result asks for the last %d bytes, not all the output", got.OutputTail)
		}
		r = h.run(t, "jobs", "result", "--json", "job-1")
		var res struct {
			Output          string  `json:"output"`
			Stderr          string  `json:"stderr"`
			DurationSeconds float64 `json:"duration_seconds"`
			Status          string  `json:"status"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != tc.code || res.Output != "out\uFFFD\n" || res.Stderr != "err\n" || res.DurationSeconds != 1 {
			t.Errorf("%s --json: exit %d %v %s", tc.status, r.code, err, r.stdout)
		}
	}
	h := newHarness()
	h.svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return nil, fmt.Errorf("job %s is running: %w", id, delegate.ErrNotFinished)
	}
	if r := h.run(t, "jobs", "result", "job-1"); r.code != 1 || strings.Count(r.stderr, "job not finished") != 1 {
		t.Errorf("unfinished: %d %q", r.code, r.stderr)
	}
}

// TestJobsResultCacheMissed: jobs result says which caches the job had
// an empty one of, and why (issue 34, item 5), with --json too.
func TestJobsResultCacheMissed(t *testing.T) {
	const missed = "go: in use by sandbox sb-0123456789ab: this job had an empty one of its own"
	h := newHarness()
	h.svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return &delegate.JobResult{JobID: id, Status: delegate.StatusSuccess, ExitCode: intp(0), CacheMissed: missed}, nil
	}
	if r := h.run(t, "jobs", "result", "job-1"); r.code != 0 || !strings.Contains(r.stderr, "delegate: cache "+missed+"\n") {
		t.Errorf("jobs result: exit %d, stderr %q, want the cache missed", r.code, r.stderr)
	}
	if r := h.run(t, "jobs", "result", "--json", "job-1"); !strings.Contains(r.stdout, `"cache_missed": "`+missed+`"`) {
		t.Errorf("jobs result --json: %s", r.stdout)
	}
}

func TestJobsListAndCancel(t *testing.T) {
	h := newHarness()
	var got delegate.ListOptions
	h.svc.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		got = opts
		if opts.Cursor == "bad" {
			return nil, &delegate.FieldError{Field: "cursor", Rule: "must be a cursor returned by a previous list"}
		}
		return &delegate.JobPage{Jobs: []delegate.JobSummary{{ID: "job-1", Status: delegate.StatusFailed, Task: "make", ExitCode: intp(2)}}, NextCursor: "c2"}, nil
	}
	r := h.run(t, "jobs", "list", "--status", "failed", "--limit", "5")
	if r.code != 0 || got != (delegate.ListOptions{Status: delegate.StatusFailed, Limit: 5}) ||
		!strings.Contains(r.stdout, "job-1") || !strings.Contains(r.stderr, "--cursor c2") {
		t.Errorf("list: %d %+v %q %q", r.code, got, r.stdout, r.stderr)
	}
	if r.runJobs[0] {
		t.Error("jobs list opened a service that runs jobs")
	}
	if r := h.run(t, "jobs", "list", "--cursor", "bad"); r.code != 2 || !strings.Contains(r.stderr, "--cursor: must be a cursor") {
		t.Errorf("bad cursor: %d %q", r.code, r.stderr)
	}
	h.svc.CancelFn = func(ctx context.Context, id string) (*delegate.Job, bool, error) {
		return job(id, delegate.StatusSuccess, intp(0)), id == "job-run", nil
	}
	if r := h.run(t, "jobs", "cancel", "job-run"); r.code != 0 || r.stdout != "job-run cancelled\n" {
		t.Errorf("cancel: %d %q", r.code, r.stdout)
	}
	if r := h.run(t, "jobs", "cancel", "job-done"); r.code != 0 || !strings.Contains(r.stdout, "already finished") {
		t.Errorf("cancel of a finished job: %d %q", r.code, r.stdout)
	}
}

func TestJobsArtifact(t *testing.T) {
	h := newHarness()
	h.svc.ReadArtifactFn = func(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
		if name != "out/a.bin" {
			return delegate.Artifact{}, nil, fmt.Errorf("job %s has no artifact %q: %w", id, name, delegate.ErrNotFound)
		}
		return delegate.Artifact{Name: name, Size: 2, SHA256: "abc"}, []byte{0, 1}, nil
	}
	if r := h.run(t, "jobs", "artifact", "job-1", "out/a.bin"); r.code != 0 || r.stdout != "\x00\x01" {
		t.Errorf("to stdout: %d %q", r.code, r.stdout)
	}
	path := filepath.Join(t.TempDir(), "a.bin")
	if r := h.run(t, "jobs", "artifact", "-o", path, "job-1", "out/a.bin"); r.code != 0 || !strings.Contains(r.stderr, "sha256 abc") {
		t.Errorf("to a file: %d %q", r.code, r.stderr)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "\x00\x01" {
		t.Errorf("file: %q %v", data, err)
	}
	if r := h.run(t, "jobs", "artifact", "job-1", "nope"); r.code != 1 || strings.Count(r.stderr, "no artifact") != 1 {
		t.Errorf("missing: %d %q", r.code, r.stderr)
	}
}

// TestJobTextIsEscaped: what a job controls reaches the operator's
// terminal in delegate's own lines with its control characters escaped
// (no title change, no cursor moves, no forged lines), while the job's
// output on stdout stays byte for byte what it wrote.
func TestJobTextIsEscaped(t *testing.T) {
	const evil = "\x1b]0;owned\x07red \x1b[31mtext\r\ndelegate: job-1 success\u202e\xff"
	const escaped = `\x1b]0;owned\x07red \x1b[31mtext\r\ndelegate: job-1 success\u202e\xff`
	const output = "raw \x1b[1mbold\x1b[0m\r\n\xff\x00 stays\n"
	clean := func(t *testing.T, what, s string) {
		t.Helper()
		if strings.ContainsAny(s, "\x1b\x07\r\u202e") || strings.Contains(s, "\xff") || strings.Count(s, "delegate: job-1 success") > strings.Count(s, escaped) {
			t.Errorf("%s carries the job's control characters: %q", what, s)
		}
		if !strings.Contains(s, escaped) {
			t.Errorf("%s does not show the job's text escaped: %q", what, s)
		}
	}

	final := job("job-1", delegate.StatusFailed, intp(1))
	final.Error = evil
	h := newHarness()
	svc, _ := runService(t, final, output)
	wait := svc.WaitFn
	svc.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		j, err := wait(ctx, id)
		if j != nil && j.Status == delegate.StatusRunning {
			j.Progress = evil
		}
		return j, err
	}
	h.svc = svc
	r := h.run(t, "run", "--script", "make")
	if r.stdout != output {
		t.Errorf("run: stdout %q, want the output byte for byte %q", r.stdout, output)
	}
	clean(t, "run's progress", r.stderr)

	j := job("job-1", delegate.StatusFailed, intp(1))
	j.Progress, j.Error = evil, evil
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return j, nil }
	h.svc.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) {
		return []delegate.Event{{Time: time.Now(), Message: evil}}, nil
	}
	r = h.run(t, "jobs", "status", "job-1")
	clean(t, "jobs status", r.stdout)
	if n := strings.Count(r.stdout, escaped); n != 3 {
		t.Errorf("jobs status shows the progress, error and timeline escaped %d times, want 3:\n%s", n, r.stdout)
	}

	h.svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return &delegate.JobResult{JobID: id, Status: delegate.StatusFailed, ExitCode: intp(1), Output: []byte(output), Error: evil}, nil
	}
	r = h.run(t, "jobs", "result", "job-1")
	if r.stdout != output {
		t.Errorf("jobs result: stdout %q, want %q", r.stdout, output)
	}
	clean(t, "jobs result", r.stderr)
}

// TestServiceErrorTable: a service error's kind decides the exit status
// and the line that says what to do next; the error itself is printed
// once, in full (the person at the terminal runs the server).
func TestServiceErrorTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code int
		hint string
	}{
		{"a job", delegate.JobNotFound("job-x"), 1, "'delegate jobs list' shows the jobs."},
		{"an artifact", delegate.ArtifactNotFound("job-x", "a.txt"), 1, "'delegate jobs artifacts ID' lists a job's artifacts."},
		{"not finished", fmt.Errorf("job job-x is running: %w", delegate.ErrNotFinished), 1, "'delegate jobs logs ID --follow'"},
		{"unavailable", fmt.Errorf("%w: pve: connection refused", delegate.ErrUnavailable), cli.ExitUnavailable, "Try again later."},
		{"internal", errors.New("SQL logic error: no such table: jobs (1)"), 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness()
			h.svc.ReadArtifactFn = func(context.Context, string, string) (delegate.Artifact, []byte, error) {
				return delegate.Artifact{}, nil, tc.err
			}
			r := h.run(t, "jobs", "artifact", "job-x", "a.txt")
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != tc.code || lines[0] != "delegate jobs artifact: "+tc.err.Error() {
				t.Errorf("exit %d, stderr %q; want exit %d and the error", r.code, r.stderr, tc.code)
			}
			if tc.hint == "" && len(lines) != 1 || tc.hint != "" && (len(lines) != 2 || !strings.HasPrefix(lines[1], tc.hint)) {
				t.Errorf("stderr %q; want the hint %q", r.stderr, tc.hint)
			}
		})
	}
}

// servicesOf names the services svc implements (as main wires the engine,
// which implements them all).
func servicesOf(svc delegate.JobService) cli.Services {
	s := cli.Services{Jobs: svc}
	s.Sandboxes, _ = svc.(delegate.SandboxService)
	s.Questions, _ = svc.(delegate.QuestionService)
	s.Network, _ = svc.(delegate.NetworkService)
	s.Workspaces, _ = svc.(delegate.WorkspaceService)
	s.Retention, _ = svc.(delegate.RetentionService)
	return s
}

func noClose() error { return nil }

// TestCloseFailureReported: what fails to close after a command (the
// store, the engine, a backend) is reported, and the command fails.
func TestCloseFailureReported(t *testing.T) {
	h := newHarness()
	h.svc.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		return &delegate.JobPage{}, nil
	}
	if r := h.run(t, "jobs", "list"); r.code != 0 {
		t.Fatalf("list: %d %q", r.code, r.stderr)
	}
	h.closeErr = errors.New("closing the job store: database is locked")
	if r := h.run(t, "jobs", "list"); r.code == 0 || !strings.Contains(r.stderr, "closing the job store: database is locked") {
		t.Errorf("a failed close: %d %q", r.code, r.stderr)
	}
}
