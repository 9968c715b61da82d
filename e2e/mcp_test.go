package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type submitOut struct {
	JobID  string `json:"job_id"`
	Status string `json:"status"`
}

type statusOut struct {
	JobID    string `json:"job_id"`
	Status   string `json:"status"`
	Progress string `json:"progress"`
	Error    string `json:"error"`
}

type resultOut struct {
	JobID           string  `json:"job_id"`
	Status          string  `json:"status"`
	ExitCode        *int    `json:"exit_code"`
	Output          string  `json:"output"`
	Stderr          string  `json:"stderr"`
	OutputBytes     int64   `json:"output_bytes"`
	OutputTruncated bool    `json:"output_truncated"`
	Error           string  `json:"error"`
	DurationSeconds float64 `json:"duration_seconds"`
	OutputURI       string  `json:"output_uri"`
}

type listOut struct {
	Jobs []struct {
		JobID  string `json:"job_id"`
		Status string `json:"status"`
		Task   string `json:"task"`
	} `json:"jobs"`
	NextCursor string `json:"next_cursor"`
}

// The protocol versions real clients speak (see
// ../shared/reference/mcp-go.md): two with sessions, and 2026-07-28 (the
// Go client's newest, "" below), which is stateless over HTTP.
var protocols = []string{"2025-06-18", "2025-11-25", ""}

// newestProtocol is what "" negotiates, on stdio and over HTTP alike.
const newestProtocol = "2026-07-28"

func TestToolsList(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	res, err := cs.ListTools(testContext(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if tool.OutputSchema == nil {
			t.Errorf("%s has no outputSchema", tool.Name)
		}
		// Hints whose default would be wrong are given.
		a := tool.Annotations
		switch {
		case a == nil:
			t.Errorf("%s has no annotations", tool.Name)
		case tool.Name == "submit_job" && (a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint):
			t.Errorf("submit_job: not read-only, not destructive: %+v", a)
		case tool.Name != "submit_job" && (a.OpenWorldHint == nil || *a.OpenWorldHint):
			t.Errorf("%s: closed world: %+v", tool.Name, a)
		case strings.HasPrefix(tool.Name, "get_") || tool.Name == "list_jobs" || tool.Name == "wait_job":
			if !a.ReadOnlyHint {
				t.Errorf("%s: read-only: %+v", tool.Name, a)
			}
		}
	}
	for _, want := range []string{"submit_job", "get_job_status", "get_job_result", "cancel_job", "list_jobs", "wait_job", "get_job_logs", "release_job"} {
		if !slices.Contains(names, want) {
			t.Errorf("tool %s missing from %v", want, names)
		}
	}
	raw, _ := json.Marshal(res.Tools)
	// The budget is enforced once, by mcpserver's TestToolsListSize.
	t.Logf("tools/list's tools are %d bytes", len(raw))
}

// TestJobLifecycle runs the same conversation over stdio and HTTP, in each
// protocol version.
func TestJobLifecycle(t *testing.T) {
	for _, transport := range []string{"stdio", "http"} {
		for _, proto := range protocols {
			name := transport + "/" + proto
			if proto == "" {
				name = transport + "/newest"
			}
			t.Run(name, func(t *testing.T) {
				dataDir := t.TempDir()
				var cs *mcp.ClientSession
				if transport == "stdio" {
					cs, _, _ = stdioSession(t, dataDir, proto)
				} else {
					cs = httpSession(t, httpServer(t, dataDir), proto)
				}
				want := proto
				if want == "" {
					want = newestProtocol
				}
				if got := cs.InitializeResult().ProtocolVersion; got != want {
					t.Fatalf("negotiated protocol %s, want %s", got, want)
				}
				lifecycle(t, cs)
			})
		}
	}
}

// justSubmitted: the status a job has as its submission returns: queued
// (pending), or claimed at once when a run slot was free (provisioning).
func justSubmitted[S ~string](st S) bool { return st == "pending" || st == "provisioning" }

func lifecycle(t *testing.T, cs *mcp.ClientSession) {
	// A job with a file and an env value that would be dangerous if it were
	// ever spliced into a shell line.
	nasty := `$(touch /workspace/pwned); "quoted" 'single' ; exit 9`
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script",
		"task":      `cat data/in.txt; printf '%s\n' "$NASTY"; echo err >&2; ls /workspace/pwned 2>/dev/null || echo clean; exit 3`,
		"files":     []map[string]string{{"path": "data/in.txt", "content": base64.StdEncoding.EncodeToString([]byte("from a file\n"))}},
		"env":       map[string]string{"NASTY": nasty},
		"timeout":   60,
	}})
	if !strings.HasPrefix(sub.JobID, "job-") || !justSubmitted(sub.Status) {
		t.Fatalf("submit: %+v", sub)
	}
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 30})
	if st.Status != "failed" || st.Error != "exit code 3" {
		t.Fatalf("wait_job: %+v", st)
	}
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	// stdout and stderr come apart; output_bytes counts both.
	want, wantErr := "from a file\n"+nasty+"\nclean\n", "err\n"
	if res.Output != want || res.Stderr != wantErr || res.ExitCode == nil || *res.ExitCode != 3 || res.OutputBytes != int64(len(want)+len(wantErr)) || res.OutputTruncated {
		t.Fatalf("result: %+v\nwant output %q, stderr %q", res, want, wantErr)
	}

	// A long job: the result is refused while it runs, then cancel kills it.
	long := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}})
	waitFor(t, cs, long.JobID, "running")
	if msg := callErr(t, cs, "get_job_result", map[string]any{"job_id": long.JobID}); !strings.Contains(msg, "is running") || !strings.Contains(msg, "wait_job") {
		t.Fatalf("result of a running job: %q", msg)
	}
	start := time.Now()
	c := call[struct {
		Status    string `json:"status"`
		Cancelled bool   `json:"cancelled"`
	}](t, cs, "cancel_job", map[string]any{"job_id": long.JobID})
	if !c.Cancelled || c.Status != "cancelled" {
		t.Fatalf("cancel: %+v", c)
	}
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": long.JobID}); st.Status != "cancelled" || time.Since(start) > 20*time.Second {
		t.Fatalf("after cancel: %+v", st)
	}

	// Bad input names the field and the rule.
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "timeout": 100000}}, "manifest.timeout: must be between 1 and 86400"},
		{map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "files": []map[string]string{{"path": "../x", "content": ""}}}}, "manifest.files[0].path"},
		{map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "resources": map[string]any{"memory": "lots"}}}, "manifest.resources.memory"},
		{map[string]any{"manifest": map[string]any{"agentType": "custom", "task": "x"}}, "manifest.agent.command: is required"},
		{map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "timeout": 0}}, "manifest.timeout: must be between 1 and 86400"},
		{map[string]any{"manifest": nil}, "manifest: required (an object)"},
		{map[string]any{"manifest": map[string]any{"agentType": "script", "task": "x", "timeout": "sixty"}}, "manifest.timeout: must be seconds or a duration of whole seconds"},
	} {
		if msg := callErr(t, cs, "submit_job", tc.args); !strings.Contains(msg, tc.want) {
			t.Errorf("submit %v: %q, want %q", tc.args, msg, tc.want)
		}
	}
	if msg := callErr(t, cs, "get_job_status", map[string]any{"job_id": "job-nope"}); !strings.Contains(msg, "not found") {
		t.Errorf("unknown job: %q", msg)
	}

	// Listing pages through both jobs, newest first.
	page := call[listOut](t, cs, "list_jobs", map[string]any{"limit": 1})
	if len(page.Jobs) != 1 || page.Jobs[0].JobID != long.JobID || page.NextCursor == "" {
		t.Fatalf("list page 1: %+v", page)
	}
	page = call[listOut](t, cs, "list_jobs", map[string]any{"limit": 1, "cursor": page.NextCursor})
	if len(page.Jobs) != 1 || page.Jobs[0].JobID != sub.JobID || page.NextCursor != "" {
		t.Fatalf("list page 2: %+v", page)
	}
	if page := call[listOut](t, cs, "list_jobs", map[string]any{"status": "cancelled"}); len(page.Jobs) != 1 {
		t.Fatalf("list cancelled: %+v", page)
	}
}

