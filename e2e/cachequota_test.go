package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestCacheNotSavedOverHTTP (issue 36): a job of alice's (a token of her
// own) leaves more in its cache than DELEGATE_QUOTA_DISK has room for;
// the cache is not written back, and alice's next job that takes it is
// told why in get_job_result's cache (through the TypeScript client), as
// `delegate jobs result` tells the operator.
func TestCacheNotSavedOverHTTP(t *testing.T) {
	root, dataDir := t.TempDir(), t.TempDir()
	dir := calcProject(t, root)
	mcpURL := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken, "DELEGATE_QUOTA_DISK=1M", "DELEGATE_WORKSPACE_ROOTS="+root) + "/mcp"
	alice, _ := newToken(t, dataDir, "alice", "jobs")
	runJob := func(task string) (string, json.RawMessage) {
		t.Helper()
		m := map[string]any{"agentType": "script", "task": task, "workspace": map[string]any{"dir": dir}, "caches": []string{"go"}}
		id := field(t, as(t, mcpURL, alice, tool("submit_job", map[string]any{"manifest": m}))[0].ok(t, "submit"), "job_id")
		var w struct {
			Done   bool            `json:"done"`
			Result json.RawMessage `json:"result"`
		}
		testkit.Eventually(t, 2*time.Minute, "job "+id+" to end", func() bool {
			raw := as(t, mcpURL, alice, tool("wait_job", map[string]any{"job_id": id, "timeout_seconds": 50}))[0].ok(t, "wait_job")
			json.Unmarshal(raw, &w)
			return w.Done
		})
		// Its sandbox goes, and gives the cache back, after its end.
		testkit.Eventually(t, time.Minute, "job "+id+"'s sandbox gone", func() bool {
			ents, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "sb-") {
					return false
				}
			}
			return true
		})
		return id, w.Result
	}
	big, _ := runJob("head -c 1500000 /dev/zero >/cache/go/blob")
	next, res := runJob("test ! -e /cache/go/blob")
	want := "go: the changes job " + big + " made were not saved in it: over the quota of alice: disk of caches " +
		"(what its checkpoints leave of the disk quota): 0 B now, this asks for 1.4 MiB more, the quota is 1.0 MiB (DELEGATE_QUOTA_DISK on the server)"
	var r struct {
		Status string `json:"status"`
		Cache  string `json:"cache"`
	}
	if json.Unmarshal(res, &r); r.Status != "success" || !strings.HasPrefix(r.Cache, want) {
		t.Errorf("alice's next job's result: %s\nwant its cache to begin %q", res, want)
	}
	t.Logf("get_job_result's cache: %s", r.Cache)
	if _, stderr, code := delegateCLI(t, dataDir, "jobs", "result", next); code != 0 || !strings.Contains(stderr, "delegate: cache "+want) {
		t.Errorf("jobs result %s: exit %d, stderr %q; want %q", next, code, stderr, "delegate: cache "+want)
	}
}
