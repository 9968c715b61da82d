package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/oauthrs/oauthtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The built server as an OAuth resource server (MCP authorization), with
// a real OpenID provider (zitadel's, run in the test) as its issuer.

// oauthServer starts the provider and `serve --http` configured with it
// (and with the shared token), and returns them with the server's
// resource URL (http://127.0.0.1:PORT/mcp).
func oauthServer(t *testing.T) (*oauthtest.Provider, string, string) {
	t.Helper()
	op := oauthtest.Start(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	resource := "http://" + addr + "/mcp"
	dataDir := t.TempDir()
	startHTTP(t, dataDir, []string{"--http", addr},
		"DELEGATE_HTTP_TOKEN="+httpToken,
		"DELEGATE_OAUTH_ISSUERS="+op.Issuer,
		"DELEGATE_OAUTH_RESOURCE="+resource)
	return op, resource, dataDir
}

// oauthSession is an MCP session over HTTP with a bearer token.
func oauthSession(t *testing.T, url, token string) (*mcp.ClientSession, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-oauth", Version: "1"}, nil)
	cs, err := client.Connect(testContext(t), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// TestOAuthIssuer: through the built server's /mcp, an issuer's valid
// token opens an MCP session whose work is its principal's; each bad one
// gets 401 or 403 with the challenge an MCP client follows; the
// protected-resource metadata names the issuer; the shared token still
// works beside.
func TestOAuthIssuer(t *testing.T) {
	op, resource, dataDir := oauthServer(t)
	base := strings.TrimSuffix(resource, "/mcp")
	other := oauthtest.Start(t)
	for id, c := range map[string]oauthtest.Client{
		"alice":     {Subject: "alice", Audience: []string{resource}},
		"bob":       {Subject: "bob", Audience: []string{resource}},
		"elsewhere": {Audience: []string{"https://other.example/mcp"}},
		"expired":   {Audience: []string{resource}, Lifetime: -time.Minute},
	} {
		op.AddClient(id, "secret-"+id, c)
	}
	other.AddClient("alice", "secret-alice", oauthtest.Client{Subject: "alice", Audience: []string{resource}})
	token := func(p *oauthtest.Provider, id string, scopes ...string) string {
		return p.Token(t, id, "secret-"+id, scopes...)
	}
	metadata := base + "/.well-known/oauth-protected-resource/mcp"

	// The metadata, at both paths, names the issuer.
	for _, path := range []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"} {
		code, _, body := fetch(t, http.DefaultClient, "GET", base+path)
		var doc struct {
			Resource string   `json:"resource"`
			Issuers  []string `json:"authorization_servers"`
			Scopes   []string `json:"scopes_supported"`
		}
		if err := json.Unmarshal([]byte(body), &doc); err != nil || code != 200 || doc.Resource != resource ||
			len(doc.Issuers) != 1 || doc.Issuers[0] != op.Issuer || strings.Join(doc.Scopes, " ") != "delegate:jobs delegate:sandboxes delegate:admin" {
			t.Fatalf("GET %s: %d %s (%v)", path, code, body, err)
		}
	}

	valid := token(op, "alice", "delegate:jobs")
	tampered := strings.Split(valid, ".")
	tampered[2] = strings.Repeat("A", len(tampered[2]))
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`
	for _, tc := range []struct {
		name, token string
		status      int
		challenge   string // what WWW-Authenticate holds, after resource_metadata
	}{
		{"no token", "", 401, `, scope="delegate:jobs delegate:sandboxes"`},
		{"wrong audience", token(op, "elsewhere", "delegate:jobs"), 401, `, error="invalid_token", error_description="the access token is not for this server`},
		{"wrong issuer", token(other, "alice", "delegate:jobs"), 401, `, error="invalid_token", error_description="the access token was issued by '` + other.Issuer + `', which this server does not accept`},
		{"expired", token(op, "expired", "delegate:jobs"), 401, `, error="invalid_token", error_description="the access token expired at`},
		{"bad signature", strings.Join(tampered, "."), 401, `, error="invalid_token", error_description="the access token's signature does not verify`},
		{"no delegate scope", token(op, "alice", "openid", "profile"), 403, `, error="insufficient_scope", error_description="the access token has none of delegate's scopes`},
		{"opaque", "d3f1c0ffee-opaque-token-0123456789", 401, `, error="invalid_token", error_description="the access token is not a JWT: delegate accepts only JWT access tokens (RFC 9068)`},
	} {
		req, err := http.NewRequestWithContext(testContext(t), "POST", resource, strings.NewReader(init))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := `Bearer realm="delegate", resource_metadata="` + metadata + `"` + tc.challenge
		if got := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != tc.status || !strings.HasPrefix(got, want) {
			t.Errorf("%s: %d WWW-Authenticate %s\nwant %d %s…", tc.name, resp.StatusCode, got, tc.status, want)
		}
	}

	// A valid token opens a session; the job it submits is its
	// principal's: another principal of the same issuer does not see it,
	// the operator (the shared token) does.
	alice, err := oauthSession(t, resource, valid)
	if err != nil {
		t.Fatalf("alice's session: %v", err)
	}
	id := submitScript(t, alice, "echo from alice", nil)
	call[statusOut](t, alice, "wait_job", map[string]any{"job_id": id})
	bob, err := oauthSession(t, resource, token(op, "bob", "delegate:jobs"))
	if err != nil {
		t.Fatalf("bob's session: %v", err)
	}
	res, err := bob.CallTool(testContext(t), &mcp.CallToolParams{Name: "get_job_status", Arguments: map[string]any{"job_id": id}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "not found") {
		t.Fatalf("bob reading alice's job: %v %s", err, text(res))
	}
	operator, err := oauthSession(t, resource, httpToken)
	if err != nil {
		t.Fatalf("the shared token's session: %v", err)
	}
	res, err = operator.CallTool(testContext(t), &mcp.CallToolParams{Name: "get_job_status", Arguments: map[string]any{"job_id": id}})
	if err != nil || res.IsError {
		t.Fatalf("the operator reading alice's job: %v %s", err, text(res))
	}
	// The store names the issuer's principal (the CLI reads it).
	out, stderr, code := delegateCLI(t, dataDir, "jobs", "status", id, "--json")
	var job struct {
		Principal string `json:"principal"`
	}
	if err := json.Unmarshal([]byte(out), &job); err != nil || code != 0 || job.Principal != strings.TrimPrefix(op.Issuer, "http://")+":alice" {
		t.Errorf("jobs status --json: exit %d, principal %q, want %s:alice (%v)\n%s%s", code, job.Principal, strings.TrimPrefix(op.Issuer, "http://"), err, out, stderr)
	}
}

// claudeBinary is Claude Code's CLI: e2e/claudecode's (scripts/test
// installs it there), else one on PATH; "" when there is none.
func claudeBinary() string {
	if p, err := filepath.Abs("claudecode/node_modules/.bin/claude"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("claude")
	return p
}

// TestClaudeCodeNeedsAuthentication: Claude Code, given the server's URL
// only (claude mcp add --transport http NAME URL), follows the 401's
// challenge to the metadata and to the issuer's, registers itself there
// (dynamic client registration), and lists the server as needing
// authentication, not as failing to connect. Offline: nothing leaves the
// machine.
func TestClaudeCodeNeedsAuthentication(t *testing.T) {
	claude := claudeBinary()
	if claude == "" {
		if os.Getenv("DELEGATE_REQUIRE_CLAUDE_CODE") != "" {
			t.Fatal("Claude Code is not installed, and DELEGATE_REQUIRE_CLAUDE_CODE is set: run (cd e2e/claudecode && npm ci)")
		}
		t.Skip("Claude Code is not installed: (cd e2e/claudecode && npm ci) installs it, as scripts/test does")
	}
	op, resource, _ := oauthServer(t)
	home := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(testContext(t), claude, args...)
		cmd.Dir = home
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
			"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("claude %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mcp", "add", "--transport", "http", "delegate", resource)
	out := run("mcp", "list")
	if !strings.Contains(out, "delegate: "+resource+" (HTTP) - ! Needs authentication") {
		t.Fatalf("claude mcp list:\n%s\nwant delegate listed as needing authentication", out)
	}
	// It found the issuer through the metadata, read the issuer's, and
	// registered there.
	if n, m := op.Requests("/.well-known/oauth-authorization-server"), op.Requests("/.well-known/openid-configuration"); n+m == 0 || op.Requests("/register") == 0 {
		t.Fatalf("Claude Code asked the issuer for its metadata %d times and registered %d times", n+m, op.Requests("/register"))
	}
}

// TestOAuthTokenExpiresInSession: an MCP session opened with an issuer's
// token stops working when the token expires, and the token cannot open
// another.
func TestOAuthTokenExpiresInSession(t *testing.T) {
	op, resource, _ := oauthServer(t)
	op.AddClient("brief", "secret-brief", oauthtest.Client{Audience: []string{resource}, Lifetime: 2 * time.Second})
	tok := op.Token(t, "brief", "secret-brief", "delegate:jobs")
	cs, err := oauthSession(t, resource, tok)
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	if _, err := cs.ListTools(testContext(t), nil); err != nil {
		t.Fatalf("list tools with the fresh token: %v", err)
	}
	var last error
	testkit.Eventually(t, 30*time.Second, "the session's calls to be refused once its token expired", func() bool {
		_, last = cs.ListTools(testContext(t), nil)
		return last != nil
	})
	if !strings.Contains(last.Error(), "Unauthorized") && !strings.Contains(last.Error(), "401") {
		t.Errorf("the expired token's call: %v, want a 401", last)
	}
	if _, err := oauthSession(t, resource, tok); err == nil {
		t.Fatal("the expired token opened a new session")
	}
}

// TestOAuthBeyondLoopback: with an issuer configured and no shared
// token, the server serves beyond the loopback interface (the issuer's
// access tokens are the authentication): a valid one opens a session and
// submits; without one, /mcp answers 401 with the challenge, and the
// dashboard, its event stream and /metrics are closed (not open as on the
// loopback interface without a token). Before, serve refused to start.
func TestOAuthBeyondLoopback(t *testing.T) {
	op := oauthtest.Start(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	_, _, stderr := startHTTPLogged(t, t.TempDir(), []string{"--http", fmt.Sprintf("0.0.0.0:%d", port)},
		"DELEGATE_OAUTH_ISSUERS="+op.Issuer, "DELEGATE_OAUTH_RESOURCE="+resource)
	base := strings.TrimSuffix(resource, "/mcp")
	op.AddClient("alice", "secret-alice", oauthtest.Client{Subject: "alice", Audience: []string{resource}})
	alice, err := oauthSession(t, resource, op.Token(t, "alice", "secret-alice", "delegate:jobs"))
	if err != nil {
		t.Fatalf("an issuer's token beyond loopback: %v", err)
	}
	id := submitScript(t, alice, "echo beyond loopback", nil)
	if st := call[statusOut](t, alice, "wait_job", map[string]any{"job_id": id}); st.Status != "success" {
		t.Fatalf("alice's job: %+v", st)
	}
	for _, path := range []string{"/mcp", "/", "/jobs/" + id, "/events", "/metrics"} {
		method := "GET"
		if path == "/mcp" {
			method = "POST"
		}
		code, hdr, body := fetch(t, http.DefaultClient, method, base+path, "Accept", "text/html")
		// (The sign-in page of /jobs/ID names the page to go back to.)
		if code != 401 || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), `Bearer realm="delegate"`) || strings.Contains(body, id) && path != "/jobs/"+id {
			t.Errorf("%s %s without a token: %d %q", method, path, code, hdr.Get("WWW-Authenticate"))
		}
	}
	if !strings.Contains(stderr.String(), "clear text") {
		t.Errorf("no warning that tokens travel in clear text over plain HTTP beyond loopback:\n%s", stderr)
	}
}
