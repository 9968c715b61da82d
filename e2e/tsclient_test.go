package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTypeScriptClient drives delegate with the official TypeScript SDK
// client from npm, over stdio and over Streamable HTTP.
func TestTypeScriptClient(t *testing.T) {
	if _, err := os.Stat(filepath.Join("tsclient", "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript client is not installed: run ./test (or npm ci in e2e/tsclient): %v", err)
	}
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			target := binary
			if mode == "http" {
				target = httpServer(t, dataDir)
			}
			cmd := exec.CommandContext(testContext(t), "node", "client.mjs", mode, target)
			cmd.Dir = "tsclient"
			cmd.Env = serverEnv(dataDir)
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("node client: %v\n%s", err, stderr)
			}
			var report struct {
				Tools     []string `json:"tools"`
				Submitted struct {
					JobID string `json:"job_id"`
				} `json:"submitted"`
				Waited   string   `json:"waited"`
				Progress []string `json:"progress"`
				Result   struct {
					Status   string `json:"status"`
					ExitCode int    `json:"exit_code"`
					Output   string `json:"output"`
				} `json:"result"`
				BadError string `json:"badError"`
				Logs     struct {
					Followed     string `json:"followed"`
					WhileRunning bool   `json:"whileRunning"`
					LogUpdates   int    `json:"logUpdates"`
				} `json:"logs"`
			}
			if err := json.Unmarshal(out, &report); err != nil {
				t.Fatalf("report %q: %v", out, err)
			}
			t.Logf("TS client saw: %s", out)
			if !slices.Contains(report.Tools, "submit_job") || report.Waited != "success" || report.Result.Status != "success" ||
				report.Result.Output != "task=hello from TS; $(id)\n" {
				t.Fatalf("unexpected report: %+v", report)
			}
			if !strings.Contains(report.BadError, "manifest.lifecycle") {
				t.Fatalf("bad manifest error: %q", report.BadError)
			}
			if report.Logs.Followed != "tick 1\ntick 2\ntick 3\ntick 4\n" || !report.Logs.WhileRunning || report.Logs.LogUpdates < 2 {
				t.Errorf("live logs through the TS client: %+v", report.Logs)
			}
			// The job runs for a second: wait_job reports its progress.
			if len(report.Progress) == 0 {
				t.Errorf("no progress notifications during wait_job")
			}
		})
	}
}
