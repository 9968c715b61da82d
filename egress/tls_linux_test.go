//go:build linux

package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// connectThrough opens a CONNECT tunnel to target through the fixture's
// shared listener.
func connectThrough(t *testing.T, f *fixture, token, target string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", target, target, token)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK || br.Buffered() != 0 {
		t.Fatalf("CONNECT %s: %v %v", target, resp, err)
	}
	return c
}

// Under an allowlist, a tunnel to an allowed name cannot carry TLS for
// another name (a shared front end routes by SNI), nor an encrypted
// ClientHello; under egress it may, there being nothing to hide from.
func TestConnectTunnelSNI(t *testing.T) {
	f := newFixture(t, nil)
	f.jobs.set("allow", Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	f.jobs.set("egress", Policy{Mode: Egress})
	handshake := func(c net.Conn, sni string) error {
		tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: f.w.Roots})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			return err
		}
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
		b, err := io.ReadAll(tc)
		if !bytes.Contains(b, []byte("hello from allowed")) {
			return fmt.Errorf("read %q, %v", b, err)
		}
		return nil
	}
	allowed := f.w.Sites["allowed"]

	if err := handshake(connectThrough(t, f, "allow", "allowed.test:443"), "allowed.test"); err != nil {
		t.Errorf("the allowed name: %v", err)
	}
	allowed.Reset()
	err := handshake(connectThrough(t, f, "allow", "allowed.test:443"), "denied.test")
	if err == nil || !strings.Contains(err.Error(), "access denied") || allowed.Hits() != 0 {
		t.Errorf("fronting denied.test through allowed.test: %v; the site got %+v", err, allowed.Requests())
	}
	f.entry(t, "allow", "the fronting", func(e Entry) bool {
		return e.Via == ViaConnect && e.Name == "allowed.test" && !e.Allowed && e.Rule == `in the tunnel: SNI "denied.test" is not allowed.test`
	})
	c := connectThrough(t, f, "allow", "allowed.test:443")
	c.Write(buildHello([][]byte{sniExt("allowed.test"), ext(extECH, []byte{0, 1, 2, 3})}, 1<<14))
	if b, _ := io.ReadAll(c); !bytes.Equal(b, tlsAlert(alertAccessDenied)) {
		t.Errorf("ECH in an allowlist's tunnel: read %q", b)
	}
	f.entry(t, "allow", "the ECH tunnel", func(e Entry) bool { return strings.HasPrefix(e.Rule, "in the tunnel: encrypted ClientHello") })
	if err := handshake(connectThrough(t, f, "egress", "allowed.test:443"), "denied.test"); err != nil {
		t.Errorf("another SNI under egress: %v", err)
	}
}

// The transparent listener refuses TLS it cannot name.
func TestTransparentRefusesECH(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-ech"
	f.jobs.set(tok, Policy{Mode: Egress})
	sb := newSandbox(t, f.p, tok)
	for _, tc := range []struct {
		name  string
		hello []byte
		alert byte
		rule  string
	}{
		{"ECH", buildHello([][]byte{sniExt("allowed.test"), ext(extECH, []byte{0, 1, 2, 3})}, 1<<14), alertAccessDenied, "encrypted ClientHello (ECH)"},
		{"no SNI", buildHello(nil, 1<<14), alertUnrecognizedSNI, "TLS without SNI"},
		{"an address as SNI", buildHello([][]byte{sniExt("203.0.113.10")}, 1<<14), alertUnrecognizedSNI, "SNI is an address"},
		{"garbage", []byte{22, 3, 1, 0, 5, 9, 9, 9, 9, 9}, alertAccessDenied, "not a TLS ClientHello"},
	} {
		c, err := dialIn(sb.ns, "tcp", "203.0.113.10:443")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(tc.hello)
		b, _ := io.ReadAll(c)
		c.Close()
		if !bytes.Equal(b, tlsAlert(tc.alert)) {
			t.Errorf("%s: read %q", tc.name, b)
		}
		f.entry(t, tok, tc.name, func(e Entry) bool { return e.Via == ViaTransparent && !e.Allowed && strings.HasPrefix(e.Rule, tc.rule) })
	}
	if f.w.Sites["allowed"].Hits() != 0 {
		t.Error("a refused connection reached the site")
	}
}

