//go:build linux

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testnet"
)

// injected is the operator's secret the proxy adds for inject.test.
const injected = "e2e-s3cr3t-only-the-proxy-holds"

// TestEgressThroughTheBinary: the built delegate, serving over stdio, runs
// a job whose allowlist names hosts of the test internet: curl over HTTP
// and HTTPS, pip and git reach them through the proxy variables; a
// secret bound to inject.test reaches that site while the job holds a
// placeholder; the callback server is reached through the sandbox's own
// listener; a denied name is refused until `delegate jobs allow` (another
// process) widens the list, after which the job's retry goes through;
// `delegate jobs network` and get_job_result tell every attempt.
func TestEgressThroughTheBinary(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	allowed := w.Sites["allowed"]
	allowed.PackageIndex(t)
	allowed.GitRepo(t, "cloned through delegate's proxy\n")
	port := freePort(t)
	dataDir := t.TempDir()
	cs, _, stderr := stdioSession(t, dataDir, "", fmt.Sprintf("CALLBACK_PORT=%d", port),
		"DELEGATE_SECRET_INJ="+injected, "DELEGATE_SECRET_INJ_INJECT=inject.test X-Api-Key Key {}")
	script := `
set -u
curl -sS --max-time 10 http://allowed.test/
curl -sS --max-time 10 --cacert /workspace/roots.pem https://allowed.test/
# The index's CA is the test's own, not in the sandbox's bundle: pip is
# told it alone (requests lets REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE win
# over --cert).
env -u PIP_CERT -u REQUESTS_CA_BUNDLE -u CURL_CA_BUNDLE pip3 download -q --no-deps --no-cache-dir --disable-pip-version-check --index-url https://pypi.sub.test/simple/ \
	--cert /workspace/roots.pem -d /workspace/dl tinypkg && ls /workspace/dl
GIT_SSL_CAINFO=/workspace/roots.pem git clone -q https://git.sub.test/git/repo.git /workspace/clone && cat /workspace/clone/README
curl -sS --max-time 10 https://inject.test/
echo "holds=$INJ"
curl -sS --max-time 10 -o /dev/null -w 'callback=%{http_code}\n' -X POST -H "Authorization: Bearer $DELEGATE_JOB_TOKEN" \
	-d '{"progress":"called back through the proxy"}' "$DELEGATE_CALLBACK_URL/status"
i=0
until curl -sf --max-time 5 http://denied.test/ >/dev/null; do i=$((i+1)); [ $i -lt 400 ] || exit 7; sleep 0.1; done
echo widened-ok
`
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": script, "statusMode": "detailed", "secrets": []string{"INJ"},
		"network": map[string]any{"allow": []string{"allowed.test", "*.sub.test", "inject.test"}},
		"files":   []map[string]any{{"path": "roots.pem", "content": base64.StdEncoding.EncodeToString(w.RootsBytes)}},
	}})
	// Another process widens the list once the denial is in the log.
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _, code := delegateCLI(t, dataDir, "jobs", "network", sub.JobID, "--denied", "--json")
		if code == 0 && strings.Contains(out, `"denied.test"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no denial of denied.test logged: %s\nserver:\n%s", out, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, errOut, code := delegateCLI(t, dataDir, "jobs", "allow", sub.JobID, "denied.test"); code != 0 || !strings.Contains(out, "denied.test") {
		t.Fatalf("jobs allow: %d %s %s", code, out, errOut)
	}
	waitFor(t, cs, sub.JobID, "success")
	res := call[struct {
		Status  string `json:"status"`
		Output  string `json:"output"`
		Stderr  string `json:"stderr"`
		Network struct {
			Summary struct {
				Allowed, Denied int
				DeniedNames     []string `json:"denied_names"`
			} `json:"summary"`
		} `json:"network"`
	}](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	for _, want := range []string{"hello from allowed", testnet.WheelFile, "cloned through delegate's proxy", "hello from inject",
		"holds=delegate-injected", "callback=200", "widened-ok"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("the job's output lacks %q:\n%s\nstderr:\n%s", want, res.Output, res.Stderr)
		}
	}
	if strings.Contains(res.Output+res.Stderr, injected) {
		t.Error("the secret is in the job's output")
	}
	if n := res.Network.Summary; n.Allowed < 6 || n.Denied < 1 || !slices.Contains(n.DeniedNames, "denied.test:80") {
		t.Errorf("the result's network: %+v", n)
	}
	var keys []string
	for _, r := range w.Sites["inject"].Requests() {
		keys = append(keys, r.Header.Get("X-Api-Key"))
	}
	if !slices.Equal(keys, []string{"Key " + injected}) {
		t.Errorf("inject.test saw %q", keys)
	}
	st := call[struct {
		Timeline []struct{ Message string } `json:"timeline"`
	}](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID})
	var msgs []string
	for _, e := range st.Timeline {
		msgs = append(msgs, e.Message)
	}
	for _, want := range []string{"called back through the proxy", "network: denied denied.test:80", "network: allowlist widened by cli: denied.test"} {
		if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, want) }) {
			t.Errorf("the timeline lacks %q: %q", want, msgs)
		}
	}
	// The log, as the CLI prints it: each kind of attempt, and the change.
	out, _, code := delegateCLI(t, dataDir, "jobs", "network", sub.JobID, "--limit", "5000")
	if code != 0 {
		t.Fatalf("jobs network: %d", code)
	}
	for _, want := range []string{"allowlist allowed.test, *.sub.test, inject.test, denied.test", "injected secrets: INJ",
		"connect", "pypi.sub.test", "git.sub.test", "inject.test", "(+X-Api-Key)", "callback", "policy", "not in allowlist"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs network lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, injected) {
		t.Error("the secret is in the network log")
	}
	var rep struct {
		Ended bool `json:"ended"`
	}
	js, _, _ := delegateCLI(t, dataDir, "jobs", "network", sub.JobID, "--json", "--limit", "1")
	if err := json.Unmarshal([]byte(js), &rep); err != nil || !rep.Ended {
		t.Errorf("the network after the job: %s (%v)", js, err)
	}
	if strings.Contains(stderr.String(), injected) {
		t.Error("the secret is in the server's log")
	}
}

// TestEgressAskThroughTasks: a job whose allowlist says ask: true tries a
// name it does not hold; the held request is a question on the job, which
// a Tasks client (@modelcontextprotocol/ext-tasks' onInputRequest, over
// stdio) answers yes through tasks/update: the allowlist is widened and
// the held request goes through.
func TestEgressAskThroughTasks(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	requireTasksClient(t)
	testnet.World(t)
	dataDir := t.TempDir()
	m, _ := json.Marshal(map[string]any{"agentType": "script", "timeout": 120,
		"task":    `if curl -sf --max-time 40 http://denied.test/ >/dev/null; then echo reached; else echo refused; fi`,
		"network": map[string]any{"allow": []string{"allowed.test"}, "ask": true}})
	r := questionClient(t, "stdio", binary, dataDir, "ask", string(m))
	if r.Outcome != "completed" || r.Result.Status != "success" || !strings.Contains(r.Result.Output, "reached") {
		t.Fatalf("%+v", r)
	}
	if len(r.Asked) != 1 || !strings.Contains(r.Asked[0].Message, "denied.test:80") || !strings.HasPrefix(r.Asked[0].InputID, "egress:") ||
		!strings.Contains(string(r.Asked[0].RequestedSchema), `"allow"`) {
		t.Fatalf("asked %+v", r.Asked)
	}
	out, _, _ := delegateCLI(t, dataDir, "jobs", "network", r.TaskID)
	if !strings.Contains(out, "allowlist widened: denied.test:80") || !strings.Contains(out, "after asking") {
		t.Errorf("the log:\n%s", out)
	}
}
