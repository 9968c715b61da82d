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
