package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The first hour of a new user (issue 22), through the built binary: the
// CLI's flags for every manifest field, standard input, a directory sent
// as a tree, artifacts, one rule for exit codes, a missing network
// helper said at submission, the job's environment, and idempotency.

// cliRun runs the binary in dir (the test's working directory when "")
// with stdin (nil: /dev/null) and more environment.
func cliRun(t *testing.T, dataDir, dir string, stdin io.Reader, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), binary, args...)
	cmd.Env = append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn"), env...)
	cmd.Dir, cmd.Stdin = dir, stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := exitCode(t, cmd)
	return stdout.String(), stderr.String(), code
}

// jobJSON is `jobs status ID --json`.
func jobJSON(t *testing.T, dataDir, id string) map[string]any {
	t.Helper()
	out, errOut, code := delegateCLI(t, dataDir, "jobs", "status", id, "--json")
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 {
		t.Fatalf("jobs status %s --json: exit %d %v\n%s%s", id, code, err, out, errOut)
	}
	return j
}

// TestCLIStdin: standard input, when it is a pipe, is the job's.
func TestCLIStdin(t *testing.T) {
	dataDir := t.TempDir()
	if out, errOut, code := cliRun(t, dataDir, "", strings.NewReader("in\n"), nil, "run", "-q", "--script", "cat"); out != "in\n" || code != 0 {
		t.Fatalf("echo in | delegate run --script cat: exit %d %q %s", code, out, errOut)
	}
	if out, errOut, code := cliRun(t, dataDir, "", strings.NewReader("in\n"), nil, "run", "-q", "--no-stdin", "--script", "cat; echo end"); out != "end\n" || code != 0 {
		t.Fatalf("--no-stdin: exit %d %q %s", code, out, errOut)
	}
	// /dev/null (no stdin given): none, and no wait.
	if out, errOut, code := cliRun(t, dataDir, "", nil, nil, "run", "-q", "--script", "cat; echo end"); out != "end\n" || code != 0 {
		t.Fatalf("stdin /dev/null: exit %d %q %s", code, out, errOut)
	}
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	if _, errOut, code := cliRun(t, dataDir, "", bytes.NewReader(big), nil, "run", "-q", "--script", "wc -c"); code != 125 || !strings.Contains(errOut, "standard input: more than the 1048576 bytes") {
		t.Fatalf("too much stdin: exit %d %s", code, errOut)
	}
	if out, errOut, code := cliRun(t, dataDir, "", bytes.NewReader(big[:1<<20]), nil, "run", "-q", "--script", "wc -c"); strings.TrimSpace(out) != "1048576" || code != 0 {
		t.Fatalf("1 MiB of stdin: exit %d %q %s", code, out, errOut)
	}
}

