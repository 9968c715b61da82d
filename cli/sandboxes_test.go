package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mock"
)

// The sandbox commands (sandboxes, exec, cp) over mock services.

func sandboxHarness() *harness {
	h := newHarness()
	h.sbx = &mock.SandboxService{}
	return h
}

func sandbox(id string, state delegate.SandboxState) *delegate.Sandbox {
	now := time.Now()
	return &delegate.Sandbox{ID: id, State: state, Backend: "local", Instance: "inst-hidden", JobID: "job-9",
		Resources: delegate.Resources{CPU: 2, Memory: "1G", Disk: "4G"}, Network: delegate.Network{Mode: delegate.NetworkNone},
		CreatedAt: now.Add(-2*time.Hour - 3*time.Minute), LastUsedAt: now.Add(-(31*time.Minute + 30*time.Second)),
		PausedAt: now.Add(-90 * time.Second), ExpiresAt: now.Add(21*time.Hour + 57*time.Minute + 30*time.Second),
		IdleTimeout: 30 * time.Minute, PauseTimeout: 24 * time.Hour, Commands: 4}
}

func TestSandboxCommandsHelp(t *testing.T) {
	for _, args := range [][]string{
		{"sandboxes"}, {"sandboxes", "--help"}, {"sandboxes", "open", "--help"}, {"sandboxes", "list", "--help"},
		{"sandboxes", "show", "--help"}, {"sandboxes", "release", "--help"}, {"exec", "--help"}, {"cp", "--help"}, {"help", "exec"},
	} {
		r := sandboxHarness().run(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("%v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := sandboxHarness().run(t, "--help"); !strings.Contains(r.stdout, "sandboxes") || !strings.Contains(r.stdout, "exec") || !strings.Contains(r.stdout, "cp ") {
		t.Errorf("the root help does not list the sandbox commands:\n%s", r.stdout)
	}
}

func TestSandboxUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"sandboxes", "frob"}, `unknown command "frob" for "delegate sandboxes"`, 2},
		{[]string{"sandboxes", "show"}, "missing ID", 2},
		{[]string{"sandboxes", "release", "a", "b"}, `unexpected argument "b"`, 2},
		{[]string{"sandboxes", "open", "extra"}, `unexpected argument "extra"`, 2},
		{[]string{"sandboxes", "open", "--idle", "1500ms"}, `invalid argument "1500ms" for "--idle" flag: must be seconds or a duration of whole seconds like "90s", "10m" or "1h30m" (got "1500ms")`, 2},
		{[]string{"sandboxes", "open", "--lifetime", "-1h"}, "--lifetime: must be at least 1s, like 30m or 2h (got -3600s)", 2},
		{[]string{"sandboxes", "open", "--lifetime", "9999h"}, "--lifetime: must be between 1 and 2592000 seconds", 2},
		{[]string{"sandboxes", "open", "--idle", "soon"}, `invalid argument "soon" for "--idle"`, 2},
		{[]string{"sandboxes", "open", "--memory", "lots"}, "--memory: must be", 2},
		{[]string{"sandboxes", "open", "--network", "pypi.org,"}, "--network (allow[1]): must be a host name", 2},
		{[]string{"exec"}, "missing ID and CMD", 125},
		{[]string{"exec", "sbx-1"}, "missing CMD (after --)", 125},
		{[]string{"exec", "sbx-1", "--"}, "missing CMD after --", 125},
		{[]string{"exec", "--", "ls"}, "missing ID before --", 125},
		{[]string{"exec", "sbx-1", "ls", "/"}, "put -- between ID and CMD: delegate exec sbx-1 -- ls /", 125},
		{[]string{"exec", "sbx-1", "x", "--", "ls"}, `unexpected argument "x" before --`, 125},
		{[]string{"exec", "SBX 1", "--", "ls"}, "ID: must be a sandbox id like sbx-", 125},
		{[]string{"exec", "sbx-1", "--env", "NOEQUALS", "--", "ls"}, "--env \"NOEQUALS\": must be KEY=VALUE", 125},
		{[]string{"cp", "a"}, "missing DST", 2},
		{[]string{"cp", "a", "b"}, `name the sandbox's side as ID:PATH (neither "a" nor "b" does`, 2},
		{[]string{"cp", "sbx-1:a", "sbx-2:b"}, "both", 2},
		{[]string{"cp", "sbx-1:", "b"}, "ID:PATH needs a PATH after the colon", 2},
		{[]string{"cp", "/nonexistent/file", "sbx-1:b"}, "no such file", 2},
		{[]string{"cp", ".", "sbx-1:b"}, ".: not a regular file", 2},
		{[]string{"cp", "sbx-1:f", "/nonexistent/dir/f"}, "/nonexistent/dir: no such directory to copy into", 2},
	} {
		r := sandboxHarness().run(t, tc.args...)
		if r.code != tc.code || strings.Count(r.stderr, tc.want) != 1 {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q once", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
		if len(r.opened) != 0 {
			t.Errorf("%v: the service was opened for a usage error", tc.args)
		}
	}
}

