//go:build linux

package local

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/internal/testnet"
	"github.com/delegate-dev/delegate/sandbox"
)

// policies is a test's egress.Policies: a policy per token, changeable.
type policies struct {
	mu sync.Mutex
	p  map[string]egress.Policy
}

func (p *policies) Policy(ctx context.Context, token string) (egress.Policy, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pol, ok := p.p[token]
	if !ok {
		return egress.Policy{}, egress.ErrUnknownToken
	}
	return pol, nil
}

func (p *policies) set(token string, pol egress.Policy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p[token] = pol
}

// egressBackend is a backend whose sandboxes with Spec.Egress go through
// a proxy of the test world's, with the policies given.
func egressBackend(t *testing.T, w *testnet.W, pols *policies) (*Backend, *egress.Proxy, *egress.Recorder) {
	t.Helper()
	rec := egress.NewRecorder(1000)
	p, err := egress.New(egress.Config{Policies: pols, Sink: rec, Resolver: w.Resolver, RootCAs: w.Roots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	b := newBackend(t, 0)
	b.proxies.server = p
	t.Cleanup(func() { b.Close() })
	return b, p, rec
}

func egressSpec(token string) sandbox.Spec {
	s := defaultSpec()
	s.Network = true
	s.Egress = &sandbox.Egress{Token: token}
	return s
}

// proxyEnv is the environment a job gets from EgressRoute.
func proxyEnv(b *Backend, token string) []string {
	r := b.EgressRoute(token)
	return append([]string{"http_proxy=" + r.ProxyURL, "https_proxy=" + r.ProxyURL, "no_proxy=" + r.NoProxy}, testEnv...)
}

func runEnv(t *testing.T, sb sandbox.Instance, env []string, args ...string) (sandbox.Exit, string) {
	t.Helper()
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: args, Env: env, OutputLimit: 1 << 20})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return finish(t, p)
}

