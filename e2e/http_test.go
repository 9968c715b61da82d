package e2e

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The HTTP server of `serve --http` through the built binary: the token,
// the metrics, the sessions cap, TLS, and a dashboard beside a stdio
// server on the same data dir.

const httpToken = "e2e-http-token-4f0c2b8a9d1e7f36"

var baseRE = regexp.MustCompile(`url=(https?://\S+)/mcp`)

// startHTTP starts `delegate serve --http ADDR` with more arguments and
// environment, and returns its base URL (scheme://host:port).
func startHTTP(t *testing.T, dataDir string, args []string, env ...string) string {
	t.Helper()
	base, _ := startHTTPCmd(t, dataDir, args, env...)
	return base
}

// startHTTPCmd is startHTTP that also returns the server's command.
func startHTTPCmd(t *testing.T, dataDir string, args []string, env ...string) (string, *exec.Cmd) {
	t.Helper()
	base, cmd, _ := startHTTPLogged(t, dataDir, args, env...)
	return base, cmd
}

// startHTTPLogged is startHTTPCmd that also returns the server's stderr.
func startHTTPLogged(t *testing.T, dataDir string, args []string, env ...string) (string, *exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--http", "127.0.0.1:0"}, args...)...)
	cmd.Env = serverEnv(dataDir, env...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			stderr.Write(append(sc.Bytes(), '\n'))
			if m := baseRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT) // a test may have stopped it
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Error("server did not stop on SIGINT")
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	select {
	case base := <-found:
		return base, cmd, stderr
	case <-time.After(20 * time.Second):
		t.Fatalf("server did not print its URL:\n%s", stderr)
		return "", nil, nil
	}
}

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func fetch(t *testing.T, client *http.Client, method, url string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testContext(t), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestHTTPToken(t *testing.T) {
	base := startHTTP(t, t.TempDir(), nil, "DELEGATE_HTTP_TOKEN="+httpToken)
	anon := http.DefaultClient
	authed := &http.Client{Transport: bearer{httpToken, http.DefaultTransport}}

	// An MCP client without the token does not get in; with it, it does.
	c := mcp.NewClient(&mcp.Implementation{Name: "anon", Version: "1"}, nil)
	if cs, err := c.Connect(testContext(t), &mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1}, nil); err == nil {
		cs.Close()
		t.Fatal("an MCP client without the token connected")
	}
	// A 2025-11-25 client, with a session to count (a 2026-07-28 one has
	// none: each of its requests is whole).
	cs, err := c.Connect(testContext(t), &mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1, HTTPClient: authed},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect with the token: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo over http"}})
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID}); st.Status != "success" {
		t.Fatalf("job: %+v", st)
	}

	for _, path := range []string{"/mcp", "/metrics", "/", "/jobs/" + sub.JobID, "/events"} {
		method := "GET"
		if path == "/mcp" {
			method = "POST"
		}
		code, hdr, body := fetch(t, anon, method, base+path, "Accept", "text/html")
		if code != 401 || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), `Bearer realm="delegate"`) {
			t.Errorf("%s %s without the token: %d %q", method, path, code, hdr.Get("WWW-Authenticate"))
		}
		if strings.Contains(body, sub.JobID) && path != "/jobs/"+sub.JobID {
			t.Errorf("%s without the token shows the job", path)
		}
		if code, _, _ := fetch(t, anon, method, base+path, "Authorization", "Bearer wrong-"+httpToken); code != 401 {
			t.Errorf("%s %s with a wrong token: %d", method, path, code)
		}
	}
	if code, _, body := fetch(t, anon, "GET", base+"/health"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/health is not open: %d", code)
	}
	if code, _, body := fetch(t, authed, "GET", base+"/"); code != 200 || !strings.Contains(body, sub.JobID) {
		t.Errorf("dashboard with the token: %d", code)
	}
	code, _, metrics := fetch(t, authed, "GET", base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics with the token: %d", code)
	}
	for _, want := range []string{
		`delegate_jobs_total{status="success"} 1`,
		`delegate_jobs{status="running"} 0`,
		`delegate_queue_length 0`,
		`delegate_job_duration_seconds_count{backend="local"} 1`,
		`delegate_sandbox_start_seconds_count{backend="local"} 1`,
		`delegate_mcp_sessions 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Beyond the loopback interface, a token is required.
func TestHTTPRefusesAnOpenAddressWithoutAToken(t *testing.T) {
	cmd := exec.CommandContext(testContext(t), binary, "serve", "--http", "0.0.0.0:0")
	cmd.Env = serverEnv(t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), "DELEGATE_HTTP_TOKEN") {
		t.Fatalf("serve --http 0.0.0.0:0 without a token: %v\n%s", err, stderr.String())
	}
	if strings.Count(stderr.String(), "DELEGATE_HTTP_TOKEN (or") != 1 {
		t.Errorf("the error is not printed once:\n%s", stderr.String())
	}
}

// initialize opens an MCP session as a bare client would.
func initialize(t *testing.T, mcpURL string) *http.Response {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`
	req, _ := http.NewRequestWithContext(testContext(t), "POST", mcpURL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestHTTPMaxSessions(t *testing.T) {
	base := startHTTP(t, t.TempDir(), []string{"--max-sessions", "3"})
	var ids []string
	for range 8 {
		resp := initialize(t, base+"/mcp")
		if resp.StatusCode != 200 {
			t.Fatalf("initialize: %s", resp.Status)
		}
		ids = append(ids, resp.Header.Get("Mcp-Session-Id"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, m := fetch(t, http.DefaultClient, "GET", base+"/metrics")
		if strings.Contains(m, "delegate_mcp_sessions 3\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions not capped at 3:\n%s", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The first sessions were closed; the last three answer.
	ping := func(id string) int {
		req, _ := http.NewRequestWithContext(testContext(t), "POST", base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ping(ids[0]); code != 404 {
		t.Errorf("the oldest session answers %d, want 404 (closed)", code)
	}
	for _, id := range ids[5:] {
		if code := ping(id); code != 200 {
			t.Errorf("a recent session answers %d", code)
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "delegate e2e"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile, pool
}

func TestHTTPSAndTheSessionCookie(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	base := startHTTP(t, t.TempDir(), []string{"--tls-cert", certFile, "--tls-key", keyFile}, "DELEGATE_HTTP_TOKEN="+httpToken)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("base URL %s", base)
	}
	client := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if code, _, _ := fetch(t, client, "GET", base+"/health"); code != 200 {
		t.Fatalf("https /health: %d", code)
	}
	form := url.Values{"token": {httpToken}, "next": {"/"}}
	req, _ := http.NewRequestWithContext(testContext(t), "POST", base+"/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != 303 || len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("sign-in over https: %s %+v", resp.Status, cookies)
	}
	req, _ = http.NewRequestWithContext(testContext(t), "GET", base+"/", nil)
	req.AddCookie(cookies[0])
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the dashboard with the session cookie: %s", resp.Status)
	}
}

// A stdio server runs the jobs; a second process, `serve --http` on the
// same data dir, shows them and cancels one.
func TestDashboardBesideAStdioServer(t *testing.T) {
	dataDir := t.TempDir()
	cs, _, _ := stdioSession(t, dataDir, "")
	base := startHTTP(t, dataDir, nil)

	done := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo from the stdio server"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": done.JobID})
	long := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 60", "timeout": 120}})
	waitStatus(t, cs, long.JobID, "running")

	code, _, list := fetch(t, http.DefaultClient, "GET", base+"/", "Accept", "text/html")
	if code != 200 || !strings.Contains(list, done.JobID) || !strings.Contains(list, long.JobID) {
		t.Fatalf("the dashboard does not list the stdio server's jobs: %d\n%s", code, list)
	}
	code, _, page := fetch(t, http.DefaultClient, "GET", base+"/jobs/"+done.JobID, "Accept", "text/html")
	if code != 200 || !strings.Contains(page, "from the stdio server\n") {
		t.Fatalf("the job page lacks the output: %d\n%s", code, page)
	}

	// Cancel from the dashboard; the stdio server, which drives the job,
	// kills it.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if code, hdr, _ := fetch(t, noRedirect, "POST", base+"/jobs/"+long.JobID+"/cancel", "Origin", base); code != 303 ||
		!strings.HasSuffix(hdr.Get("Location"), "notice=cancelled") {
		t.Fatalf("cancel: %d %v", code, hdr)
	}
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": long.JobID, "timeout_seconds": 20})
	if st.Status != "cancelled" {
		t.Fatalf("the stdio server's job after a dashboard cancel: %+v", st)
	}
}

// waitStatus polls get_job_status until the job is in status.
func waitStatus(t *testing.T, cs *mcp.ClientSession, id, status string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := call[statusOut](t, cs, "get_job_status", map[string]any{"job_id": id})
		if st.Status == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s is %s, want %s", id, st.Status, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
