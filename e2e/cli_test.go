package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// delegateCLI runs the binary and returns stdout, stderr and exit code.
func delegateCLI(t *testing.T, dataDir string, args ...string) (string, string, int) {
	t.Helper()
	return delegateCLIEnv(t, dataDir, nil, args...)
}

// delegateCLIEnv is delegateCLI with more environment.
func delegateCLIEnv(t *testing.T, dataDir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	return delegateCLIWithin(t, 2*time.Minute, dataDir, env, args...)
}

// delegateCLIWithin is delegateCLIEnv with a deadline of its own, for a
// command whose job has real work to do (a first `go test` compiles the
// standard library: 40 s on an idle machine, over 2 minutes on a loaded
// one).
func delegateCLIWithin(t *testing.T, within time.Duration, dataDir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	// Past the test's deadline the command is stopped as a person would,
	// with Ctrl-C (its job is cancelled and its sandbox removed), and only
	// then killed: a SIGKILL left a sandbox's mounts behind, and the
	// test's TempDir cleanup failed on them.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn"), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := exitCode(t, cmd)
	return stdout.String(), stderr.String(), code
}

// exitCode runs cmd and returns its exit code; a command that could not
// be run at all fails the test.
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return 0
}

func TestCLIRun(t *testing.T) {
	dataDir := t.TempDir()
	local := filepath.Join(t.TempDir(), "input.txt")
	os.WriteFile(local, []byte("local file\n"), 0o644)

	out, errOut, code := delegateCLI(t, dataDir, "run", "--file", local+":in/input.txt", "--env", "GREETING=hi there",
		"--script", `cat in/input.txt; echo "$GREETING"; exit 7`)
	if out != "local file\nhi there\n" || code != 7 {
		t.Fatalf("run: stdout %q code %d\nstderr %s", out, code, errOut)
	}
	if !strings.Contains(errOut, "failed") || !strings.Contains(errOut, "exit code 7") {
		t.Errorf("run: stderr %q should report the outcome", errOut)
	}

	out, _, code = delegateCLI(t, dataDir, "run", "--timeout", "1", "--script", "sleep 30")
	if code != 124 {
		t.Fatalf("timeout: code %d out %q", code, out)
	}

	manifest := filepath.Join(t.TempDir(), "m.json")
	os.WriteFile(manifest, []byte(`{"agentType":"custom","agent":{"command":"echo \"$DELEGATE_TASK\""},"task":"from manifest"}`), 0o644)
	if out, errOut, code := delegateCLI(t, dataDir, "run", "--manifest", manifest); out != "from manifest\n" || code != 0 {
		t.Fatalf("manifest run: %q %d %s", out, code, errOut)
	}

	// Bad input: a clear message (once) and exit status, nothing stored.
	// delegate run's own failures are 125, apart from the job's codes.
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"run"}, "give --script CMD, --task TEXT (with --agent) or --manifest FILE", 125},
		{[]string{"run", "--script", "x", "--timeout", "999999"}, "manifest.timeout", 125},
		{[]string{"run", "--file", "nosuchfile", "--script", "x"}, "nosuchfile: no such file", 125},
		{[]string{"run", "--file", ":x", "--script", "x"}, "must be LOCAL or LOCAL:REMOTE", 125},
		{[]string{"jobs", "status", "job-nope"}, "not found", 1},
		{[]string{"frobnicate"}, "unknown command", 2},
	} {
		_, errOut, code := delegateCLI(t, dataDir, tc.args...)
		if code != tc.code || strings.Count(errOut, tc.want) != 1 {
			t.Errorf("%v: code %d stderr %q; want %d and %q once", tc.args, code, errOut, tc.code, tc.want)
		}
	}

	out, _, code = delegateCLI(t, dataDir, "jobs", "list", "--json")
	var list struct {
		Jobs []struct {
			JobID  string `json:"job_id"`
			Status string `json:"status"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 || len(list.Jobs) != 3 {
		t.Fatalf("jobs list: %v %q", err, out)
	}
	if list.Jobs[1].Status != "timeout" || list.Jobs[2].Status != "failed" {
		t.Fatalf("jobs list order/status: %+v", list.Jobs)
	}
	out, errOut, code = delegateCLI(t, dataDir, "jobs", "result", list.Jobs[2].JobID)
	if out != "local file\nhi there\n" || !strings.Contains(errOut, "exit code 7") || code != 7 {
		t.Fatalf("jobs result: %q %q exit %d", out, errOut, code)
	}
	if out, errOut, code := delegateCLI(t, dataDir, "jobs", "logs", list.Jobs[2].JobID); out != "local file\nhi there\n" || code != 0 {
		t.Fatalf("jobs logs: %q %d %s", out, code, errOut)
	}
	out, _, _ = delegateCLI(t, dataDir, "jobs", "cancel", list.Jobs[2].JobID)
	if !strings.Contains(out, "already finished") {
		t.Fatalf("jobs cancel of a finished job: %q", out)
	}
}

func TestInvalidConfig(t *testing.T) {
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(os.Environ(), "DEFAULT_TIMEOUT=0", "DEFAULT_MEMORY=huge")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
		t.Fatalf("want exit 2, got %v", err)
	}
	for _, want := range []string{"DEFAULT_TIMEOUT", "DEFAULT_MEMORY"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("message %q does not name %s", out, want)
		}
	}
}

// TestCLIConventions: the documented forms, through the binary: flags
// after arguments, help everywhere, --file without a remote name, and
// following the output of a running job from another process.
func TestCLIConventions(t *testing.T) {
	dataDir := t.TempDir()
	for _, args := range [][]string{{"jobs", "--help"}, {"jobs", "logs", "--help"}, {"help", "run"}, {"--help"}} {
		out, errOut, code := delegateCLI(t, dataDir, args...)
		if code != 0 || !strings.Contains(out, "Usage:") || errOut != "" {
			t.Errorf("%v: exit %d stdout %q stderr %q", args, code, out, errOut)
		}
	}

	local := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(local, []byte("from the host\n"), 0o644)
	out, errOut, code := delegateCLI(t, dataDir, "run", "--file", local, "--script", "cat notes.txt")
	if code != 0 || out != "from the host\n" {
		t.Fatalf("--file without REMOTE: exit %d %q %s", code, out, errOut)
	}
	id := newestJob(t, dataDir)
	out, _, code = delegateCLI(t, dataDir, "jobs", "status", id, "--json")
	var st struct {
		JobID    string `json:"job_id"`
		Status   string `json:"status"`
		Manifest struct {
			StatusMode string `json:"statusMode"`
		} `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 || st.JobID != id || st.Status != "success" ||
		st.Manifest.StatusMode != "streaming" {
		t.Fatalf("jobs status ID --json: exit %d %v %q", code, err, out)
	}

	// Follow a running job from a second process: a delegate run job
	// (streaming, by default) line by line, a statusMode simple one when
	// it ends.
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"streaming", []string{"run", "-q", "--script", "for i in 1 2 3; do echo line $i; sleep 0.4; done"}},
		{"not streaming", []string{"run", "-q", "--manifest", writeManifest(t,
			`{"agentType":"script","statusMode":"detailed","task":"echo step > \"$DELEGATE_STATUS_FILE\"; for i in 1 2 3; do echo line $i; sleep 0.4; done"}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := exec.CommandContext(testContext(t), binary, tc.args...)
			runner.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
			if err := runner.Start(); err != nil {
				t.Fatal(err)
			}
			defer runner.Wait()
			id := ""
			for range 200 {
				out, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--status", "running", "--json")
				var l struct {
					Jobs []struct {
						JobID string `json:"job_id"`
					} `json:"jobs"`
				}
				if json.Unmarshal([]byte(out), &l) == nil && len(l.Jobs) == 1 {
					id = l.Jobs[0].JobID
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if id == "" {
				t.Fatal("the job was never seen running")
			}
			out, errOut, code := delegateCLI(t, dataDir, "jobs", "logs", id, "--follow")
			if code != 0 || out != "line 1\nline 2\nline 3\n" {
				t.Fatalf("jobs logs ID --follow: exit %d stdout %q stderr %q", code, out, errOut)
			}
			if tc.name == "not streaming" {
				if !strings.Contains(errOut, "printed when it ends") {
					t.Errorf("no word that the output comes at the end: %q", errOut)
				}
				out, _, _ := delegateCLI(t, dataDir, "jobs", "status", id)
				if !strings.Contains(out, "timeline:") || !strings.Contains(out, "step") {
					t.Errorf("jobs status shows no timeline:\n%s", out)
				}
			}
		})
	}
}

func newestJob(t *testing.T, dataDir string) string {
	t.Helper()
	out, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--limit", "1", "--json")
	var l struct {
		Jobs []struct {
			JobID string `json:"job_id"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Jobs) != 1 {
		t.Fatalf("jobs list: %v %q", err, out)
	}
	return l.Jobs[0].JobID
}

func writeManifest(t *testing.T, manifest string) string {
	path := filepath.Join(t.TempDir(), "manifest.json")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