// TestCLIManifestFlags: every manifest field has a flag of `delegate run`,
// and --help says how secrets are read.
func TestCLIManifestFlags(t *testing.T) {
	dataDir := t.TempDir()
	out, errOut, code := cliRun(t, dataDir, "", nil, []string{"DELEGATE_SECRET_FH_TOKEN=s3cr3t-value"},
		"run", "--secret", "FH_TOKEN", "--env", "A=1", "--artifact", "out/*.txt", "--keep", "--timeout", "30",
		"--memory", "128M", "--cpu", "0.5", "--disk", "32M", "--status-mode", "detailed", "--network", "egress",
		"--script", `echo "token $FH_TOKEN"; echo "A=$A"; mkdir out; echo hi > out/a.txt; case "$http_proxy" in http://*) echo proxied;; esac`)
	if code != 0 || out != "token [REDACTED]\nA=1\nproxied\n" {
		t.Fatalf("run with every flag: exit %d %q\n%s", code, out, errOut)
	}
	id := newestJob(t, dataDir)
	m := jobJSON(t, dataDir, id)["manifest"].(map[string]any)
	want := map[string]any{"lifecycle": "persistent", "statusMode": "detailed", "network": "egress", "timeout": 30.0,
		"secrets": []any{"FH_TOKEN"}, "artifacts": []any{"out/*.txt"}, "env": map[string]any{"A": "1"},
		"resources": map[string]any{"cpu": 0.5, "memory": "128M", "disk": "32M"}}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	for k, v := range want {
		if js(m[k]) != js(v) {
			t.Errorf("manifest.%s = %s, want %s", k, js(m[k]), js(v))
		}
	}
	if strings.Contains(js(m), "s3cr3t") {
		t.Error("the secret's value is in the stored manifest")
	}
	// --keep kept the sandbox; jobs release destroys it.
	if out, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--json"); !strings.Contains(out, `"sandbox_kept": true`) {
		t.Errorf("--keep: the sandbox is not kept: %s", out)
	}
	if out, errOut, code := delegateCLI(t, dataDir, "jobs", "release", id); code != 0 || !strings.Contains(out, "released") {
		t.Errorf("jobs release: exit %d %q %s", code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--rootfs", "nope", "--script", "true"}, "manifest.vmTemplate"},
		{[]string{"run", "--secret", "FH_TOKEN=leak", "--script", "true"}, "never from the command line"},
		{[]string{"run", "--secret", "FH_MISSING", "--script", "true"}, "DELEGATE_SECRET_FH_MISSING"},
		{[]string{"run", "--network", "pypi.org,", "--script", "true"}, "manifest.network.allow[1]: must be a host name"},
		{[]string{"run", "--agent", "claude", "--script", "true"}, "give --task with --agent claude"},
	} {
		if _, errOut, code := delegateCLI(t, dataDir, tc.args...); code != 125 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d %q, want 125 and %q", tc.args, code, errOut, tc.want)
		}
	}
	help, _, _ := delegateCLI(t, dataDir, "run", "--help")
	for _, flag := range []string{"--secret", "--network", "--artifact", "--keep", "--rootfs", "--timeout", "--memory", "--cpu", "--disk",
		"--status-mode", "--agent", "--task", "--command", "--model", "--no-stdin", "DELEGATE_SECRET_<NAME>"} {
		if !strings.Contains(help, flag) {
			t.Errorf("run --help does not mention %s", flag)
		}
	}
}

// TestCLIFileTree: --file DIR sends a directory as its tree, read as the
// user who runs the command, links as links (never followed), execute
// bits kept; "--file ." puts the current directory in /workspace itself.
func TestCLIFileTree(t *testing.T) {
	dataDir := t.TempDir()
	tree := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a.txt"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	os.Symlink("a.txt", filepath.Join(tree, "alias"))
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("host only\n"), 0o600)
	os.Symlink(secret, filepath.Join(tree, "outside"))
	script := `cat alias; sub/run.sh; test -L outside && echo "link to $(readlink outside)"; cat outside 2>/dev/null || echo "not followed"`
	want := "hello\nran\nlink to " + secret + "\nnot followed\n"
	if out, errOut, code := cliRun(t, dataDir, tree, nil, nil, "run", "-q", "--file", ".", "--script", script); out != want || code != 0 {
		t.Fatalf("--file .: exit %d %q\n%s", code, out, errOut)
	}
	if out, errOut, code := cliRun(t, dataDir, "", nil, nil, "run", "-q", "--file", tree, "--script", "cd proj && "+script); out != want || code != 0 {
		t.Fatalf("--file DIR: exit %d %q\n%s", code, out, errOut)
	}
	if out, errOut, code := cliRun(t, dataDir, "", nil, nil, "run", "-q", "--file", tree+":lib/p", "--script", "cat lib/p/a.txt"); out != "hello\n" || code != 0 {
		t.Fatalf("--file DIR:REMOTE: exit %d %q\n%s", code, out, errOut)
	}
}