// waitFor polls get_job_status until the job has the status.
func waitFor(t *testing.T, cs *mcp.ClientSession, id, status string) statusOut {
	t.Helper()
	var st statusOut
	for range 200 {
		st = call[statusOut](t, cs, "get_job_status", map[string]any{"job_id": id})
		if st.Status == status {
			return st
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("job %s never became %s: %+v", id, status, st)
	return st
}

func TestTimeoutOverMCP(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo started; sleep 100 & sleep 100 & wait", "timeout": 1}})
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 30})
	if st.Status != "timeout" || !strings.Contains(st.Error, "timed out after 1s") {
		t.Fatalf("%+v", st)
	}
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Output != "started\n" {
		t.Fatalf("output %q", res.Output)
	}
}

func TestOutputCap(t *testing.T) {
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "head -c 6000000 /dev/zero | tr '\\0' x; echo; echo tail"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID, "max_output_bytes": 100})
	if res.Status != "success" || res.OutputBytes != 6000006 || !res.OutputTruncated || len(res.Output) != 100 {
		t.Fatalf("status %s bytes %d truncated %v len %d", res.Status, res.OutputBytes, res.OutputTruncated, len(res.Output))
	}
}

// TestStdioServerRuntime: `delegate serve` on stdio reads its stdin (a
// pipe the client made, in blocking mode) through the poller, which puts
// it in non-blocking mode, and runs its Go code on one processor unless
// GOMAXPROCS says otherwise (docs/BENCHMARKS.md says why).
func TestStdioServerRuntime(t *testing.T) {
	tests := []struct {
		env  []string
		want string
	}{
		{nil, "gomaxprocs=1"},
		{[]string{"GOMAXPROCS=2"}, "gomaxprocs=2"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			cs, cmd, stderr := stdioSession(t, t.TempDir(), "", tc.env...)
			call[listOut](t, cs, "list_jobs", map[string]any{})
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("the server's log does not say %s:\n%s", tc.want, stderr)
			}
			info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/0", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			var flags int
			for _, line := range strings.Split(string(info), "\n") {
				if v, ok := strings.CutPrefix(line, "flags:"); ok {
					fmt.Sscanf(strings.TrimSpace(v), "%o", &flags)
				}
			}
			if flags&syscall.O_NONBLOCK == 0 {
				t.Errorf("the server's stdin is in blocking mode (flags %o): it is not read through the poller", flags)
			}
		})
	}
}