func TestSandboxesOpen(t *testing.T) {
	h := sandboxHarness()
	var got delegate.SandboxSpec
	h.sbx.OpenSandboxFn = func(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
		got = spec
		return sandbox("sbx-new", delegate.SandboxIdle), nil
	}
	r := h.run(t, "sandboxes", "open", "--memory", "1G", "--cpu", "2", "--disk", "4G", "--rootfs", "debian", "--network", "egress",
		"--idle", "600", "--lifetime", "8h") // seconds or a duration
	want := delegate.SandboxSpec{Resources: &delegate.Resources{Memory: "1G", CPU: 2, Disk: "4G"}, VMTemplate: "debian",
		Network: delegate.Network{Mode: delegate.NetworkEgress}, IdleTimeout: 600, Lifetime: 8 * 3600}
	if r.code != 0 || r.stdout != "sbx-new\n" || !reflect.DeepEqual(got, want) {
		t.Fatalf("open: exit %d stdout %q stderr %q; spec %+v", r.code, r.stdout, r.stderr, got)
	}
	if len(r.runJobs) != 1 || !r.runJobs[0] {
		t.Errorf("open must open a service with a backend: %v", r.runJobs)
	}
	if r := h.run(t, "sandboxes", "open"); r.code != 0 || !reflect.DeepEqual(got, delegate.SandboxSpec{}) {
		t.Errorf("no flags: the server's defaults, asked as %+v", got)
	}
	r = h.run(t, "sandboxes", "open", "--json")
	var sb map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb["sandbox_id"] != "sbx-new" || sb["state"] != "idle" {
		t.Errorf("--json: %v %s", err, r.stdout)
	}
	// The service's refusal names the flag.
	h.sbx.OpenSandboxFn = func(context.Context, delegate.SandboxSpec) (*delegate.Sandbox, error) {
		return nil, &delegate.FieldError{Field: "idle_timeout", Rule: "must be at most 3600 seconds (DELEGATE_SANDBOX_IDLE)"}
	}
	if r := h.run(t, "sandboxes", "open", "--idle", "2h"); r.code != 1 || !strings.Contains(r.stderr, "--idle: must be at most 3600 seconds") {
		t.Errorf("refused by the service: %d %q", r.code, r.stderr)
	}
}

