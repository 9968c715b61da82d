package proxmox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// agentAnswer is one answer to POST .../agent/ping: 0 is success, -1 a
// connection closed without an answer, any other code an error with that
// reason phrase.
type agentAnswer struct {
	code   int
	reason string
}

// pingScript answers the agent pings of VM 100 on pve1 in turn, the last
// answer for ever after, and counts them.
type pingScript struct {
	mu      sync.Mutex
	answers []agentAnswer
	pings   int
}

func (p *pingScript) handler(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/api2/json/nodes/pve1/qemu/100/agent/ping" {
		failWith(w, 501, "Method '"+r.Method+" "+r.URL.Path+"' not implemented")
		return
	}
	p.mu.Lock()
	a := p.answers[min(p.pings, len(p.answers)-1)]
	p.pings++
	p.mu.Unlock()
	switch a.code {
	case 0:
		fmt.Fprint(w, `{"data":{}}`)
	case -1:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
	default:
		failWith(w, a.code, a.reason)
	}
}

func (p *pingScript) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pings
}

func repeat(a agentAnswer, n int) []agentAnswer {
	out := make([]agentAnswer, n)
	for i := range out {
		out[i] = a
	}
	return out
}

var (
	pingOK         = agentAnswer{0, ""}
	pingBooting    = agentAnswer{500, "QEMU guest agent is not running"}
	pingInternal   = agentAnswer{500, "proxy loop detected"}
	pingBusy       = agentAnswer{503, "Service Unavailable"}
	pingNodeDown   = agentAnswer{595, "Connection refused"}
	pingDropped    = agentAnswer{-1, ""}
	pingForbidden  = agentAnswer{403, "Permission check failed (/vms/100, VM.GuestAgent.Audit)"}
	pingStopped    = agentAnswer{500, "VM 100 is not running"}
	pingNoAgent    = agentAnswer{500, "No QEMU guest agent configured"}
	pingNoSuchVM   = agentAnswer{500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist"}
	pingBadRequest = agentAnswer{400, "Parameter verification failed."}
)

// TestWaitAgent: the wait for the guest agent outlasts what may pass (the
// agent still booting, 5xx answers of a busy or restarting proxy, a
// dropped connection) until its deadline, then fails naming the timeout
// and the last error; what waiting cannot change (a refused token, a VM
// stopped or gone, no agent configured) ends it at the first answer.
func TestWaitAgent(t *testing.T) {
	const timeout = 300 * time.Millisecond
	mixed := append(append(append(repeat(pingBooting, 2), pingBusy, pingInternal, pingNodeDown, pingDropped), repeat(pingBusy, 3)...), pingOK)
	tests := []struct {
		name    string
		answers []agentAnswer
		pings   int    // exactly this many, or (0) at least 2 (until the deadline)
		err     string // "" for success
		errIs   func(error) bool
	}{
		{"up at once", []agentAnswer{pingOK}, 1, "", nil},
		{"booting, then up", append(repeat(pingBooting, 3), pingOK), 4, "", nil},
		{"transient 5xx and a dropped connection, then up", mixed, len(mixed), "", nil},
		{"503 past the deadline", []agentAnswer{pingBooting, pingBusy}, 0, "did not answer within 300ms", func(err error) bool {
			var api *pve.APIError
			return errors.As(err, &api) && api.StatusCode == 503
		}},
		{"500 past the deadline", []agentAnswer{pingInternal}, 0, "did not answer within 300ms", func(err error) bool {
			var api *pve.APIError
			return errors.As(err, &api) && api.StatusCode == 500
		}},
		{"agent never up", []agentAnswer{pingBooting}, 0, "is qemu-guest-agent installed", pve.IsAgentNotRunning},
		{"forbidden", append([]agentAnswer{pingBusy}, pingForbidden, pingOK), 2, "lacks VM.GuestAgent.Audit on /vms/100", pve.IsForbidden},
		{"bad request", []agentAnswer{pingBadRequest, pingOK}, 1, "Parameter verification failed", pve.IsParamError},
		{"VM stopped", []agentAnswer{pingBooting, pingStopped, pingOK}, 2, "VM 100 is not running", pve.IsVMNotRunning},
		{"no agent configured", []agentAnswer{pingNoAgent, pingOK}, 1, "No QEMU guest agent configured", pve.IsAgentNotConfigured},
		{"VM gone", []agentAnswer{pingNoSuchVM, pingOK}, 1, "does not exist", pve.IsNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &pingScript{answers: tt.answers}
			// Only the cases that run to the deadline get the short one: a
			// case that ends at an answer must not race it on a loaded
			// machine (the mixed answers took over 300 ms in CI under load).
			agentTimeout := timeout
			if tt.pings != 0 {
				agentTimeout = 30 * time.Second
			}
			b := backendAt(t, http.HandlerFunc(p.handler), Config{Instance: "abcd1234", PollInterval: 5 * time.Millisecond, AgentTimeout: agentTimeout})
			// A hang guard only: a wait that ignores its deadline fails here.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			err := b.waitAgent(ctx, &vmSandbox{b: b, vmid: 100, node: "pve1"})
			took := time.Since(start)
			if ctx.Err() != nil {
				t.Fatalf("the wait ignored its %s deadline: %v", agentTimeout, err)
			}
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("wait: %v (after %d pings)", err, p.count())
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("wait: %v, want an error with %q", err, tt.err)
			case tt.errIs != nil && !tt.errIs(err):
				t.Fatalf("wait: %v does not wrap the API's error", err)
			}
			switch {
			case tt.pings > 0 && p.count() != tt.pings:
				t.Errorf("%d pings, want %d", p.count(), tt.pings)
			case tt.pings == 0 && p.count() < 2:
				t.Errorf("%d pings: the error was not waited out", p.count())
			case tt.pings == 0 && took < timeout:
				// Correctness, not speed: it gave up before its deadline.
				t.Errorf("gave up after %s, before the %s deadline", took, timeout)
			}
		})
	}
}

// backendAt is a Backend talking to handler, pinned to its certificate,
// with client-side retries off so that every answer reaches the backend.
func backendAt(t *testing.T, handler http.Handler, cfg Config) *Backend {
	t.Helper()
	srv := httptest.NewTLSServer(handler)
	t.Cleanup(srv.Close)
	b, err := New(pinnedClient(t, srv, pve.Config{RetryAttempts: -1}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pinnedClient is a client of srv, pinned to its certificate, with the
// settings of base that are set.
func pinnedClient(t *testing.T, srv *httptest.Server, base pve.Config) *pve.Client {
	t.Helper()
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	sum := sha256.Sum256(srv.Certificate().Raw)
	var fp []string
	for _, b := range sum {
		fp = append(fp, fmt.Sprintf("%02X", b))
	}
	base.Host, base.Port, base.User, base.TokenName, base.TokenValue = host, p, "root@pam", "tk", "s"
	base.SSLMode, base.Fingerprint = pve.SSLVerify, strings.Join(fp, ":")
	if base.TaskPollInterval == 0 {
		base.TaskPollInterval = time.Millisecond
	}
	c, err := pve.New(base)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
