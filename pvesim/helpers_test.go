package pvesim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

const (
	testTokenID     = "root@pam!delegate"
	testTokenSecret = "5f0c7e3a-1d2b-4c5d-9e8f-0a1b2c3d4e5f"
	tplID           = 9000
)

// sim is a running simulator with an admin token and a template (9000 on
// pve1), and a client for it.
type sim struct {
	*Server
	c *pve.Client
}

func newSim(t *testing.T, opts Options) *sim {
	t.Helper()
	if opts.AuthFailureDelay == 0 {
		opts.AuthFailureDelay = -1
	}
	if opts.TaskDelay == 0 {
		opts.TaskDelay = 20 * time.Millisecond
	}
	if opts.BootDelay == 0 {
		opts.BootDelay = 100 * time.Millisecond
	}
	opts.SandboxDir = t.TempDir()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.AddToken(Token{ID: testTokenID, Secret: testTokenSecret, Privileges: RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTemplate(s.nodes[0].name, tplID, "debian-tpl", TemplateSpec{Tags: "delegate;template"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &sim{Server: s, c: newClient(t, s, "root@pam", "delegate", testTokenSecret)}
}

func newClient(t *testing.T, s *Server, user, token, secret string, tune ...func(*pve.Config)) *pve.Client {
	t.Helper()
	u, _ := url.Parse(s.URL())
	port, _ := strconv.Atoi(u.Port())
	cfg := pve.Config{
		Host: u.Hostname(), Port: port, User: user, TokenName: token, TokenValue: secret,
		SSLMode: pve.SSLVerify, Fingerprint: s.Fingerprint(),
		TaskPollInterval: 10 * time.Millisecond, RetryDelay: 10 * time.Millisecond, RateLimit: -1,
	}
	for _, f := range tune {
		f(&cfg)
	}
	c, err := pve.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawResponse is an answer read by hand: status, reason phrase, body.
type rawResponse struct {
	Status int
	Reason string
	Body   map[string]any
	Raw    string
}

// raw sends a request by hand (body as given, content type ct) and reads
// the status line itself.
func (s *sim) raw(t *testing.T, method, path, auth, ct, body string) rawResponse {
	t.Helper()
	u, _ := url.Parse(s.URL())
	conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	req, _ := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if body == "" {
		req.Body = nil
		req.ContentLength = 0
	}
	if auth == "" {
		auth = "PVEAPIToken=" + testTokenID + "=" + testTokenSecret
	}
	if auth != "-" {
		req.Header.Set("Authorization", auth)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Connection", "close")
	// The server may answer (and stop reading) before the body is sent.
	go req.Write(conn)
	data, err := io.ReadAll(conn)
	if err != nil && !isClosed(err) {
		t.Fatal(err)
	}
	head, payload, _ := strings.Cut(string(data), "\r\n\r\n")
	status := strings.SplitN(strings.SplitN(head, "\r\n", 2)[0], " ", 3)
	code, _ := strconv.Atoi(status[1])
	r := rawResponse{Status: code, Raw: string(data)}
	if len(status) > 2 {
		r.Reason = status[2]
	}
	if strings.Contains(head, "Transfer-Encoding: chunked") {
		t.Fatalf("unexpected chunked answer: %s", data)
	}
	if payload != "" {
		if err := json.Unmarshal([]byte(payload), &r.Body); err != nil {
			t.Fatalf("body %q: %v", payload, err)
		}
	}
	return r
}

func isClosed(err error) bool {
	var ne net.Error
	return err == io.EOF || strings.Contains(err.Error(), "closed") || (errorsAs(err, &ne) && !ne.Timeout())
}

// cloneAndBoot clones the template into id (linked unless opt says),
// starts it and waits until its agent answers.
func cloneAndBoot(t *testing.T, s *sim, id int, opt *pve.CloneOptions) int {
	t.Helper()
	ctx := ctxT(t)
	o := pve.CloneOptions{}
	if opt != nil {
		o = *opt
	}
	o.NewID = id
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if upid, err = s.c.StartVM(ctx, "pve1", id); err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	waitAgent(t, s, id)
	return id
}

func waitAgent(t *testing.T, s *sim, id int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.c.AgentPing(ctxT(t), "pve1", id)
		if err == nil {
			return
		}
		if !pve.IsAgentNotRunning(err) || time.Now().After(deadline) {
			t.Fatalf("agent of %d: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExec polls exec-status until the command ended.
func waitExec(t *testing.T, s *sim, id, pid int) pve.ExecStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := s.c.AgentExecStatus(ctxT(t), "pve1", id, pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec %d in %d did not end", pid, id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run runs argv in the guest and waits for it.
func run(t *testing.T, s *sim, id int, argv ...string) pve.ExecStatus {
	t.Helper()
	pid, err := s.c.AgentExec(ctxT(t), "pve1", id, argv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return waitExec(t, s, id, pid)
}