func TestSandboxesListShowRelease(t *testing.T) {
	h := sandboxHarness()
	var asked delegate.SandboxListOptions
	h.sbx.ListSandboxesFn = func(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
		asked = opts
		running := sandbox("sbx-b", delegate.SandboxRunning)
		running.Running = 1
		return []delegate.Sandbox{*running, *sandbox("sbx-a", delegate.SandboxPaused)}, nil
	}
	r := h.run(t, "sandboxes", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || asked.All {
		t.Fatalf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for i, want := range [][]string{
		{"SANDBOX", "STATE", "AGE", "IDLE", "COMMANDS", "EXPIRES"},
		{"sbx-b", "running", "2h03m", "-", "4", "in", "21h57m"},
		{"sbx-a", "paused", "2h03m", "31m30s", "4", "in", "21h57m"},
	} {
		if got := strings.Fields(lines[i]); !reflect.DeepEqual(got, want) {
			t.Errorf("line %d: %q, want %q", i, got, want)
		}
	}
	if r.runJobs[0] {
		t.Error("list opened a backend")
	}
	h.run(t, "sandboxes", "list", "--all")
	if !asked.All {
		t.Error("--all was not asked for")
	}
	r = h.run(t, "sandboxes", "list", "--json")
	var page struct{ Sandboxes []map[string]any }
	err := json.Unmarshal([]byte(r.stdout), &page)
	if list := page.Sandboxes; err != nil || len(list) != 2 || list[1]["state"] != "paused" || strings.Contains(r.stdout, "inst-hidden") {
		t.Errorf("list --json: %v\n%s", err, r.stdout)
	}
	h.sbx.ListSandboxesFn = func(context.Context, delegate.SandboxListOptions) ([]delegate.Sandbox, error) { return nil, nil }
	if r := h.run(t, "sandboxes", "list", "--json"); strings.Join(strings.Fields(r.stdout), "") != `{"sandboxes":[]}` {
		t.Errorf("no sandboxes, --json: %q", r.stdout)
	}
	if r := h.run(t, "sandboxes", "list"); r.code != 0 || !strings.Contains(r.stderr, "no kept sandboxes ('delegate sandboxes open' opens one") {
		t.Errorf("no sandboxes: %q", r.stderr)
	}

	// show
	h.sbx.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		if id != "sbx-a" {
			return nil, delegate.SandboxNotFound(id)
		}
		sb := sandbox(id, delegate.SandboxPaused)
		sb.Template = "debian\x1b]52;c;x\x07"
		return sb, nil
	}
	r = h.run(t, "sandboxes", "show", "sbx-a")
	for _, want := range []string{"sbx-a paused\n", "made by", "job-9", "2 CPU, 1G memory, 4G disk, network none", `debian\x1b]52;c;x\x07`,
		"(31m30s ago)", "paused after 30m0s idle, destroyed after 24h0m0s paused", "(in 21h57m)", "4 run, 0 running"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, r.stdout)
		}
	}
	r = h.run(t, "sandboxes", "show", "sbx-a", "--json")
	var one map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || one["sandbox_id"] != "sbx-a" || one["commands"] != 4.0 {
		t.Errorf("show --json: %v %s", err, r.stdout)
	}
	// A sandbox that is not there: the way to those that are, once.
	r = h.run(t, "sandboxes", "show", "sbx-x")
	if r.code != 1 || r.stderr != "delegate sandboxes show: sandbox \"sbx-x\": not found\n'delegate sandboxes list' shows the sandboxes.\n" {
		t.Errorf("unknown sandbox: exit %d stderr %q", r.code, r.stderr)
	}

	// release
	h.sbx.ReleaseSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
		sb := sandbox(id, delegate.SandboxReleased)
		if id == "sbx-gone" {
			sb.State, sb.Reason = delegate.SandboxGone, "lifetime ended"
			return sb, false, nil
		}
		return sb, true, nil
	}
	r = h.run(t, "sandboxes", "release", "sbx-a")
	if r.code != 0 || r.stdout != "sbx-a released\n" || len(r.runJobs) != 1 || !r.runJobs[0] {
		t.Errorf("release: %d %q %v", r.code, r.stdout, r.runJobs)
	}
	if r := h.run(t, "sandboxes", "release", "sbx-gone"); r.code != 0 || r.stdout != "sbx-gone was gone already: lifetime ended\n" {
		t.Errorf("release of a gone sandbox: %d %q", r.code, r.stdout)
	}
}

// execService answers a command in a kept sandbox: its output on both
// streams, then final.
func execService(final *delegate.Job) (*mock.JobService, *delegate.Manifest) {
	var submitted delegate.Manifest
	var mu sync.Mutex
	waits := 0
	return &mock.JobService{
		SubmitFn: func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
			if err := m.Validate(); err != nil {
				return nil, err
			}
			if m.Sandbox == "sbx-x" {
				return nil, delegate.SandboxNotFound("sbx-x")
			}
			submitted = m
			return &delegate.Job{ID: final.ID, Status: delegate.StatusPending, Manifest: m}, nil
		},
		WaitFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			mu.Lock()
			defer mu.Unlock()
			if waits++; waits < 2 {
				return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
			}
			return final, nil
		},
		LogsFn: func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
			if opts.Cursor != "" {
				return &delegate.LogPage{JobID: id, NextCursor: opts.Cursor, Done: true}, nil
			}
			out := delegate.AppendOutput(nil, delegate.StreamStdout, []byte("hi\n"))
			out = delegate.AppendOutput(out, delegate.StreamStderr, []byte("warning\n"))
			return &delegate.LogPage{JobID: id, Output: []byte("hi\nwarning\n"), Streams: out, NextCursor: "11"}, nil
		},
	}, &submitted
}

