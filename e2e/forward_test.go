package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestForwardKeptSandboxCommand (issue 37): servers of two hosts (as far
// as they know: each its own DELEGATE_HOST_ID) share one PostgreSQL
// store, each `delegate serve --http` with the local backend. A command
// for a kept sandbox that server A holds, asked of server B, is forwarded
// to A, which runs it as the principal who asked (a token of delegate's
// own), saying so in the audit trail; B's client follows it on B: its
// output while it runs, its end, and a cancel_job on B that stops it on A. A holder that
// does not answer (its advertised address reaches nothing) is refused
// with today's error, naming it and saying so.
func TestForwardKeptSandboxCommand(t *testing.T) {
	url := pgtest.Own(t, pgtest.Options{}).NewDatabase(t)
	env := func(host string, more ...string) []string {
		return append([]string{"DELEGATE_STORE=" + url, "DELEGATE_LEASE_TTL=3s", "DELEGATE_HOST_ID=host-" + host, "DELEGATE_HTTP_TOKEN=" + httpToken}, more...)
	}
	baseA := startHTTP(t, t.TempDir(), nil, env("a")...)
	baseB := startHTTP(t, t.TempDir(), nil, env("b")...)
	// alice, a token of delegate's own (in the store): the principal B
	// forwards, and A submits as.
	out, errOut, code := delegateCLIEnv(t, t.TempDir(), env("a"), "tokens", "create", "alice", "--scopes", "jobs,sandboxes", "--json")
	var alice struct {
		Secret string `json:"token"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &alice) != nil || alice.Secret == "" {
		t.Fatalf("delegate tokens create: %d %s %s", code, out, errOut)
	}
	csA, csB := sessionAs(t, baseA, alice.Secret), sessionAs(t, baseB, alice.Secret)

	sbx := call[sandboxOut](t, csA, "open_sandbox", map[string]any{"idle_timeout": 600}).SandboxID
	defer call[sandboxOut](t, csA, "release_job", map[string]any{"sandbox_id": sbx})

	// Run on A, asked of B: it sees what a command on A left.
	if res := inSandbox(t, csA, sbx, "echo from-a > f"); res.Status != "success" {
		t.Fatalf("a command on A: %+v", res)
	}
	res := inSandbox(t, csB, sbx, "cat f; hostname; echo err >&2; exit 3")
	if res.Status != "failed" || !strings.HasPrefix(res.Output, "from-a\n") || res.Stderr != "err\n" || res.ExitCode == nil || *res.ExitCode != 3 {
		t.Fatalf("a command forwarded from B to A: %+v", res)
	}

	// A stored it as alice's, and says it was forwarded.
	out, errOut, code = delegateCLIEnv(t, t.TempDir(), env("a"), "audit", "--json")
	var trail struct {
		Entries []struct {
			Principal, Action, Target, Detail string
		} `json:"entries"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &trail) != nil {
		t.Fatalf("delegate audit: %d %s %s", code, out, errOut)
	}
	found := false
	for _, e := range trail.Entries {
		found = found || e.Target == res.JobID && e.Principal == "alice" && e.Action == "submitted" && strings.Contains(e.Detail, "forwarded by server")
	}
	if !found {
		t.Errorf("no entry of alice's forwarded submit %s in the audit trail: %+v", res.JobID, trail.Entries)
	}

	// Its output reaches B's client while it runs on A; B's cancel_job
	// stops it there: the sandbox is idle again long before the sleep's end.
	sub := call[submitOut](t, csB, "submit_job", map[string]any{"manifest": map[string]any{
		"sandbox": sbx, "task": "echo started; sleep 120; echo never", "timeout": 300, "statusMode": "streaming"}})
	testkit.Eventually(t, 30*time.Second, "the forwarded command's first output on B", func() bool {
		l := call[logsOut](t, csB, "get_job_logs", map[string]any{"job_id": sub.JobID})
		return l.Status == "running" && l.Output == "started\n"
	})
	call[statusOut](t, csB, "cancel_job", map[string]any{"job_id": sub.JobID})
	if st := call[statusOut](t, csB, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 30}); st.Status != "cancelled" {
		t.Fatalf("cancelled on B: %+v", st)
	}
	testkit.Eventually(t, 30*time.Second, "the sandbox idle again on A (its command killed)", func() bool {
		l := call[struct {
			Sandboxes []sandboxOut `json:"sandboxes"`
		}](t, csB, "list_sandboxes", map[string]any{"sandbox_id": sbx})
		return len(l.Sandboxes) == 1 && l.Sandboxes[0].Running == 0 && l.Sandboxes[0].State == "idle"
	})
	if res := inSandbox(t, csB, sbx, "echo again"); res.Status != "success" || res.Output != "again\n" {
		t.Fatalf("a command after the cancel: %+v", res)
	}

	// A file call is not forwarded: refused on B, naming A, and the
	// sandbox goes on (B must not take it for gone, its machine being on
	// another host).
	msg := callErr(t, csB, "sandbox_files", map[string]any{"sandbox_id": sbx, "op": "read", "path": "f"})
	if !strings.Contains(msg, "held by server") || !strings.Contains(msg, baseA) {
		t.Errorf("a file call on B: %s", msg)
	}
	if f := call[filesOut](t, csA, "sandbox_files", map[string]any{"sandbox_id": sbx, "op": "read", "path": "f"}); f.Text == nil || *f.Text != "from-a\n" {
		t.Errorf("the file on A after a file call on B: %+v", f)
	}

	// A holder whose address answers nothing: refused, naming it.
	baseC := startHTTP(t, t.TempDir(), nil, env("c", "DELEGATE_ADVERTISE_URL=http://127.0.0.1:1")...)
	csC := sessionAs(t, baseC, alice.Secret)
	sbxC := call[sandboxOut](t, csC, "open_sandbox", map[string]any{"idle_timeout": 600}).SandboxID
	defer call[sandboxOut](t, csC, "release_job", map[string]any{"sandbox_id": sbxC})
	msg = callErr(t, csB, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": sbxC, "task": "true"}})
	if !strings.Contains(msg, "manifest.sandbox") || !strings.Contains(msg, "held by server") ||
		!strings.Contains(msg, "(http://127.0.0.1:1)") || !strings.Contains(msg, "did not answer") {
		t.Errorf("a command for a sandbox whose holder does not answer: %s", msg)
	}
}

// sessionAs is an MCP session to the server at base as the principal of
// token.
func sessionAs(t *testing.T, base, token string) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-forward", Version: "1"}, nil).Connect(testContext(t),
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}
