//go:build linux

package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testnet"
)

// jobs stands in for the engine: the policies of the jobs by token.
type jobs struct {
	mu sync.Mutex
	m  map[string]Policy
}

func (j *jobs) Policy(_ context.Context, token string) (Policy, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	pol, ok := j.m[token]
	if !ok {
		return Policy{}, fmt.Errorf("job token %.4s…: %w", token, ErrUnknownToken)
	}
	return pol, nil
}

func (j *jobs) set(token string, pol Policy) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.m == nil {
		j.m = map[string]Policy{}
	}
	j.m[token] = pol
}

// widen does what the engine does when a job's allowlist is widened.
func (j *jobs) widen(t testing.TB, p *Proxy, token string, rules ...string) {
	t.Helper()
	j.mu.Lock()
	wider, ch, err := j.m[token].Widen(mustRules(t, rules...)...)
	if err != nil {
		j.mu.Unlock()
		t.Fatal(err)
	}
	j.m[token] = wider
	j.mu.Unlock()
	p.PolicyChanged(token, ch)
}

// fixture is a proxy over the test world, with its log.
type fixture struct {
	w     *testnet.W
	p     *Proxy
	jobs  *jobs
	log   *Recorder
	proxy string // a shared listener, for the proxy variables from the host
}

func newFixture(t testing.TB, configure func(*Config)) *fixture {
	t.Helper()
	w := testnet.World(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the network tests need curl: ", err)
	}
	f := &fixture{w: w, jobs: &jobs{}, log: NewRecorder(1000)}
	cfg := Config{
		Policies: f.jobs,
		Sink:     f.log,
		Resolver: w.Resolver,
		RootCAs:  w.Roots,
		Callback: netip.MustParseAddrPort("127.0.0.1:8082"), // the "host" site's loopback listener
	}
	if configure != nil {
		configure(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln, "") }()
	f.proxy = ln.Addr().String()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		p.Close()
	})
	return f
}

// proxyEnv is the environment of a client that uses the shared listener
// as job token.
func (f *fixture) proxyEnv(token string) []string {
	u := "http://job:" + token + "@" + f.proxy
	return []string{"http_proxy=" + u, "https_proxy=" + u, "HTTPS_PROXY=" + u, "no_proxy="}
}

// curl runs curl with the test's roots (plus extra PEM files) trusted.
func (f *fixture) curl(t testing.TB, ns string, env []string, args ...string) cmdResult {
	t.Helper()
	base := []string{"curl", "-sS", "--max-time", "15", "--cacert", f.w.RootsPEM}
	return run(t, ns, env, append(base, args...)...)
}

// bundle writes a trust bundle of the test's roots and a job's CA, as the
// engine would for the sandbox.
func (f *fixture) bundle(t testing.TB, ca *CA) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bundle.pem")
	if err := os.WriteFile(p, append(f.w.RootsBytes, ca.CertPEM()...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// entry waits for a log entry of token's that matches.
func (f *fixture) entry(t testing.TB, token string, what string, match func(Entry) bool) Entry {
	t.Helper()
	var found Entry
	if !testkit.Poll(5*time.Second, func() bool {
		for _, e := range f.log.Entries(token) {
			if match(e) {
				found = e
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no log entry %s; the log:\n%s", what, f.dump(token))
	}
	return found
}

func (f *fixture) dump(token string) string {
	var b strings.Builder
	for _, e := range f.log.Entries(token) {
		fmt.Fprintf(&b, "  %s %s%s %s:%d allowed=%v rule=%q sent=%d recv=%d inj=%q err=%q\n",
			e.Via, e.Name, strings.TrimRight(" "+e.QType, " "), e.Addr, e.Port, e.Allowed, e.Rule, e.Sent, e.Received, e.Injected, e.Err)
	}
	return b.String()
}

// named matches an entry by how it came, its name and its decision.
func named(via Via, name string, allowed bool) func(Entry) bool {
	return func(e Entry) bool { return e.Via == via && e.Name == name && e.Allowed == allowed }
}
