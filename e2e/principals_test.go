package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Principals over HTTP, through the built binary: tokens of delegate's
// own made with the CLI, two principals and the operator driving the
// server with the official TypeScript client (tsclient/principals.mjs),
// and the audit trail read back with the CLI.

// step is one operation of principals.mjs; stepOut what it answered.
type step map[string]any

type stepOut struct {
	Result json.RawMessage `json:"result"`
	Error  *string         `json:"error"`
}

func tool(name string, args map[string]any) step {
	return step{"op": "tool", "name": name, "args": args}
}

// cliOut runs the binary's CLI on dataDir and returns its stdout.
func cliOut(t *testing.T, dataDir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), binary, args...)
	cmd.Env = serverEnv(dataDir)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("delegate %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// newToken makes a token for name with the CLI: its secret, and its id.
func newToken(t *testing.T, dataDir, name, scopes string) (string, string) {
	t.Helper()
	var tok struct {
		Secret string `json:"token"`
		ID     string `json:"token_id"`
	}
	if err := json.Unmarshal([]byte(cliOut(t, dataDir, "tokens", "create", name, "--scopes", scopes, "--json")), &tok); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.Secret, "dlg_") || !strings.HasPrefix(tok.ID, "tok-") {
		t.Fatalf("token %+v", tok)
	}
	return tok.Secret, tok.ID
}

// as runs steps as the principal of token, with the TypeScript client.
func as(t *testing.T, mcpURL, token string, steps ...step) []stepOut {
	t.Helper()
	plan, _ := json.Marshal(steps)
	cmd := exec.CommandContext(testContext(t), "node", "principals.mjs", mcpURL, token, string(plan))
	cmd.Dir = "tsclient"
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node principals.mjs: %v\n%s", err, stderr)
	}
	var res []stepOut
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(steps) {
		t.Fatalf("principals.mjs printed %q: %v", out, err)
	}
	return res
}

func (o stepOut) ok(t *testing.T, what string) json.RawMessage {
	t.Helper()
	if o.Error != nil {
		t.Fatalf("%s: %s", what, *o.Error)
	}
	return o.Result
}

func field(t *testing.T, raw json.RawMessage, name string) string {
	t.Helper()
	var m map[string]any
	json.Unmarshal(raw, &m)
	s, _ := m[name].(string)
	if s == "" {
		t.Fatalf("no %s in %s", name, raw)
	}
	return s
}

