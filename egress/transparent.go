package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"
)

// ServeTransparent serves connections redirected to the proxy from a
// job's sandbox, for clients that ignore the proxy variables: a TLS
// connection is named by the SNI of its ClientHello (read, not decrypted,
// then replayed upstream), a plain HTTP one by its Host header, and the
// port is always the one the client connected to (ln's local port, as the
// sandbox's routing keeps it). TLS without SNI, or with an encrypted
// ClientHello, is refused: the proxy could not tell where it goes. ln
// belongs to the job of token, which is required: nothing in a redirected
// connection names its job.
func (p *Proxy) ServeTransparent(ctx context.Context, ln net.Listener, token string) error {
	if token == "" {
		return fmt.Errorf("%w: a transparent listener belongs to one job: give its token", ErrInvalid)
	}
	return p.serve(ctx, ln, token, ViaTransparent, func(ctx context.Context, c net.Conn) {
		untrack := p.conns.add(token, c)
		defer untrack()
		p.transparent(ctx, c, token)
	})
}

func (p *Proxy) transparent(ctx context.Context, c net.Conn, token string) {
	a := &attempt{token: token, start: time.Now(), via: ViaTransparent}
	if ap, err := netip.ParseAddrPort(c.LocalAddr().String()); err == nil {
		a.port = ap.Port()
	}
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return
	}
	in := io.MultiReader(bytes.NewReader(first[:]), c)
	switch {
	case first[0] == recordHandshake:
		p.transparentTLS(ctx, c, in, a)
	case first[0] >= 'A' && first[0] <= 'Z':
		c.SetReadDeadline(time.Time{})
		f := p.newForwarder(c, in, modeTransparent, ViaTransparentH)
		f.token, f.fixed, f.localPort = token, token, a.port
		f.loop(ctx)
	default:
		e := a.entry()
		e.Rule = "neither TLS nor HTTP: the proxy cannot tell where it goes"
		p.record(token, e)
	}
}

func (p *Proxy) transparentTLS(ctx context.Context, c net.Conn, in io.Reader, a *attempt) {
	raw, hello, err := readClientHello(in)
	c.SetReadDeadline(time.Time{})
	deny := func(rule string, alert byte) {
		e := a.entry()
		e.Rule = rule
		p.record(a.token, e)
		c.Write(tlsAlert(alert))
	}
	switch {
	case err != nil:
		deny("not a TLS ClientHello: "+err.Error(), alertAccessDenied)
		return
	case hello.ech:
		deny("encrypted ClientHello (ECH): the proxy cannot see the name", alertAccessDenied)
		return
	case hello.serverName == "":
		deny("TLS without SNI: the proxy cannot see the name", alertUnrecognizedSNI)
		return
	}
	if _, err := netip.ParseAddr(hello.serverName); err == nil {
		deny("SNI is an address, not a name", alertUnrecognizedSNI)
		return
	}
	name, reason := normalizeName(hello.serverName)
	if reason != "" {
		deny("SNI "+hello.serverName+": "+reason, alertUnrecognizedSNI)
		return
	}
	a.name = name
	pol, addrs, rule, err := p.authorize(ctx, a, false)
	if err != nil {
		p.logRefusal(a, rule, err)
		c.Write(tlsAlert(alertAccessDenied))
		return
	}
	if inj, ok := pol.injection(name); ok {
		p.intercept(ctx, &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(raw), c)}, a, pol, inj)
		return
	}
	e := a.entry()
	e.Allowed, e.Rule = true, rule
	up, ad, err := p.out.dial(ctx, addrs, a.port)
	e.Addr = ad
	if err != nil {
		e.Err = err.Error()
		p.record(a.token, e)
		c.Write(tlsAlert(alertAccessDenied))
		return
	}
	defer up.Close()
	e.Sent, e.Received, err = pipe(c, raw, up, p.cfg.IdleTimeout)
	if err != nil {
		e.Err = err.Error()
	}
	e.Duration = time.Since(e.Time)
	p.record(a.token, e)
}

// intercept stands in for an injected host: TLS with the job's CA toward
// the job, verified TLS toward the host, and the credential's header set on
// every request between. c has not begun its TLS handshake.
func (p *Proxy) intercept(ctx context.Context, c net.Conn, a *attempt, pol Policy, inj Injection) {
	leaf, err := pol.CA.leaf(a.name)
	if err != nil {
		e := a.entry()
		e.Rule, e.Err = "error", "no certificate for the job: "+err.Error()
		p.record(a.token, e)
		return
	}
	conf := &tls.Config{
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if h.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(h.ServerName, "."), a.name) {
				return nil, fmt.Errorf("SNI %q on a connection to %s", h.ServerName, a.name)
			}
			return leaf, nil
		},
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	}
	tc := tls.Server(c, conf)
	hctx, cancel := context.WithTimeout(ctx, headerTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		e := a.entry()
		e.Allowed, e.Rule = true, "inject "+inj.Header
		e.Err = "TLS with the job (does its trust bundle hold the job's CA?): " + err.Error()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			e.Err = "TLS with the job: timed out"
		}
		p.record(a.token, e)
		return
	}
	f := p.newForwarder(tc, tc, modeIntercept, a.via)
	f.token, f.fixed = a.token, a.token
	f.host, f.port, f.inj = a.name, a.port, &inj
	f.loop(ctx)
}