// TestCLIArtifacts: run, jobs result and jobs status list the artifacts
// (a skipped one with its reason), jobs artifact with a wrong name says
// which there are, and jobs artifacts --out saves them all.
func TestCLIArtifacts(t *testing.T) {
	dataDir := t.TempDir()
	_, errOut, code := delegateCLI(t, dataDir, "run", "--artifact", "out/**", "--script",
		`mkdir -p out/d; echo one > out/a.txt; echo two > out/d/b.txt; head -c 17000000 /dev/zero > out/big.bin`)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	id := newestJob(t, dataDir)
	listed := []string{"artifact out/a.txt, 4 bytes", "artifact out/d/b.txt, 4 bytes",
		"artifact out/big.bin, 17000000 bytes, not kept: larger than the 16 MiB per-file cap",
		"'delegate jobs artifacts " + id + " --out DIR' saves them"}
	for _, w := range listed {
		if !strings.Contains(errOut, "delegate: "+w+"\n") {
			t.Errorf("run does not list %q:\n%s", w, errOut)
		}
	}
	_, errOut, code = delegateCLI(t, dataDir, "jobs", "result", id)
	for _, w := range listed {
		if code != 0 || !strings.Contains(errOut, "delegate: "+w+"\n") {
			t.Errorf("jobs result (exit %d) does not list %q:\n%s", code, w, errOut)
		}
	}
	out, _, _ := delegateCLI(t, dataDir, "jobs", "status", id)
	for _, w := range listed {
		if !strings.Contains(out, "  "+w+"\n") {
			t.Errorf("jobs status does not list %q:\n%s", w, out)
		}
	}
	if _, errOut, code := delegateCLI(t, dataDir, "jobs", "artifact", id, "nope"); code != 1 ||
		!strings.Contains(errOut, `the job's artifacts: "out/a.txt", "out/big.bin", "out/d/b.txt"`) {
		t.Errorf("jobs artifact ID nope: exit %d %s", code, errOut)
	}
	if out, _, code := delegateCLI(t, dataDir, "jobs", "artifacts", id); code != 0 || !strings.Contains(out, "out/d/b.txt") || !strings.Contains(out, "not kept") {
		t.Errorf("jobs artifacts ID: exit %d\n%s", code, out)
	}
	dest := filepath.Join(t.TempDir(), "fetched")
	_, errOut, code = delegateCLI(t, dataDir, "jobs", "artifacts", id, "--out", dest)
	a, _ := os.ReadFile(filepath.Join(dest, "out", "a.txt"))
	b, _ := os.ReadFile(filepath.Join(dest, "out", "d", "b.txt"))
	if _, err := os.Stat(filepath.Join(dest, "out", "big.bin")); code != 0 || string(a) != "one\n" || string(b) != "two\n" || err == nil ||
		!strings.Contains(errOut, "saved 2 of 3 artifacts") || !strings.Contains(errOut, "out/big.bin not kept") {
		t.Errorf("jobs artifacts --out: exit %d a %q b %q big %v\n%s", code, a, b, err, errOut)
	}
}

