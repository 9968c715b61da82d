package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type logsOut struct {
	Output     string `json:"output"`
	NextCursor string `json:"next_cursor"`
	Done       bool   `json:"done"`
	Status     string `json:"status"`
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestCallbacksOverHTTP: the job's token and callback URL work against the
// real callback server; other tokens do not.
func TestCallbacksOverHTTP(t *testing.T) {
	port := freePort(t)
	cs, _, _ := stdioSession(t, t.TempDir(), "", fmt.Sprintf("CALLBACK_PORT=%d", port))
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "statusMode": "streaming",
		// A test-only job that shows its credentials, so the test can act as it.
		"task": `echo "$DELEGATE_CALLBACK_URL $DELEGATE_JOB_TOKEN"; sleep 60`}})
	waitFor(t, cs, sub.JobID, "running")
	var url, token string
	for range 100 {
		out := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": sub.JobID}).Output
		if f := strings.Fields(out); len(f) == 2 {
			url, token = f[0], f[1]
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.HasPrefix(url, fmt.Sprintf("http://127.0.0.1:%d/callback/%s", port, sub.JobID)) || !strings.HasPrefix(token, "dlg_") {
		t.Fatalf("callback url %q token %q", url, token)
	}
	post := func(kind, token, body string) int {
		req, _ := http.NewRequest("POST", url+"/"+kind, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post("status", "", `{"progress":"x"}`); c != 401 {
		t.Fatalf("no token: %d", c)
	}
	if c := post("status", token, `{"progress":"half way","percent":50}`); c != 200 {
		t.Fatalf("status: %d", c)
	}
	st := call[struct {
		Progress string `json:"progress"`
		Timeline []struct {
			Message string `json:"message"`
		} `json:"timeline"`
	}](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID})
	if st.Progress != "half way (50%)" || len(st.Timeline) == 0 || st.Timeline[len(st.Timeline)-1].Message != "half way (50%)" {
		t.Fatalf("status after callback: %+v", st)
	}
	if c := post("complete", token, `{"status":"success","result":"reported by the job"}`); c != 200 {
		t.Fatalf("complete: %d", c)
	}
	res := call[struct {
		Status string `json:"status"`
		Result string `json:"result"`
	}](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Status != "success" || res.Result != "reported by the job" {
		t.Fatalf("result: %+v", res)
	}
	if c := post("complete", token, `{"status":"failed"}`); c != 409 {
		t.Fatalf("late completion: %d", c)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v", err)
	}
}

// TestLiveLogs follows a streaming job with get_job_logs cursors and with a
// resource subscription, over stdio and HTTP.
func TestLiveLogs(t *testing.T) {
	for _, transport := range []string{"stdio", "http", "stdio-newest", "http-newest"} {
		t.Run(transport, func(t *testing.T) {
			var (
				mu      sync.Mutex
				updated = map[string]int{}
			)
			opts := &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
				mu.Lock()
				updated[req.Params.URI]++
				mu.Unlock()
			}}
			var cs *mcp.ClientSession
			switch transport {
			case "stdio":
				cs, _, _ = stdioSessionWith(t, t.TempDir(), "2025-11-25", opts)
			case "stdio-newest": // 2026-07-28: updates come through subscriptions/listen
				cs, _, _ = stdioSessionWith(t, t.TempDir(), "", opts)
			case "http-newest": // 2026-07-28 over HTTP: stateless, with a listen stream
				cs = httpSessionWith(t, httpServer(t, t.TempDir()), "", opts)
			default:
				cs = httpSessionWith(t, httpServer(t, t.TempDir()), "2025-11-25", opts)
			}
			sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
				"agentType": "script", "statusMode": "streaming",
				"task": `for i in 1 2 3 4 5; do echo "line $i"; sleep 0.3; done`}})
			for _, uri := range []string{"job://" + sub.JobID, "job://" + sub.JobID + "/log"} {
				if err := cs.Subscribe(testContext(t), &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatal(err)
				}
			}
			var (
				all       strings.Builder
				cursor    string
				sawBefore bool // output read while the job still ran
			)
			for range 400 {
				l := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": sub.JobID, "cursor": cursor})
				all.WriteString(l.Output)
				if l.Output != "" && l.Status == "running" {
					sawBefore = true
				}
				cursor = l.NextCursor
				if l.Done {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if all.String() != "line 1\nline 2\nline 3\nline 4\nline 5\n" || !sawBefore {
				t.Fatalf("followed output %q (read while running: %v)", all.String(), sawBefore)
			}
			res, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + sub.JobID + "/log"})
			if err != nil || res.Contents[0].Text != all.String() {
				t.Fatalf("log resource: %v %+v", err, res)
			}
			res, err = cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + sub.JobID})
			if err != nil || !strings.Contains(res.Contents[0].Text, `"status":"success"`) {
				t.Fatalf("status resource: %v %+v", err, res)
			}
			if _, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://job-nope"}); err == nil {
				t.Fatal("unknown job resource was read")
			}
			time.Sleep(200 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if updated["job://"+sub.JobID] < 3 || updated["job://"+sub.JobID+"/log"] < 3 {
				t.Fatalf("resource updates received: %v", updated)
			}
		})
	}
}

