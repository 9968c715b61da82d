//go:build linux

package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
)

// tunnel opens a CONNECT tunnel to allowed.test:80 on c (the shared
// listener's or a sandbox's) and says whether the proxy opened it; the
// connection stays open, idle.
func tunnel(c net.Conn, token string) (bool, string) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	fmt.Fprintf(c, "CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\nProxy-Authorization: Bearer %s\r\n\r\n", token)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return false, err.Error()
	}
	if resp.StatusCode == http.StatusOK {
		return true, resp.Status // the tunnel: no body
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return false, resp.Status + " " + string(b)
}

// get fetches http://allowed.test/ through a sandbox's proxy port.
func get(t *testing.T, sb *sandbox) error {
	t.Helper()
	c, err := dialIn(sb.ns, "tcp", "10.0.2.2:3128")
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "hello from allowed\n" {
		return fmt.Errorf("%s %q", resp.Status, b)
	}
	return nil
}

// One job holding many idle connections (issue 34, item 4) hits its own
// cap, in its sandbox and through the shared listener: what is over it is
// refused and logged, and another job's proxy still works; all jobs
// together hit the proxy's cap, which leaves the server the rest of its
// descriptors.
func TestConnectionCaps(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxConnsPerJob, c.MaxConns, c.ConnRate = 8, 14, 1000 })
	for _, tok := range []string{"greedy", "other", "third"} {
		f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	}
	greedy, other := newSandbox(t, f.p, "greedy"), newSandbox(t, f.p, "other")
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	opened, refused := 0, 0
	for range 12 {
		c, err := dialIn(greedy.ns, "tcp", "10.0.2.2:3128")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if ok, _ := tunnel(c, "greedy"); ok {
			opened++
		} else {
			refused++
		}
	}
	if opened != 8 || refused != 4 {
		t.Errorf("the greedy job opened %d tunnels (%d refused), want 8 (4)", opened, refused)
	}
	f.entry(t, "greedy", "the refusal", func(e Entry) bool {
		return !e.Allowed && strings.Contains(e.Rule, "the job's cap of 8 connections at once")
	})
	// Through the shared listener, the same job is at its cap.
	c, err := net.Dial("tcp", f.proxy)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, c)
	if ok, status := tunnel(c, "greedy"); ok || !strings.Contains(status, "503") {
		t.Errorf("over its cap through the shared listener: %v %s", ok, status)
	}
	// Another job's proxy works.
	if err := get(t, other); err != nil {
		t.Errorf("another job: %v", err)
	}
	// All jobs together: the proxy's cap (14: 8 held, 6 more), once the
	// proxy has seen the refused connection and the other job's request
	// end (their places come back as their handlers return).
	testkit.Eventually(t, 10*time.Second, "the proxy holding the greedy job's 8 connections alone", func() bool { return f.p.limits.count() == 8 })
	third := 0
	for range 8 {
		c, err := net.Dial("tcp", f.proxy)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if ok, _ := tunnel(c, "third"); ok {
			third++
		}
	}
	if third != 6 {
		t.Errorf("a third job opened %d tunnels, want 6 (the proxy's cap of 14, less the 8 held)", third)
	}
	// Closing what the greedy job holds gives its share back.
	for _, c := range held[:12] {
		c.Close()
	}
	testkit.Eventually(t, 10*time.Second, "the greedy job's proxy, its connections closed", func() bool { return get(t, greedy) == nil })
}

// A job opens connections at most at its rate (with a burst of twice
// as many): past it they are refused.
func TestConnectionRate(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ConnRate = 1 })
	f.jobs.set("fast", Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	sb := newSandbox(t, f.p, "fast")
	refused := 0
	for range 10 {
		if err := get(t, sb); err != nil {
			refused++
		}
	}
	if refused == 0 {
		t.Error("10 connections at once, none refused at a rate of 1 a second")
	}
	f.entry(t, "fast", "the refusal", func(e Entry) bool {
		return !e.Allowed && strings.Contains(e.Rule, "the job's rate of 1 connection a second")
	})
}

// A tunnel that carries nothing either way for the idle timeout is
// closed.
func TestIdleTunnelClosed(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	f.jobs.set("idle", Policy{Mode: Egress})
	c := connectThrough(t, f, "idle", "allowed.test:80")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("an idle tunnel: %v, want EOF", err)
	}
	f.entry(t, "idle", "the idle tunnel", func(e Entry) bool { return e.Via == ViaConnect && strings.Contains(e.Err, "idle") })
}

// A destination that never answers a request is given up after the idle
// timeout (502), rather than holding the job's connection for ever.
func TestSilentDestinationGivenUp(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	f.jobs.set("wait", Policy{Mode: Egress})
	f.w.Sites["allowed"].Route(t, "/silent", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // answers nothing until the proxy goes
	}))
	c, err := net.Dial("tcp", f.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET http://allowed.test/silent HTTP/1.1\r\nHost: allowed.test\r\nProxy-Authorization: Bearer wait\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("a destination that never answers: %v %v", resp, err)
	}
}