// TestCLIExitRule: a timed-out and a cancelled job show the exit code the
// process ended with (137) and the reason apart, the same in jobs list,
// jobs status, jobs result and the MCP result; the commands that end
// with a job's status exit 124 and 130.
func TestCLIExitRule(t *testing.T) {
	dataDir := t.TempDir()
	if _, errOut, code := delegateCLI(t, dataDir, "run", "--timeout", "1", "--script", "sleep 30"); code != 124 ||
		!strings.Contains(errOut, "exit code 137 (timeout)") {
		t.Fatalf("run of a timed-out job: exit %d\n%s", code, errOut)
	}
	timedOut := newestJob(t, dataDir)
	if _, errOut, code := delegateCLI(t, dataDir, "jobs", "result", timedOut); code != 124 || !strings.Contains(errOut, "exit code 137 (timeout)") {
		t.Errorf("jobs result: exit %d\n%s", code, errOut)
	}
	if out, _, _ := delegateCLI(t, dataDir, "jobs", "status", timedOut); !strings.Contains(out, "exit code  137 (timeout)\n") {
		t.Errorf("jobs status:\n%s", out)
	}

	runner := exec.CommandContext(testContext(t), binary, "run", "-q", "--script", "sleep 30")
	runner.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	var cancelled string
	for range 200 {
		out, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--status", "running", "--json")
		if i := strings.Index(out, `"job_id": "`); i >= 0 {
			cancelled = out[i+len(`"job_id": "`):][:len(timedOut)]
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cancelled == "" {
		t.Fatal("the job was never seen running")
	}
	if _, errOut, code := delegateCLI(t, dataDir, "jobs", "cancel", cancelled); code != 0 {
		t.Fatalf("jobs cancel: %d %s", code, errOut)
	}
	var exitErr *exec.ExitError
	if err := runner.Wait(); !errors.As(err, &exitErr) || exitErr.ExitCode() != 130 {
		t.Errorf("run of a cancelled job: %v, want exit 130", err)
	}
	out, _, _ := delegateCLI(t, dataDir, "jobs", "list")
	for _, w := range []string{"timeout    137 (timeout)", "cancelled  137 (cancelled)"} {
		if !strings.Contains(out, w) {
			t.Errorf("jobs list lacks %q:\n%s", w, out)
		}
	}
	cs, _, _ := stdioSession(t, dataDir, "")
	listed := call[struct {
		Jobs []struct {
			JobID      string `json:"job_id"`
			ExitReason string `json:"exit_reason"`
		} `json:"jobs"`
	}](t, cs, "list_jobs", map[string]any{})
	reasons := map[string]string{}
	for _, j := range listed.Jobs {
		reasons[j.JobID] = j.ExitReason
	}
	if reasons[timedOut] != "timeout" || reasons[cancelled] != "cancelled" {
		t.Errorf("list_jobs' exit reasons: %v, want timeout for %s and cancelled for %s", reasons, timedOut, cancelled)
	}
	for id, reason := range map[string]string{timedOut: "timeout", cancelled: "cancelled"} {
		r := call[struct {
			ExitCode   *int   `json:"exit_code"`
			ExitReason string `json:"exit_reason"`
		}](t, cs, "get_job_result", map[string]any{"job_id": id})
		if r.ExitCode == nil || *r.ExitCode != 137 || r.ExitReason != reason {
			t.Errorf("get_job_result %s: %+v, want 137 and %s", id, r, reason)
		}
	}
}

// TestEgressWithoutHelpers: on a host without pasta or slirp4netns, a
// job that needs egress — asked for, or a claude job's default — is not
// refused: its network goes through the server's own egress proxy, which
// needs no helper (the job's proxy variables name it).
func TestEgressWithoutHelpers(t *testing.T) {
	dataDir := t.TempDir()
	noHelpers := []string{"PATH=" + t.TempDir()} // the server looks for the helpers on its PATH
	out, errOut, code := cliRun(t, dataDir, "", nil, noHelpers, "run", "-q", "--network", "egress", "--script", `echo "$https_proxy"`)
	if code != 0 || !strings.HasPrefix(out, "http://") {
		t.Fatalf("an egress job without pasta or slirp4netns: exit %d %q\n%s", code, out, errOut)
	}
	id := newestJob(t, dataDir)
	if out, errOut, code := delegateCLI(t, dataDir, "jobs", "network", id); code != 0 || !strings.Contains(out, "egress") {
		t.Errorf("jobs network %s: exit %d\n%s%s", id, code, out, errOut)
	}
	// A claude job's default network is egress: no refusal at submission
	// for the network's sake (it fails later only if no claude is found).
	_, errOut, _ = cliRun(t, dataDir, "", nil, noHelpers, "run", "--agent", "claude", "--task", "fix it")
	if strings.Contains(errOut, "manifest.network") {
		t.Errorf("a claude job refused for its network:\n%s", errOut)
	}
}

// TestCLIJobEnvironment: a job's user is "sandbox", and the standard PATH
// finds the host's Go toolchain and the operator's tool directories.
func TestCLIJobEnvironment(t *testing.T) {
	dataDir := t.TempDir()
	tools := filepath.Join("/opt", "delegate-e2e-tools-"+filepath.Base(t.TempDir()))
	os.MkdirAll(filepath.Join(tools, "bin"), 0o755)
	t.Cleanup(func() { os.RemoveAll(tools) })
	os.WriteFile(filepath.Join(tools, "bin", "e2e-tool"), []byte("#!/bin/sh\necho tool ran\n"), 0o755)
	out, errOut, code := cliRun(t, dataDir, "", nil, []string{"DELEGATE_TOOL_DIRS=" + tools}, "run", "-q", "--script",
		`id -un; ls -ld /workspace | awk '{print $3}'; e2e-tool; case ":$PATH:" in *:/usr/local/go/bin:*) echo go on PATH;; esac`)
	want := "sandbox\nsandbox\ntool ran\n"
	if _, err := os.Stat("/usr/local/go/bin"); err == nil {
		want += "go on PATH\n"
	}
	if code != 0 || out != want {
		t.Fatalf("exit %d %q, want %q\n%s", code, out, want, errOut)
	}
	if _, errOut, code := cliRun(t, dataDir, "", nil, []string{"DELEGATE_TOOL_DIRS=tools"}, "run", "--script", "true"); code != 125 ||
		!strings.Contains(errOut, "DELEGATE_TOOL_DIRS") {
		t.Errorf("a relative tool directory: exit %d %s", code, errOut)
	}
}

// TestCLIPythonSeesRewrites: a Python module rewritten to the same size
// within the same second is run as it is now, not from a bytecode cache
// written by the run before (PYTHONDONTWRITEBYTECODE=1 by default); a job
// that sets it to "" gets Python's own behaviour back.
func TestCLIPythonSeesRewrites(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this machine")
	}
	script := `echo 'x = 1' > m.py; touch -d '2020-01-01 00:00:00' m.py; python3 -c 'import m; print(m.x)'
echo 'x = 2' > m.py; touch -d '2020-01-01 00:00:00' m.py; python3 -c 'import m; print(m.x)'
ls __pycache__ 2>/dev/null | wc -l`
	out, errOut, code := cliRun(t, t.TempDir(), "", nil, nil, "run", "-q", "--script", script)
	if code != 0 || out != "1\n2\n0\n" {
		t.Errorf("exit %d, output %q, want 1, 2 and no __pycache__\n%s", code, out, errOut)
	}
	out, errOut, code = cliRun(t, t.TempDir(), "", nil, nil, "run", "-q", "--env", "PYTHONDONTWRITEBYTECODE=", "--script", script)
	if code != 0 || out != "1\n1\n1\n" {
		t.Errorf("with PYTHONDONTWRITEBYTECODE set to nothing: exit %d, output %q, want Python's own stale 1, 1 and a cache\n%s", code, out, errOut)
	}
}

// TestMCPStdinAndIdempotency: submit_job's stdin reaches the job; an
// idempotency key sent again with the same manifest, however its JSON is
// spelled, returns the same job, and with another manifest is refused,
// naming the key and the first job.
func TestMCPStdinAndIdempotency(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	sub := call[struct {
		JobID string `json:"job_id"`
	}](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "tr a-z A-Z", "stdin": base64.StdEncoding.EncodeToString([]byte("from mcp\n"))}})
	call[map[string]any](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 30})
	res := call[struct {
		Output string `json:"output"`
	}](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Output != "FROM MCP\n" {
		t.Errorf("stdin over MCP: output %q", res.Output)
	}
	submit := func(args string) *mcp.CallToolResult {
		r, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "submit_job", Arguments: json.RawMessage(args)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var firstOut, againOut struct {
		JobID string `json:"job_id"`
	}
	first := submit(`{"manifest":{"task":"true","env":{"A":"1","B":"2"}},"idempotency_key":"fh-key"}`)
	again := submit(`{"idempotency_key":"fh-key","manifest":{"env":{"B":"2","A":"1"},"task":"true","timeout":null}}`)
	json.Unmarshal([]byte(text(first)), &firstOut)
	json.Unmarshal([]byte(text(again)), &againOut)
	if first.IsError || again.IsError || firstOut.JobID == "" || firstOut.JobID != againOut.JobID {
		t.Fatalf("the same request twice: %s / %s", text(first), text(again))
	}
	other := submit(`{"manifest":{"task":"false","env":{"A":"1","B":"2"}},"idempotency_key":"fh-key"}`)
	if !other.IsError || !strings.Contains(text(other), `idempotency_key "fh-key" was used for job `+firstOut.JobID+" with a different manifest") {
		t.Errorf("the key with another manifest: %s", text(other))
	}
	// Ended before the server stops (a stopped server leaves its
	// sandboxes running, for the next one).
	call[map[string]any](t, cs, "wait_job", map[string]any{"job_id": firstOut.JobID, "timeout_seconds": 30})
}

// TestPveSimHelpDefaults: pve-sim --help shows no Go map for a flag's
// empty default.
func TestPveSimHelpDefaults(t *testing.T) {
	_, errOut, code := delegateCLI(t, t.TempDir(), "pve-sim", "--help")
	if code != 0 || strings.Contains(errOut, "map[") || !strings.Contains(errOut, "--fail-task") {
		t.Errorf("pve-sim --help: exit %d\n%s", code, errOut)
	}
}