// TestArtifactsAndSecrets: artifacts come back with their sha256 (through
// get_job_result, a resource and the CLI), and a secret the job prints
// leaves no trace in the server's storage.
func TestArtifactsAndSecrets(t *testing.T) {
	const secret = "sk-test-8e1f2d3c4b5a6978"
	dataDir := t.TempDir()
	secretsFile := filepath.Join(t.TempDir(), "secrets")
	os.WriteFile(secretsFile, []byte("# test secrets\nAPI_KEY="+secret+"\n"), 0o600)
	cs, _, _ := stdioSession(t, dataDir, "", "DELEGATE_SECRETS_FILE="+secretsFile)
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script",
		"secrets":   []string{"API_KEY"},
		"artifacts": []string{"out/**", "report.txt"},
		"task": `mkdir -p out/deep; echo "key is $API_KEY"; printf 'report %s\n' "$API_KEY" > report.txt;
			head -c 3000 /dev/urandom > out/deep/blob.bin; echo hi > out/a.txt; echo skip > other.txt`}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
	res := call[struct {
		Status    string `json:"status"`
		Output    string `json:"output"`
		Artifacts []struct {
			Name   string `json:"name"`
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		} `json:"artifacts"`
	}](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Status != "success" || res.Output != "key is [REDACTED]\n" {
		t.Fatalf("result: %+v", res)
	}
	names := map[string]string{}
	for _, a := range res.Artifacts {
		names[a.Name] = a.SHA256
	}
	if len(names) != 3 || names["out/a.txt"] == "" || names["out/deep/blob.bin"] == "" || names["report.txt"] == "" {
		t.Fatalf("artifacts: %+v", res.Artifacts)
	}
	// Through the resource: the same bytes as the hash says.
	r, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + sub.JobID + "/artifacts/out/deep/blob.bin"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(r.Contents[0].Blob)
	if len(r.Contents[0].Blob) != 3000 || hex.EncodeToString(sum[:]) != names["out/deep/blob.bin"] {
		t.Fatalf("blob resource: %d bytes", len(r.Contents[0].Blob))
	}
	// Through the CLI, on the same data dir.
	out, errOut, code := delegateCLI(t, dataDir, "jobs", "artifact", sub.JobID, "out/a.txt")
	if code != 0 || out != "hi\n" {
		t.Fatalf("jobs artifact: %d %q %s", code, out, errOut)
	}
	// The artifact is the job's own file, kept as it wrote it (secrets in
	// files are the job's business); everything delegate stores itself is
	// free of the value. The sandbox's own files (the raw output the
	// supervisor keeps while the job runs) go with the sandbox, which is
	// destroyed just after the job is marked finished: wait for that.
	waitSandboxesGone(t, dataDir)
	var found []string
	filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.Contains(p, string(filepath.Separator)+"artifacts"+string(filepath.Separator)) {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(secret)) {
				found = append(found, p)
			}
		}
		return nil
	})
	if len(found) > 0 {
		t.Fatalf("the secret value is stored in %v", found)
	}
	// An unknown secret is refused at submission.
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "secrets": []string{"NOPE"}}}); !regexp.MustCompile(`manifest\.secrets\[0\].*NOPE`).MatchString(msg) {
		t.Fatalf("unknown secret: %q", msg)
	}
}

// TestStatusFile: a job with no network reports progress in one line of
// shell, and the agent sees it as progress and a timeline.
func TestStatusFile(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "statusMode": "detailed",
		"task": `echo "fetching" > "$DELEGATE_STATUS_FILE"; sleep 0.3; echo '{"progress":"testing","percent":75}' > "$DELEGATE_STATUS_FILE"; sleep 0.3`}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
	st := call[struct {
		Status   string `json:"status"`
		Timeline []struct {
			Message string `json:"message"`
		} `json:"timeline"`
	}](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID})
	var msgs []string
	for _, e := range st.Timeline {
		msgs = append(msgs, e.Message)
	}
	if st.Status != "success" || strings.Join(msgs, "|") != "fetching|testing (75%)" {
		t.Fatalf("status %s timeline %q", st.Status, msgs)
	}
}

// waitSandboxesGone waits until no sandbox is left in the data dir.
func waitSandboxesGone(t *testing.T, dataDir string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		entries, err := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
		if err != nil || len(entries) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes left after the job ended: %d", len(entries))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStatusFlood: `timeout 5 yes > "$DELEGATE_STATUS_FILE"` once kept the
// server busy for minutes. Now the flooding job (with a 4 MB file in its
// manifest) is killed at its 2 s timeout and records a duration within
// the timeout plus the 5 s kill grace; meanwhile another job runs to its
// end and the tools answer; the timeline keeps the newest entries and
// counts the others.
func TestStatusFlood(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	file := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16))
	flood := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "statusMode": "detailed", "timeout": 2,
		"files": []map[string]any{{"path": "big.bin", "content": file}},
		"task":  `timeout 5 yes > "$DELEGATE_STATUS_FILE"; echo never`}})
	waitFor(t, cs, flood.JobID, "running")
	time.Sleep(500 * time.Millisecond) // let it flood

	other := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo other"}})
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": other.JobID, "timeout_seconds": 30})
	if st.Status != "success" {
		t.Fatalf("the other job: %+v", st)
	}
	if res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": other.JobID}); res.Output != "other\n" {
		t.Fatalf("the other job's output: %q", res.Output)
	}

	st = call[statusOut](t, cs, "wait_job", map[string]any{"job_id": flood.JobID, "timeout_seconds": 30})
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": flood.JobID})
	if st.Status != "timeout" || res.DurationSeconds > 2+5 {
		t.Fatalf("flooding job: %+v, ran %.1fs", st, res.DurationSeconds)
	}
	full := call[struct {
		Progress        string `json:"progress"`
		Timeline        []any  `json:"timeline"`
		TimelineDropped int64  `json:"timeline_dropped"`
	}](t, cs, "get_job_status", map[string]any{"job_id": flood.JobID})
	if len(full.Timeline) != 200 || full.TimelineDropped < 1000 {
		t.Fatalf("flooding job's timeline: %d entries, %d dropped", len(full.Timeline), full.TimelineDropped)
	}
}