// TestPrincipalsOverHTTP: bob cannot see, read, answer, cancel, release,
// widen, command or follow (as a task) alice's work: every attempt
// answers exactly as the same attempt on an id that names nothing. The
// operator (DELEGATE_HTTP_TOKEN) sees both and acts for alice; the audit
// trail lists each action with its principal.
func TestPrincipalsOverHTTP(t *testing.T) {
	requireTasksClient(t)
	dataDir := t.TempDir()
	mcpURL := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken) + "/mcp"
	alice, _ := newToken(t, dataDir, "alice", "jobs,sandboxes")
	bob, _ := newToken(t, dataDir, "bob", "jobs,sandboxes")

	a := as(t, mcpURL, alice,
		tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": askScript, "timeout": 300}}),
		tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}}),
		tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo kept", "lifecycle": "persistent"}}),
		tool("open_sandbox", map[string]any{}),
	)
	ask, sleeper, kept := field(t, a[0].ok(t, "submit"), "job_id"), field(t, a[1].ok(t, "submit"), "job_id"), field(t, a[2].ok(t, "submit"), "job_id")
	sbx := field(t, a[3].ok(t, "open_sandbox"), "sandbox_id")
	a = as(t, mcpURL, alice,
		tool("wait_job", map[string]any{"job_id": ask, "timeout_seconds": 30}),
		tool("wait_job", map[string]any{"job_id": kept, "timeout_seconds": 30}),
		step{"op": "tasks/get", "params": map[string]any{"taskId": ask}},
	)
	if w := string(a[0].ok(t, "wait_job")); !strings.Contains(w, `"color"`) {
		t.Fatalf("alice's job asks no question: %s", w)
	}
	if w := string(a[1].ok(t, "wait_job")); !strings.Contains(w, `"success"`) {
		t.Fatalf("alice's persistent job: %s", w)
	}
	if g := string(a[2].ok(t, "tasks/get of her own job")); !strings.Contains(g, "input_required") {
		t.Fatalf("alice follows her job as a task: %s", g)
	}

	// What bob tries on a job J (asking), a persistent job K and a kept
	// sandbox S.
	answers := map[string]any{"color": map[string]any{"action": "accept", "content": map[string]any{"color": "red"}}}
	attempts := func(j, k, s string) []step {
		return []step{
			tool("get_job_status", map[string]any{"job_id": j}),
			tool("get_job_result", map[string]any{"job_id": j}),
			tool("get_job_logs", map[string]any{"job_id": j}),
			tool("wait_job", map[string]any{"job_id": j, "timeout_seconds": 1}),
			tool("wait_job", map[string]any{"job_id": j, "timeout_seconds": 1, "allow": []string{"example.com"}}),
			tool("cancel_job", map[string]any{"job_id": j}),
			tool("answer_job", map[string]any{"job_id": j, "answers": answers}),
			tool("release_job", map[string]any{"job_id": k}),
			tool("release_job", map[string]any{"sandbox_id": s}),
			tool("sandbox_files", map[string]any{"sandbox_id": s, "op": "list", "path": "."}),
			tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "id", "sandbox": s}}),
			{"op": "read", "uri": "job://" + j},
			{"op": "read", "uri": "job://" + j + "/log"},
			{"op": "read", "uri": "job://" + j + "/network"},
			{"op": "read", "uri": "sandbox://" + s},
			{"op": "subscribe", "uri": "job://" + j},
			{"op": "tasks/get", "params": map[string]any{"taskId": j}},
			{"op": "tasks/cancel", "params": map[string]any{"taskId": j}},
			{"op": "tasks/update", "params": map[string]any{"taskId": j, "inputResponses": answers}},
		}
	}
	other := func(id string) string { return id[:len(id)-4] + "zzzz" }
	onAlice := as(t, mcpURL, bob, attempts(ask, kept, sbx)...)
	onNothing := as(t, mcpURL, bob, attempts(other(ask), other(kept), other(sbx))...)
	plan := attempts("J", "K", "S")
	for i := range plan {
		if onAlice[i].Error == nil {
			t.Errorf("bob's %v on alice's work succeeded: %s", plan[i], onAlice[i].Result)
			continue
		}
		got := strings.NewReplacer(ask, "J", kept, "K", sbx, "S").Replace(*onAlice[i].Error)
		want := strings.NewReplacer(other(ask), "J", other(kept), "K", other(sbx), "S").Replace(*onNothing[i].Error)
		if got != want {
			t.Errorf("bob's %v: on alice's work %q, on nothing %q: the answers differ", plan[i], got, want)
		}
		if !strings.Contains(strings.ToLower(got), "not found") {
			t.Errorf("bob's %v: %q does not read as not found", plan[i], got)
		}
	}
	b := as(t, mcpURL, bob,
		tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo bob"}}),
		tool("list_jobs", map[string]any{}),
		tool("list_sandboxes", map[string]any{}),
	)
	bobJob := field(t, b[0].ok(t, "bob's submit"), "job_id")
	for _, o := range b[1:] {
		list := string(o.ok(t, "bob's lists"))
		if strings.Contains(list, ask) || strings.Contains(list, sleeper) || strings.Contains(list, kept) || strings.Contains(list, sbx) {
			t.Errorf("bob lists alice's work: %s", list)
		}
	}
	if !strings.Contains(string(b[1].Result), bobJob) {
		t.Errorf("bob's list lacks his own job: %s", b[1].Result)
	}
	if strings.Contains(string(b[1].Result), `"principal"`) {
		t.Errorf("bob's list names principals, which only the operator's does: %s", b[1].Result)
	}

	// Alice's work is as it was; the operator sees both, answers alice's
	// question and cancels her sleeping job.
	a = as(t, mcpURL, alice, tool("get_job_status", map[string]any{"job_id": sleeper}), tool("list_sandboxes", map[string]any{}))
	if s := string(a[0].ok(t, "status")); !strings.Contains(s, `"running"`) && !strings.Contains(s, `"pending"`) && !strings.Contains(s, `"provisioning"`) {
		t.Errorf("alice's job after bob's attempts: %s", s)
	}
	if !strings.Contains(string(a[1].ok(t, "list_sandboxes")), sbx) {
		t.Errorf("alice's sandbox is gone: %s", a[1].Result)
	}
	op := as(t, mcpURL, httpToken,
		tool("list_jobs", map[string]any{}),
		tool("list_sandboxes", map[string]any{}),
		tool("answer_job", map[string]any{"job_id": ask, "answers": answers}),
		tool("cancel_job", map[string]any{"job_id": sleeper}),
	)
	for _, id := range []string{ask, sleeper, kept, bobJob} {
		if !strings.Contains(string(op[0].ok(t, "the operator's list")), id) {
			t.Errorf("the operator's list lacks %s: %s", id, op[0].Result)
		}
	}
	// The operator's lists name whose each item is.
	var opJobs struct {
		Jobs []struct {
			JobID     string `json:"job_id"`
			Principal string `json:"principal"`
		} `json:"jobs"`
	}
	var opSandboxes struct {
		Sandboxes []struct {
			SandboxID string `json:"sandbox_id"`
			Principal string `json:"principal"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal(op[0].Result, &opJobs); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(op[1].ok(t, "the operator's sandboxes"), &opSandboxes); err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	for _, j := range opJobs.Jobs {
		owners[j.JobID] = j.Principal
	}
	for _, sb := range opSandboxes.Sandboxes {
		owners[sb.SandboxID] = sb.Principal
	}
	for id, want := range map[string]string{ask: "alice", sleeper: "alice", kept: "alice", sbx: "alice", bobJob: "bob"} {
		if owners[id] != want {
			t.Errorf("the operator's lists name %s's principal %q, want %q", id, owners[id], want)
		}
	}
	op[2].ok(t, "the operator answers alice's question")
	op[3].ok(t, "the operator cancels alice's job")
	a = as(t, mcpURL, alice,
		tool("wait_job", map[string]any{"job_id": ask, "timeout_seconds": 30}),
		tool("release_job", map[string]any{"job_id": kept}),
		tool("release_job", map[string]any{"sandbox_id": sbx}),
	)
	if w := string(a[0].ok(t, "wait_job")); !strings.Contains(w, `"success"`) {
		t.Errorf("alice's job after the operator's answer: %s", w)
	}
	a[1].ok(t, "release")
	a[2].ok(t, "release")

	var trail struct {
		Entries []struct {
			Principal, Action, Target string
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(cliOut(t, dataDir, "audit", "--json")), &trail); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range trail.Entries {
		got = append(got, e.Principal+" "+e.Action+" "+e.Target)
		if e.Principal == "bob" && e.Target != bobJob {
			t.Errorf("bob did something to %s: %+v", e.Target, e)
		}
	}
	for _, want := range []string{"local token_created", "alice submitted " + ask, "alice submitted " + sleeper, "alice submitted " + kept,
		"alice opened " + sbx, "bob submitted " + bobJob, "local answered " + ask, "local cancelled " + sleeper,
		"alice released " + kept, "alice released " + sbx} {
		found := false
		for _, g := range got {
			found = found || strings.HasPrefix(g, want)
		}
		if !found {
			t.Errorf("the audit trail lacks %q:\n%s", want, strings.Join(got, "\n"))
		}
	}
	// A principal reads its own part of the trail only; --principal
	// selects one.
	if only := cliOut(t, dataDir, "audit", "--principal", "bob"); strings.Contains(only, "alice") || !strings.Contains(only, bobJob) {
		t.Errorf("audit --principal bob:\n%s", only)
	}
}

// TestRevokedTokenStops: a token revoked with the CLI (another process
// on the store) stops working within about a second: a request in flight
// on an open session ends, the session's next request fails, and a new
// request is refused with 401 naming the revocation. The operator's
// shared token works on unchanged.
func TestRevokedTokenStops(t *testing.T) {
	dataDir := t.TempDir()
	mcpURL := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken) + "/mcp"
	secret, id := newToken(t, dataDir, "carol", "jobs")
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-revoke", Version: "1"}, nil)
	cs, err := client.Connect(testContext(t), &mcp.StreamableClientTransport{Endpoint: mcpURL, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{secret, http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}})
	ended := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "wait_job", Arguments: map[string]any{"job_id": job.JobID, "timeout_seconds": 50}})
		ended <- err
	}()
	cliOut(t, dataDir, "tokens", "revoke", id)
	revoked := time.Now()
	if list := cliOut(t, dataDir, "tokens", "list"); !strings.Contains(list, id) || !strings.Contains(list, "carol") || !strings.Contains(list, "revoked") ||
		strings.Contains(list, secret) {
		t.Errorf("tokens list after the revocation:\n%s", list)
	}
	select {
	case err := <-ended:
		t.Logf("the open wait_job ended %v after the revocation: %v", time.Since(revoked).Round(time.Millisecond), err)
		if err == nil {
			t.Error("the open wait_job ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the open wait_job goes on 10 s after its token was revoked")
	}
	if _, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "list_jobs", Arguments: map[string]any{}}); err == nil {
		t.Error("the revoked token's session still answers")
	}
	code, _, body := fetch(t, http.DefaultClient, "POST", mcpURL, "Authorization", "Bearer "+secret, "Content-Type", "application/json")
	if code != http.StatusUnauthorized || !strings.Contains(body, "revoked") {
		t.Errorf("a new request with the revoked token: %d %q", code, body)
	}
	op := as(t, mcpURL, httpToken, tool("cancel_job", map[string]any{"job_id": job.JobID}))
	op[0].ok(t, "the operator cancels carol's job")
}

// TestQuotaOverHTTP: the job over a principal's quota is refused at once,
// naming the quota, the use and the setting; another principal is not
// held by it. A token without the sandboxes scope keeps no sandbox.
func TestQuotaOverHTTP(t *testing.T) {
	dataDir := t.TempDir()
	mcpURL := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken, "DELEGATE_QUOTA_JOBS=1") + "/mcp"
	dave, _ := newToken(t, dataDir, "dave", "jobs")
	erin, _ := newToken(t, dataDir, "erin", "jobs")
	long := tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}})
	d := as(t, mcpURL, dave, long, long)
	job := field(t, d[0].ok(t, "dave's first job"), "job_id")
	if d[1].Error == nil || !strings.Contains(*d[1].Error, "DELEGATE_QUOTA_JOBS") || !strings.Contains(*d[1].Error, "jobs not ended: 1 now") {
		t.Errorf("dave's second job: %+v, want the quota named", d[1])
	}
	// dave's token has the jobs scope only: no kept sandboxes.
	d = as(t, mcpURL, dave, tool("open_sandbox", map[string]any{}),
		tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "true", "lifecycle": "persistent"}}))
	for i, o := range d {
		if o.Error == nil || !strings.Contains(*o.Error, "needs the sandboxes scope, which dave's token does not have") {
			t.Errorf("dave without the sandboxes scope, %d: %+v", i, o)
		}
	}
	e := as(t, mcpURL, erin, long)
	other := field(t, e[0].ok(t, "erin's job beside dave's"), "job_id")
	as(t, mcpURL, httpToken, tool("cancel_job", map[string]any{"job_id": job}), tool("cancel_job", map[string]any{"job_id": other}))
}

// signIn signs a browser in to the dashboard at base with token: a
// client with its session cookie.
func signIn(t *testing.T, base, token string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(base+"/login", url.Values{"token": {token}, "next": {"/"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/" {
		t.Fatalf("sign-in: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	return c
}

// TestDashboardPrincipals: a person signs in to the dashboard with a
// token of theirs and sees their own work only (another's job is "No
// such job."); the operator sees everyone's, the principal named, and
// the audit trail; a revoked token's session ends at its next page.
func TestDashboardPrincipals(t *testing.T) {
	dataDir := t.TempDir()
	base := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken)
	alice, aliceID := newToken(t, dataDir, "alice", "jobs,sandboxes")
	bob, _ := newToken(t, dataDir, "bob", "jobs")
	job := func(token string) string {
		return field(t, as(t, base+"/mcp", token, tool("submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo hi"}}))[0].ok(t, "submit"), "job_id")
	}
	aliceJob, bobJob := job(alice), job(bob)
	sbx := field(t, as(t, base+"/mcp", alice, tool("open_sandbox", map[string]any{}))[0].ok(t, "open_sandbox"), "sandbox_id")

	a := signIn(t, base, alice)
	_, _, list := fetch(t, a, "GET", base+"/", "Accept", "text/html")
	if !strings.Contains(list, aliceJob) || strings.Contains(list, bobJob) || !strings.Contains(list, `class="who"`) {
		t.Errorf("alice's list: has hers %v, has bob's %v", strings.Contains(list, aliceJob), strings.Contains(list, bobJob))
	}
	if code, _, page := fetch(t, a, "GET", base+"/jobs/"+bobJob, "Accept", "text/html"); code != http.StatusNotFound || !strings.Contains(page, "No such job.") {
		t.Errorf("alice opens bob's job: %d", code)
	}
	op := signIn(t, base, httpToken)
	_, _, all := fetch(t, op, "GET", base+"/", "Accept", "text/html")
	for _, want := range []string{aliceJob, bobJob, ">alice</span>", ">bob</span>"} {
		if !strings.Contains(all, want) {
			t.Errorf("the operator's list lacks %q", want)
		}
	}
	if _, _, sbs := fetch(t, op, "GET", base+"/sandboxes", "Accept", "text/html"); !strings.Contains(sbs, sbx) || !strings.Contains(sbs, ">alice</span>") {
		t.Errorf("the operator's sandboxes page does not name alice's sandbox")
	}
	if _, _, sbs := fetch(t, signIn(t, base, bob), "GET", base+"/sandboxes", "Accept", "text/html"); strings.Contains(sbs, sbx) {
		t.Errorf("bob's sandboxes page shows alice's sandbox")
	}
	if code, _, trail := fetch(t, op, "GET", base+"/audit", "Accept", "text/html"); code != http.StatusOK || !strings.Contains(trail, aliceJob) || !strings.Contains(trail, bobJob) {
		t.Errorf("the operator's audit page: %d", code)
	}
	if _, _, trail := fetch(t, a, "GET", base+"/audit", "Accept", "text/html"); !strings.Contains(trail, aliceJob) || strings.Contains(trail, bobJob) {
		t.Errorf("alice's audit page shows what is not hers, or lacks her job")
	}
	as(t, base+"/mcp", httpToken, tool("release_job", map[string]any{"sandbox_id": sbx}))
	cliOut(t, dataDir, "tokens", "revoke", aliceID)
	if code, _, page := fetch(t, a, "GET", base+"/", "Accept", "text/html"); code != http.StatusUnauthorized || strings.Contains(page, aliceJob) {
		t.Errorf("alice's session after her token was revoked: %d", code)
	}
}
