package proxmox_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
)

// flakyProxy stands in front of the simulator like a pveproxy that has
// trouble: it answers agent pings with the given statuses (503 busy, 596
// node unreachable...) in turn instead of passing them on, then passes
// them; forever, if set, answers every ping.
type flakyProxy struct {
	mu       sync.Mutex
	statuses []int
	forever  int
	answered []int // the statuses it gave instead of the simulator's answer
}

func (f *flakyProxy) intercept(r *http.Request) (int, bool) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/agent/ping") {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	code := f.forever
	if code == 0 && len(f.statuses) > 0 {
		code, f.statuses = f.statuses[0], f.statuses[1:]
	}
	if code == 0 {
		return 0, false
	}
	f.answered = append(f.answered, code)
	return code, true
}

func (f *flakyProxy) gave() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.answered...)
}

// proxyClient starts f in front of sim and returns a client of it with
// an administrator's token.
func proxyClient(t *testing.T, sim *pvesim.Server, f *flakyProxy) *pve.Client {
	t.Helper()
	secret := "s3cret"
	if err := sim.AddToken(pvesim.Token{ID: "delegate@pve!tk", Secret: secret, Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(sim.CertificatePEM()) {
		t.Fatal("the simulator's certificate does not parse")
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: target.Hostname()}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, ok := f.intercept(r); ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprint(w, `{"data":null}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	sum := sha256.Sum256(srv.Certificate().Raw)
	var fp []string
	for _, b := range sum {
		fp = append(fp, fmt.Sprintf("%02X", b))
	}
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	c, err := pve.New(pve.Config{Host: u.Hostname(), Port: port, User: "delegate@pve", TokenName: "tk", TokenValue: secret,
		SSLMode: pve.SSLVerify, Fingerprint: strings.Join(fp, ":"), TaskPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAgentWaitOutlasts5xx: a job whose VM's agent pings are answered
// 503 and 596 (pveproxy busy, node unreachable) a few times still runs;
// when they last past the agent timeout the job fails saying so, and
// its VM is destroyed.
func TestAgentWaitOutlasts5xx(t *testing.T) {
	t.Parallel()
	t.Run("transient", func(t *testing.T) {
		sim := newSim(t, pvesim.DefaultNodes(1), nil)
		f := &flakyProxy{statuses: []int{503, 503, 596, 503, 502}}
		s := newServer(t, proxyClient(t, sim, f), proxmox.Config{AgentTimeout: time.Minute}, engine.Config{})
		j := s.submit(t, "echo up", "", 0)
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "up\n" {
			t.Fatalf("job %s %q, output %q (proxy answered %v)", got.Status, got.Error, s.output(t, j.ID), f.gave())
		}
		if g := f.gave(); fmt.Sprint(g) != "[503 503 596 503 502]" {
			t.Errorf("the proxy answered %v instead of the simulator", g)
		}
		noJobVMs(t, sim)
	})
	t.Run("lasting", func(t *testing.T) {
		sim := newSim(t, pvesim.DefaultNodes(1), nil)
		f := &flakyProxy{forever: 503}
		s := newServer(t, proxyClient(t, sim, f), proxmox.Config{AgentTimeout: time.Second}, engine.Config{})
		j := s.submit(t, "echo up", "", 0)
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "did not answer within 1s") || !strings.Contains(got.Error, "503") {
			t.Fatalf("job %s %q, want failed: the agent did not answer within 1s (503)", got.Status, got.Error)
		}
		if n := len(f.gave()); n < 2 {
			t.Errorf("%d pings: the 503 was not waited out", n)
		}
		noJobVMs(t, sim)
	})
}
