package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// delegateCLI runs the binary and returns stdout, stderr and exit code.
func delegateCLI(t *testing.T, dataDir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), binary, args...)
	cmd.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("delegate %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
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

	// Bad input: a clear message and exit status, nothing stored.
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"run"}, "give --script CMD or --manifest FILE", 2},
		{[]string{"run", "--script", "x", "--timeout", "999999"}, "manifest.timeout", 1},
		{[]string{"run", "--file", "nocolon", "--script", "x"}, "must be LOCAL:REMOTE", 2},
		{[]string{"jobs", "status", "job-nope"}, "not found", 1},
		{[]string{"frobnicate"}, "unknown command", 2},
	} {
		_, errOut, code := delegateCLI(t, dataDir, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
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
	out, errOut, _ = delegateCLI(t, dataDir, "jobs", "result", list.Jobs[2].JobID)
	if out != "local file\nhi there\n" || !strings.Contains(errOut, "exit code 7") {
		t.Fatalf("jobs result: %q %q", out, errOut)
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