func TestExec(t *testing.T) {
	h := sandboxHarness()
	final := job("job-7", delegate.StatusFailed, intp(3))
	var submitted *delegate.Manifest
	h.svc, submitted = execService(final)
	r := h.run(t, "exec", "sbx-1", "--env", "A=b=c", "--timeout", "1m", "--", "sh", "-c", "echo hi > f; cat f", "it's")
	if r.code != 3 || r.stdout != "hi\n" || r.stderr != "warning\n" {
		t.Fatalf("exec: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	m := *submitted
	if m.Sandbox != "sbx-1" || m.Task != `sh -c 'echo hi > f; cat f' 'it'"'"'s'` || m.AgentType != delegate.AgentScript ||
		m.StatusMode != delegate.StatusModeStreaming || m.Env["A"] != "b=c" || m.Timeout == nil || *m.Timeout != 60 {
		t.Errorf("the job: %+v", m)
	}
	if len(r.runJobs) != 1 || !r.runJobs[0] {
		t.Errorf("exec must open a service that runs jobs: %v", r.runJobs)
	}
	for _, tc := range []struct {
		final   *delegate.Job
		code    int
		verdict bool
	}{
		{job("j", delegate.StatusSuccess, intp(0)), 0, false},
		{job("j", delegate.StatusFailed, intp(127)), 127, false},
		{job("j", delegate.StatusTimeout, nil), 124, true},
		{job("j", delegate.StatusCancelled, nil), 130, true},
		{&delegate.Job{ID: "j", Status: delegate.StatusFailed, Error: "sandbox sbx-1 is gone: its processes died"}, 125, true},
	} {
		h.svc, _ = execService(tc.final)
		r := h.run(t, "exec", "sbx-1", "--", "true")
		if r.code != tc.code || strings.Contains(r.stderr, "delegate: j ") != tc.verdict {
			t.Errorf("%s exit %v: code %d, stderr %q; want %d (a verdict: %v)", tc.final.Status, tc.final.ExitCode, r.code, r.stderr, tc.code, tc.verdict)
		}
		if tc.final.Error != "" && !strings.Contains(r.stderr, tc.final.Error) {
			t.Errorf("the reason is not said: %q", r.stderr)
		}
	}

	// A sandbox that is not there: 125, with the way to those that are.
	h.svc, _ = execService(final)
	r = h.run(t, "exec", "sbx-x", "--", "true")
	if r.code != 125 || r.stderr != "delegate exec: sandbox \"sbx-x\": not found\n'delegate sandboxes list' shows the sandboxes.\n" {
		t.Errorf("unknown sandbox: exit %d stderr %q", r.code, r.stderr)
	}
	// What the manifest refuses: 125, said once.
	r = h.run(t, "exec", "sbx-1", "--timeout", "999999", "--", "true")
	if r.code != 125 || strings.Count(r.stderr, "manifest.timeout") != 1 {
		t.Errorf("invalid timeout: %d %q", r.code, r.stderr)
	}
}

// TestExecStdin: standard input piped in is for the command; until the
// manifest carries it (manifest.stdin), a command given some is refused
// rather than run without it, and none (or --no-stdin) runs.
func TestExecStdin(t *testing.T) {
	h := sandboxHarness()
	var submitted *delegate.Manifest
	h.svc, submitted = execService(job("j", delegate.StatusSuccess, intp(0)))
	h.stdin = "input data\n"
	r := h.run(t, "exec", "sbx-1", "--", "cat")
	if r.code != 0 || submitted.Stdin != base64.StdEncoding.EncodeToString([]byte("input data\n")) {
		t.Errorf("piped input: exit %d stderr %q, manifest.stdin %q", r.code, r.stderr, submitted.Stdin)
	}
	if r := h.run(t, "exec", "sbx-1", "--no-stdin", "--", "cat"); r.code != 0 || submitted.Stdin != "" {
		t.Errorf("--no-stdin: exit %d stderr %q, manifest.stdin %q", r.code, r.stderr, submitted.Stdin)
	}
	h.stdin = ""
	if r := h.run(t, "exec", "sbx-1", "--", "cat"); r.code != 0 || submitted.Stdin != "" {
		t.Errorf("empty input: exit %d stderr %q", r.code, r.stderr)
	}
}

func TestExecCancelledByCtrlC(t *testing.T) {
	h := sandboxHarness()
	var ctx context.Context
	h.svc, ctx = ctrlCService(t)
	if r := h.runCtx(t, ctx, "exec", "sbx-1", "--", "sleep", "100"); r.code != 130 || !strings.Contains(r.stderr, "cancelling job-1") {
		t.Fatalf("Ctrl-C: exit %d stderr %q", r.code, r.stderr)
	}
}

func TestCp(t *testing.T) {
	dir := t.TempDir()
	h := sandboxHarness()
	type written struct {
		id, path string
		data     []byte
		mode     fs.FileMode
	}
	var writes []written
	h.sbx.WriteSandboxFileFn = func(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
		writes = append(writes, written{id, path, data, mode})
		return nil
	}
	file := bytes.Repeat([]byte("0123456789abcdef"), delegate.MaxFileRead/16*2+100) // two reads and a bit
	var offsets []int64
	h.sbx.ReadSandboxFileFn = func(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
		if path == "missing" {
			return nil, &delegate.NotFoundError{Resource: "file", ID: path, Of: "sandbox " + id}
		}
		offsets = append(offsets, offset)
		if length != delegate.MaxFileRead {
			t.Errorf("read of %d bytes, want %d", length, delegate.MaxFileRead)
		}
		end := min(offset+length, int64(len(file)))
		return &delegate.FileContent{Data: file[offset:end], Offset: offset, Size: int64(len(file)), EOF: end == int64(len(file))}, nil
	}

	// In: the bytes and the permissions.
	local := filepath.Join(dir, "run.sh")
	os.WriteFile(local, []byte("#!/bin/sh\necho hi\n"), 0o755)
	r := h.run(t, "cp", local, "sbx-1:bin/run.sh")
	if r.code != 0 || len(writes) != 1 || !reflect.DeepEqual(writes[0], written{"sbx-1", "bin/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755}) {
		t.Fatalf("cp in: exit %d stderr %q writes %+v", r.code, r.stderr, writes)
	}
	if !r.runJobs[0] {
		t.Error("cp opened no backend")
	}
	h.stdin = "from stdin"
	if r := h.run(t, "cp", "-", "sbx-1:in.txt"); r.code != 0 || string(writes[1].data) != "from stdin" || writes[1].mode != 0o644 {
		t.Errorf("cp - in: %d %q %+v", r.code, r.stderr, writes[1])
	}

	// Out: read 1 MiB at a time, to a file, into a directory, or to stdout.
	out := filepath.Join(dir, "big.bin")
	r = h.run(t, "cp", "sbx-1:out/big.bin", out)
	got, _ := os.ReadFile(out)
	if r.code != 0 || !bytes.Equal(got, file) || !reflect.DeepEqual(offsets, []int64{0, 1 << 20, 2 << 20}) {
		t.Fatalf("cp out: exit %d stderr %q, %d bytes, offsets %v", r.code, r.stderr, len(got), offsets)
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	if r := h.run(t, "cp", "sbx-1:out/big.bin", sub); r.code != 0 {
		t.Errorf("cp into a directory: %d %q", r.code, r.stderr)
	} else if got, _ := os.ReadFile(filepath.Join(sub, "big.bin")); !bytes.Equal(got, file) {
		t.Errorf("cp into a directory: %d bytes", len(got))
	}
	if r := h.run(t, "cp", "sbx-1:out/big.bin", "-"); r.code != 0 || r.stdout != string(file) {
		t.Errorf("cp to stdout: %d, %d bytes", r.code, len(r.stdout))
	}
	// A failed copy leaves nothing behind.
	r = h.run(t, "cp", "sbx-1:missing", filepath.Join(dir, "nothing"))
	entries, _ := os.ReadDir(dir)
	if r.code != 1 || !strings.Contains(r.stderr, `file "missing" of sandbox sbx-1: not found`) || len(entries) != 3 {
		t.Errorf("a missing file: %d %q, dir %v", r.code, r.stderr, entries)
	}
	// A sandbox that keeps returning nothing is not read forever.
	h.sbx.ReadSandboxFileFn = func(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
		return &delegate.FileContent{Offset: offset, Size: 10}, nil
	}
	if r := h.run(t, "cp", "sbx-1:f", "-"); r.code != 1 || !strings.Contains(r.stderr, "returned no bytes at offset 0 of 10") {
		t.Errorf("no progress: %d %q", r.code, r.stderr)
	}
	// A sandbox that is not there.
	h.sbx.WriteSandboxFileFn = func(context.Context, string, string, []byte, fs.FileMode) error {
		return delegate.SandboxNotFound("sbx-x")
	}
	if r := h.run(t, "cp", local, "sbx-x:f"); r.code != 1 || !strings.Contains(r.stderr, "'delegate sandboxes list' shows the sandboxes.") {
		t.Errorf("unknown sandbox: %d %q", r.code, r.stderr)
	}
	// The service's field errors reach the user as they are.
	h.sbx.WriteSandboxFileFn = func(context.Context, string, string, []byte, fs.FileMode) error {
		return &delegate.FieldError{Field: "path", Rule: `"../x" leads out of /workspace`}
	}
	if r := h.run(t, "cp", local, "sbx-1:../x"); r.code != 1 || !strings.Contains(r.stderr, `path: "../x" leads out of /workspace`) {
		t.Errorf("path outside: %d %q", r.code, r.stderr)
	}
}

// TestSandboxCommandsWithoutSandboxes: a service that keeps none says so.
func TestSandboxCommandsWithoutSandboxes(t *testing.T) {
	r := newHarness().run(t, "sandboxes", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "this delegate keeps no sandboxes") {
		t.Errorf("exit %d stderr %q", r.code, r.stderr)
	}
}