// TestEgressProxySandbox: a sandbox made with Spec.Egress reaches what
// its allowlist names, over HTTP and HTTPS, through the proxy variables
// and without them (its DNS and the transparent listeners), and nothing
// else: not a denied name, a raw address, the metadata service, the
// host's addresses or a private range, by TCP, UDP or DNS. Every attempt
// is in the log.
func TestEgressProxySandbox(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	pols := &policies{p: map[string]egress.Policy{}}
	b, _, rec := egressBackend(t, w, pols)
	if c := b.Capabilities(); !c.EgressProxy || !c.NetworkEgress {
		t.Fatalf("capabilities %+v: want EgressProxy and NetworkEgress", c)
	}
	const token = "tok-allow"
	rules, err := egress.ParseRules([]string{"allowed.test", "*.sub.test"})
	if err != nil {
		t.Fatal(err)
	}
	pols.set(token, egress.Policy{Mode: egress.Allowlist, Allow: rules})
	spec := egressSpec(token)
	spec.MultiExec = true // many commands, one network
	sb := create(t, b, spec)
	if err := sb.WriteFile(context.Background(), "/workspace/roots.pem", w.RootsBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	env := proxyEnv(b, token)
	curl := func(args ...string) (sandbox.Exit, string) {
		return runEnv(t, sb, env, append([]string{"curl", "-sS", "--max-time", "10", "--cacert", "/workspace/roots.pem"}, args...)...)
	}
	for _, c := range []struct{ name, url, extra string }{
		{"http via proxy", "http://allowed.test/", ""},
		{"https via proxy", "https://allowed.test/", ""},
		{"wildcard via proxy", "http://files.sub.test/", ""},
		{"http transparent", "http://allowed.test/", "--noproxy"},
		{"https transparent", "https://allowed.test/", "--noproxy"},
	} {
		args := []string{c.url}
		if c.extra == "--noproxy" {
			args = append([]string{c.extra, "*"}, args...)
		} else if c.extra != "" {
			args = append([]string{c.extra}, args...)
		}
		exit, out := curl(args...)
		if exit.Code != 0 || !strings.Contains(out, "hello from allowed") {
			t.Errorf("%s: exit %d: %s", c.name, exit.Code, out)
		}
	}
	allowedHits := w.Sites["allowed"].Hits()
	if allowedHits != 5 {
		t.Errorf("allowed.test served %d requests, want 5", allowedHits)
	}
	for _, c := range []struct{ name, url, extra string }{
		{"denied name via proxy", "http://denied.test/", ""},
		{"denied name https via proxy", "https://denied.test/", ""},
		{"denied name transparent", "http://denied.test/", "--noproxy"},
		{"raw address", "http://" + testnet.Denied + "/", "--noproxy"},
		{"raw address via proxy", "http://" + testnet.Denied + "/", ""},
		{"metadata", "http://" + testnet.MetaAddr + "/", "--noproxy"},
		{"metadata via proxy", "http://" + testnet.MetaAddr + "/", ""},
		{"metadata by name", "http://metadata.test/", ""},
		{"private", "http://" + testnet.Private + "/", "--noproxy"},
		{"host address", "http://" + testnet.HostAddr + ":8081/", "--noproxy"},
		{"host address via proxy", "http://" + testnet.HostAddr + ":8081/", ""},
		{"host loopback via proxy", "http://127.0.0.1:8082/", "--proxy=http://10.0.2.2:3128"},
	} {
		args := []string{"-f", c.url}
		if c.extra == "--noproxy" {
			args = append([]string{c.extra, "*"}, args...)
		} else if c.extra != "" {
			args = append([]string{c.extra}, args...)
		}
		if exit, out := curl(args...); exit.Code == 0 {
			t.Errorf("%s: reached: %s", c.name, out)
		}
	}
	for _, name := range []string{"denied", "metadata", "private", "host"} {
		if n := w.Sites[name].Hits(); n != 0 {
			t.Errorf("%s was reached %d times", name, n)
		}
	}
	// DNS: the sandbox's resolver answers for allowed names only, whatever
	// server the job asks; UDP elsewhere goes nowhere.
	withHelper(t, sb)
	helper := func(name string, args ...string) (sandbox.Exit, string) {
		return runEnv(t, sb, append([]string{testHelperEnv + "=" + name}, testEnv...), append([]string{"/workspace/helper"}, args...)...)
	}
	if _, out := helper("lookup", "allowed.test", "denied.test", "metadata.test"); !strings.Contains(out, "allowed.test: "+testnet.Allowed) ||
		!strings.Contains(out, "denied.test: no") || !strings.Contains(out, "metadata.test: no") {
		t.Errorf("lookups:\n%s", out)
	}
	if w.DNS.Asked("denied.test") {
		t.Error("the job's query for denied.test reached the real DNS")
	}
	if _, out := helper("udp", testnet.Denied+":9999", testnet.MetaAddr+":9999", "8.8.8.8:53"); !strings.Contains(out, "sent") {
		t.Logf("udp: %s", out)
	}
	// A datagram that arrives nowhere leaves no event to wait for: a
	// while for one to arrive, which none should.
	time.Sleep(200 * time.Millisecond)
	for _, name := range []string{"denied", "metadata"} {
		if n := w.Sites[name].Hits(); n != 0 {
			t.Errorf("%s got %d datagrams or connections", name, n)
		}
	}
	if _, out := helper("dial", testnet.Allowed+":2222", testnet.MetaAddr+":2222"); !strings.Contains(out, "refused") {
		t.Errorf("raw TCP to other ports: %s", out)
	}
	if n := w.Sites["allowed"].Hits(); n != allowedHits {
		t.Errorf("a raw connection reached allowed.test's other port (%d hits, want %d)", n, allowedHits)
	}
	// The log has each attempt.
	waitFor(5*time.Second, func() bool { s := rec.Summary(token); return s.Allowed >= 5 && s.Denied >= 10 })
	sum := rec.Summary(token)
	if sum.Allowed < 5 || sum.Denied < 10 {
		t.Errorf("log summary %+v: want at least 5 allowed and 10 denied", sum)
	}
	for _, want := range []string{"denied.test:80", testnet.MetaAddr + ":80"} {
		found := false
		for _, d := range sum.DeniedNames {
			found = found || d == want
		}
		if !found {
			t.Errorf("the log's denied names %v lack %s", sum.DeniedNames, want)
		}
	}
	st := stateOf(t, sb)
	if st.Proxy == nil || st.Network != nil {
		t.Errorf("state: proxy %+v, helper %+v; want the proxy alone", st.Proxy, st.Network)
	}
}

// TestEgressRecover: a server that stops and another that recovers the
// sandbox serve its listeners again: the running job, which could not
// connect meanwhile, reaches its allowed name once more.
func TestEgressRecover(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	pols := &policies{p: map[string]egress.Policy{}}
	b, _, _ := egressBackend(t, w, pols)
	rules, _ := egress.ParseRules([]string{"allowed.test"})
	pols.set("tok", egress.Policy{Mode: egress.Allowlist, Allow: rules})
	sb := create(t, b, egressSpec("tok"))
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", `
n=0; ok=0
while [ $n -lt 200 ]; do
	if curl -sf --max-time 2 http://allowed.test/ >/dev/null; then echo up; ok=$((ok+1)); else echo down; fi
	[ -e /workspace/stop ] && break
	n=$((n+1)); sleep 0.05
done`}, Env: proxyEnv(b, "tok"), OutputLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput := func(want string) {
		t.Helper()
		if !waitFor(20*time.Second, func() bool {
			outs, _ := p.ReadOutput(context.Background(), 0, 1<<20)
			return strings.Count(string(sandbox.Join(outs)), want) > 0
		}) {
			t.Fatalf("the job never printed %q", want)
		}
	}
	waitOutput("up")
	b.Close() // the server goes: its listeners close
	waitOutput("down")
	// Another server, on the same directory, recovers the sandbox.
	b2, err := New(Config{Dir: b.dir})
	if err != nil {
		t.Fatal(err)
	}
	b2.proxies.server = b.proxies.server
	t.Cleanup(func() { b2.Close() })
	outs, _ := p.ReadOutput(context.Background(), 0, 1<<20)
	before := strings.Count(string(sandbox.Join(outs)), "up")
	if _, err := b2.Recover(context.Background(), sb.ID()); err != nil {
		t.Fatal(err)
	}
	if !waitFor(20*time.Second, func() bool {
		outs, _ := p.ReadOutput(context.Background(), 0, 1<<20)
		return strings.Count(string(sandbox.Join(outs)), "up") > before
	}) {
		t.Fatal("the job did not reach allowed.test after Recover")
	}
	// Recover again is a no-op (the listeners are served once).
	if _, err := b2.Recover(context.Background(), sb.ID()); err != nil {
		t.Fatalf("a second Recover: %v", err)
	}
	sb.WriteFile(context.Background(), "/workspace/stop", nil, 0o644)
	finish(t, p)
}

// TestEgressTrustKept: a kept sandbox whose job has its own CA gives
// each command the trust bundle at TrustFile (read-only), though each
// command has a /run of its own over the sandbox init's.
func TestEgressTrustKept(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	pols := &policies{p: map[string]egress.Policy{}}
	b, _, _ := egressBackend(t, w, pols)
	const ca = "-----BEGIN CERTIFICATE-----\nthe job's own CA\n-----END CERTIFICATE-----\n"
	spec := egressSpec("tok-trust")
	spec.Egress.CACert = []byte(ca)
	spec.MultiExec, spec.Expires = true, time.Now().Add(time.Minute)
	sb := create(t, b, spec)
	for range 2 {
		exit, out := runEnv(t, sb, testEnv, "/bin/sh", "-c", `tail -n 3 `+TrustFile+`; ls /run/delegate | tr '\n' ' '; echo; { echo x >> `+TrustFile+`; } 2>/dev/null || echo read-only`)
		if want := ca + "ca-bundle.pem status \nread-only\n"; exit.Code != 0 || out != want {
			t.Errorf("a command of the kept sandbox: %+v\n%q\nwant\n%q", exit, out, want)
		}
	}
}
