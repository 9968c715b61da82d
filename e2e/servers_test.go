package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestServersListAndDrain: `delegate servers` lists a server sharing a
// PostgreSQL store with its live lease, address (where the others reach
// its --http listener, its port chosen at start) and the job it runs;
// `delegate servers drain` (by the start of its id) makes it refuse new
// jobs, naming why, while its running job goes on.
func TestServersListAndDrain(t *testing.T) {
	url := pgtest.Own(t, pgtest.Options{}).NewDatabase(t)
	dataDir := t.TempDir()
	pg := []string{"DELEGATE_STORE=" + url}
	base := startHTTP(t, dataDir, nil, append(pg, "DELEGATE_LEASE_TTL=3s")...)
	cs := httpSession(t, base+"/mcp", "")
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 3; echo drained"}})
	waitStatus(t, cs, job.JobID, "running")

	out, errOut, code := delegateCLIEnv(t, t.TempDir(), pg, "servers")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "SERVER") || !strings.Contains(lines[1], "live (renewed") ||
		!strings.Contains(lines[1], "1 running") || !strings.Contains(lines[1], base) {
		t.Fatalf("delegate servers: %d %q %s", code, out, errOut)
	}
	id := strings.Fields(lines[1])[0]
	out, errOut, code = delegateCLIEnv(t, t.TempDir(), pg, "servers", "drain", id[:len(id)-4])
	if code != 0 || !strings.Contains(out, "Server "+id+" drains") {
		t.Fatalf("delegate servers drain: %d %q %s", code, out, errOut)
	}
	// Submits taken before the drain reached the server run to their end
	// below: a job still running when the server stops keeps its sandbox
	// (for the next server to adopt), and its mounts in the test's data dir.
	var taken []string
	testkit.Eventually(t, 30*time.Second, "a submit refused", func() bool {
		res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "submit_job", Arguments: map[string]any{
			"manifest": map[string]any{"agentType": "script", "task": "true"}}})
		if err == nil && !res.IsError {
			var sub submitOut
			raw, _ := json.Marshal(res.StructuredContent)
			if json.Unmarshal(raw, &sub) == nil && sub.JobID != "" {
				taken = append(taken, sub.JobID)
			}
		}
		return err == nil && res.IsError && strings.Contains(text(res), "is draining and takes no new jobs")
	})
	for _, id := range taken {
		call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id})
	}
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": job.JobID}); st.Status != "success" {
		t.Errorf("the running job: %+v", st)
	}
	if out, _, _ := delegateCLIEnv(t, t.TempDir(), pg, "servers"); !strings.Contains(out, ", draining") {
		t.Errorf("after the drain: %q", out)
	}
	if _, errOut, code := delegateCLIEnv(t, t.TempDir(), pg, "servers", "drain", "nobody"); code == 0 || !strings.Contains(errOut, `server "nobody": not found`) {
		t.Errorf("drain of no server: %d %s", code, errOut)
	}
}