// Revoke closes a job's open connections at once.
func TestRevoke(t *testing.T) {
	f := newFixture(t, nil)
	f.jobs.set("going", Policy{Mode: Egress})
	f.jobs.set("staying", Policy{Mode: Egress})
	open := func(token string) net.Conn {
		c := connectThrough(t, f, token, "allowed.test:80")
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		return c
	}
	going, staying := open("going"), open("staying")
	f.p.Revoke("going")
	going.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := going.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the revoked job's tunnel: %v, want EOF", err)
	}
	staying.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := staying.Read(make([]byte, 1)); err == io.EOF {
		t.Error("another job's tunnel was closed")
	}
}

// Under an allowlist, plain HTTP in a CONNECT tunnel to an allowed name
// must name that host in every request (issue 34, item 6): a shared front
// end routes by Host as it does by SNI. A request naming another host (by
// Host, by an absolute URI, by another port) is answered 421 and never
// reaches the site; under egress it goes through.
func TestConnectTunnelHost(t *testing.T) {
	f := newFixture(t, nil)
	f.jobs.set("allow", Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	f.jobs.set("egress", Policy{Mode: Egress})
	allowed := f.w.Sites["allowed"]
	ask := func(c net.Conn, br *bufio.Reader, line, host string) (*http.Response, string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: %s\r\n\r\n", line, host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return nil, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	fronted := func() bool {
		for _, r := range allowed.Requests() {
			if !strings.HasPrefix(r.Host, "allowed.test") {
				return true
			}
		}
		return false
	}

	// The allowed host, twice on one tunnel, then another: refused.
	c := connectThrough(t, f, "allow", "allowed.test:80")
	br := bufio.NewReader(c)
	for range 2 {
		if resp, body := ask(c, br, "GET /", "allowed.test"); resp == nil || resp.StatusCode != 200 || body != "hello from allowed\n" {
			t.Fatalf("the allowed host in its tunnel: %v %q", resp, body)
		}
	}
	if resp, body := ask(c, br, "GET /", "denied.test"); resp == nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host denied.test in a tunnel to allowed.test: %v %q", resp, body)
	}
	f.entry(t, "allow", "the fronting", func(e Entry) bool {
		return e.Via == ViaConnect && !e.Allowed && e.Rule == `in the tunnel to allowed.test:80: Host "denied.test"`
	})
	for _, tc := range []struct{ line, host string }{
		{"GET /", "denied.test"},
		{"GET http://denied.test/", "allowed.test"},
		{"GET /", "allowed.test:8080"},
		{"GET /", "203.0.113.10"},
	} {
		c := connectThrough(t, f, "allow", "allowed.test:80")
		if resp, body := ask(c, bufio.NewReader(c), tc.line, tc.host); resp == nil || resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("%s, Host %s, first in a tunnel to allowed.test: %v %q", tc.line, tc.host, resp, body)
		}
	}
	if fronted() || len(allowed.Requests()) != 2 {
		t.Errorf("the site got %+v", allowed.Requests())
	}
	f.entry(t, "allow", "the tunnel", func(e Entry) bool {
		return e.Via == ViaConnect && e.Name == "allowed.test" && e.Allowed && e.Sent > 0 && e.Received > 0
	})

	allowed.Reset()
	c = connectThrough(t, f, "egress", "allowed.test:80")
	if resp, body := ask(c, bufio.NewReader(c), "GET /", "denied.test"); resp == nil || resp.StatusCode != 200 || !fronted() {
		t.Errorf("another Host under egress: %v %q", resp, body)
	}
}
