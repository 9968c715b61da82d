//go:build linux

package e2e

import (
	"encoding/base64"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testnet"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestEgressConnectionCap (issue 34, item 4): a server with 512 open files
// (soft and hard) runs a job that opens 900 connections to its proxy and
// holds them; the job hits its cap (DELEGATE_EGRESS_MAX_CONNS), the
// refusal is in its network log, and meanwhile another job's proxy works
// and the server reads both jobs' output. Before the caps the proxy took
// every descriptor the server had: accept4 failed for every sandbox and
// the server could no longer read a job's output.
func TestEgressConnectionCap(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	testnet.World(t)
	dataDir := t.TempDir()
	cmd := exec.Command("sh", "-c", `ulimit -n 512 && exec "$0" serve`, binary)
	cmd.Env = serverEnv(dataDir, "DELEGATE_EGRESS_MAX_CONNS=32", "DELEGATE_NOFILE=400")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(testContext(t),
		&mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	allow := map[string]any{"allow": []string{"allowed.test"}}
	// Three processes of 300 connections each, held open (bash: /dev/tcp).
	hold := `hold() { n=0; for i in $(seq 300); do exec {fd}<>/dev/tcp/10.0.2.2/3128 2>/dev/null && n=$((n+1)); done; echo "$1 opened $n"; sleep 600; }
hold a & hold b & hold c &
wait
`
	greedy := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": "bash hold.sh", "agentType": "script", "network": allow, "timeout": 900, "statusMode": "streaming",
		"files": []map[string]any{{"path": "hold.sh", "content": base64.StdEncoding.EncodeToString([]byte(hold))}}}})
	// Its refusals are in its network log.
	deadline := time.Now().Add(40 * time.Second)
	for {
		out, _, _ := delegateCLI(t, dataDir, "jobs", "network", greedy.JobID, "--denied", "--limit", "50")
		if strings.Contains(out, "over the job's cap of 32 connections at once") {
			break
		}
		if time.Now().After(deadline) {
			logs, _, _ := delegateCLI(t, dataDir, "jobs", "logs", greedy.JobID)
			t.Errorf("no refusal in the greedy job's network log:\n%s\nits output: %q", out, logs)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Meanwhile, another job's proxy works and its output comes back.
	other := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": `for i in 1 2 3; do curl -sS --max-time 20 http://allowed.test/; done; echo done`, "agentType": "script", "network": allow}})
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": other.JobID, "timeout_seconds": 50}); st.Status != "success" {
		t.Errorf("the other job: %+v", st)
	}
	res := call[wsResult](t, cs, "get_job_result", map[string]any{"job_id": other.JobID})
	if want := strings.Repeat("hello from allowed\n", 3) + "done\n"; res.Output != want {
		t.Errorf("the other job's output: %q, want %q (stderr %q)", res.Output, want, res.Stderr)
	}
	// And the greedy one's output is read while it holds what it got.
	deadline = time.Now().Add(90 * time.Second)
	for {
		out, _, _ := delegateCLI(t, dataDir, "jobs", "logs", greedy.JobID)
		if strings.Count(out, " opened ") == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the greedy job's output: %q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	call[statusOut](t, cs, "cancel_job", map[string]any{"job_id": greedy.JobID})
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": greedy.JobID, "timeout_seconds": 50}); st.Status != "cancelled" {
		t.Errorf("the greedy job, cancelled: %+v", st)
	}
	waitSandboxesGone(t, dataDir)
	if strings.Contains(stderr.String(), "too many open files") {
		t.Errorf("the server ran out of descriptors")
	}
}
