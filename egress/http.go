package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Serve serves the explicit proxy on ln: HTTP CONNECT and plain HTTP, what
// clients use through http_proxy and https_proxy. With a token, ln belongs
// to that job alone (a listener inside its sandbox); with "", every client
// names its job in Proxy-Authorization (Basic, the token as the password:
// http://job:TOKEN@proxy:3128, which curl, pip, git and npm all send).
// Serve returns when ctx ends, closing ln and its connections.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener, token string) error {
	return p.serve(ctx, ln, token, ViaHTTP, func(ctx context.Context, c net.Conn) {
		f := p.newForwarder(c, c, modeExplicit, ViaHTTP)
		f.fixed = token
		f.loop(ctx)
	})
}

type httpMode int

const (
	modeExplicit    httpMode = iota // proxy requests: absolute URIs and CONNECT
	modeTransparent                 // redirected plain HTTP: named by Host
	modeIntercept                   // decrypted HTTPS to an injected host
	modeTunnel                      // plain HTTP in an allowlist's CONNECT tunnel: named by the tunnel
)

// forwarder relays one client connection's HTTP requests, one at a time,
// over one upstream connection at a time (a new one when the destination
// changes), so that each upstream connection is one entry of the log.
type forwarder struct {
	p      *Proxy
	mode   httpMode
	via    Via
	fixed  string // the listener's token ("" for a shared one)
	token  string // the job's, once known
	client net.Conn
	br     *bufio.Reader
	lr     *io.LimitedReader

	localPort uint16 // transparent: the port the client connected to
	// intercept: the one destination, and the credential for it
	host string
	port uint16
	inj  *Injection

	up      *upstream
	untrack func()
}

// upstream is one connection to a destination.
type upstream struct {
	key        string
	conn       net.Conn
	br         *bufio.Reader
	sent, recv int64 // bytes to the destination, and to the job
	e          Entry
}

func (p *Proxy) newForwarder(c net.Conn, r io.Reader, mode httpMode, via Via) *forwarder {
	lr := &io.LimitedReader{R: r, N: maxHeaderBytes}
	return &forwarder{p: p, mode: mode, via: via, client: c, lr: lr, br: bufio.NewReader(lr)}
}

func (f *forwarder) loop(ctx context.Context) {
	defer func() {
		f.closeUpstream("")
		if f.untrack != nil {
			f.untrack()
		}
	}()
	for {
		f.lr.N = maxHeaderBytes
		f.client.SetReadDeadline(time.Now().Add(headerTimeout))
		req, err := http.ReadRequest(f.br)
		if err != nil {
			var ne net.Error
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !(errors.As(err, &ne) && ne.Timeout()) {
				writeStatus(f.client, http.StatusBadRequest, "malformed request: "+err.Error(), nil)
			}
			return
		}
		f.client.SetReadDeadline(time.Time{})
		f.lr.N = math.MaxInt64
		if !f.request(ctx, req) {
			return
		}
	}
}

// request relays one request; false ends the client connection.
func (f *forwarder) request(ctx context.Context, req *http.Request) bool {
	defer req.Body.Close()
	a := &attempt{via: f.via, start: time.Now()}
	var err error
	switch f.mode {
	case modeExplicit:
		if !f.authenticate(req) {
			return false
		}
		if req.Method == http.MethodConnect {
			f.connect(ctx, req)
			return false
		}
		switch {
		case req.URL.Scheme == "http" && req.URL.Host != "":
			a.name, a.addr, a.port, err = parseHostPort(req.URL.Host, 80)
		case req.URL.Scheme == "https":
			err = errors.New("https through a plain proxy request: use CONNECT (https_proxy)")
		default:
			err = errors.New("not a proxy request: the request line needs an absolute URI (http://host/path)")
		}
	case modeTransparent:
		if req.Host == "" {
			err = errors.New("no Host header: the proxy cannot tell where the request goes")
		} else {
			// The port is where the client connected, whatever Host says:
			// Host is the client's word, the port a fact.
			a.name, a.addr, _, err = parseHostPort(req.Host, f.localPort)
			a.port = f.localPort
		}
	case modeIntercept:
		name, _, _, herr := parseHostPort(req.Host, f.port)
		if herr != nil || name != f.host {
			// The upstream connection is verified for host: a request
			// naming another would carry the credential elsewhere on a
			// shared front end.
			writeStatus(f.client, http.StatusMisdirectedRequest, "this connection is for "+f.host+", the request names "+strconv.Quote(req.Host), nil)
			return false
		}
		a.name, a.port = f.host, f.port
	case modeTunnel:
		a.name, a.port = f.host, f.port
		name, addr, port, herr := parseHostPort(req.Host, f.port)
		if herr != nil || addr.IsValid() || name != f.host || port != f.port {
			// As the absolute-form and transparent requests are named
			// by their Host: a shared front end routes by it, and the
			// tunnel was allowed for its host alone.
			a.token = f.token
			e := a.entry()
			e.Rule = "in the tunnel to " + a.what() + ": Host " + strconv.Quote(req.Host)
			f.p.record(f.token, e)
			writeStatus(f.client, http.StatusMisdirectedRequest, "this tunnel is to "+a.what()+", the request names "+strconv.Quote(req.Host), nil)
			return false
		}
	}
	a.token = f.token
	if err != nil {
		writeStatus(f.client, http.StatusBadRequest, err.Error(), nil)
		return false
	}
	key := a.what()
	if f.up == nil || f.up.key != key {
		f.closeUpstream("")
		if !f.open(ctx, a, key) {
			return false
		}
	}
	return f.relay(ctx, req)
}

// authenticate finds the job of an explicit proxy request.
func (f *forwarder) authenticate(req *http.Request) bool {
	tok := f.fixed
	if tok == "" {
		tok = proxyToken(req.Header.Get("Proxy-Authorization"))
	}
	req.Header.Del("Proxy-Authorization")
	switch {
	case tok == "":
		writeStatus(f.client, http.StatusProxyAuthRequired, "proxy authentication required: use http://job:TOKEN@ this proxy", authHeader)
		return false
	case f.token != "" && tok != f.token:
		writeStatus(f.client, http.StatusProxyAuthRequired, "one job per connection", authHeader)
		return false
	case f.token == "":
		if f.fixed == "" {
			// The shared listener: the job is known now, and its cap
			// and rate apply (a job's own listener admitted it at
			// accept).
			release, why := f.p.limits.admitJob(tok)
			if why != "" {
				f.p.limits.refuse(tok, ViaHTTP, why)
				writeStatus(f.client, http.StatusServiceUnavailable, "over "+why, nil)
				return false
			}
			untrack := f.p.conns.add(tok, f.client)
			f.untrack = func() { untrack(); release() }
		} else {
			f.untrack = f.p.conns.add(tok, f.client)
		}
		f.token = tok
	}
	return true
}

var authHeader = http.Header{"Proxy-Authenticate": {`Basic realm="delegate egress"`}}

// proxyToken reads the job's token from Proxy-Authorization: Basic with the
// token as password (or as user name, when the password is empty), or
// Bearer.
func proxyToken(h string) string {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok {
		return ""
	}
	cred = strings.TrimSpace(cred)
	switch strings.ToLower(scheme) {
	case "bearer":
		return cred
	case "basic":
		b, err := base64.StdEncoding.DecodeString(cred)
		if err != nil {
			return ""
		}
		user, pass, _ := strings.Cut(string(b), ":")
		if pass != "" {
			return pass
		}
		return user
	}
	return ""
}

// open authorizes a destination and connects to it.
func (f *forwarder) open(ctx context.Context, a *attempt, key string) bool {
	p := f.p
	_, addrs, rule, err := p.authorize(ctx, a, false)
	if err != nil {
		f.refuse(a, rule, err)
		return false
	}
	e := a.entry()
	e.Allowed, e.Rule = true, rule
	conn, ad, err := p.out.dial(ctx, addrs, a.port)
	e.Addr = ad
	if err == nil && f.mode == modeIntercept {
		conn, err = p.upstreamTLS(ctx, conn, a.name)
	}
	if err != nil {
		e.Err = err.Error()
		p.record(a.token, e)
		writeStatus(f.client, http.StatusBadGateway, "connecting to "+a.what()+": "+err.Error(), nil)
		return false
	}
	if f.inj != nil {
		e.Injected = f.inj.Header
	}
	f.up = &upstream{key: key, conn: conn, br: bufio.NewReader(conn), e: e}
	return true
}

// refuse answers a decision against the attempt, and logs it.
func (f *forwarder) refuse(a *attempt, rule string, err error) {
	var ae *authError
	if errors.As(err, &ae) {
		writeStatus(f.client, http.StatusProxyAuthRequired, "unknown job token", authHeader)
		return
	}
	code, msg := f.p.logRefusal(a, rule, err)
	writeStatus(f.client, code, msg, nil)
}

// logRefusal logs a refused attempt and says how to answer it.
func (p *Proxy) logRefusal(a *attempt, rule string, err error) (int, string) {
	e := a.entry()
	var d *deniedError
	if errors.As(err, &d) {
		e.Rule = d.rule
		p.record(a.token, e)
		return http.StatusForbidden, "denied: " + a.what() + " (" + d.rule + ")"
	}
	var ae *authError
	if errors.As(err, &ae) {
		return http.StatusProxyAuthRequired, "unknown job token"
	}
	e.Rule, e.Err = cmp.Or(rule, "error"), err.Error()
	p.record(a.token, e)
	return http.StatusBadGateway, a.what() + ": " + err.Error()
}

// upstreamTLS verifies the destination of an injected credential: only a
// host that proves it is host gets it.
func (p *Proxy) upstreamTLS(ctx context.Context, c net.Conn, host string) (net.Conn, error) {
	tc := tls.Client(c, &tls.Config{
		ServerName: host,
		RootCAs:    p.cfg.RootCAs,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS with %s (the credential was not sent): %w", host, err)
	}
	return tc, nil
}

// relay sends one request upstream and its response back.
func (f *forwarder) relay(ctx context.Context, req *http.Request) bool {
	up := f.up
	upgrade := isUpgrade(req.Header)
	removeHopHeaders(req.Header, upgrade)
	if f.inj != nil {
		req.Header.Del(f.inj.Header)
		req.Header.Set(f.inj.Header, string(f.inj.value))
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// Answered here, so that the client sends its body at once
		// rather than after its own wait for the server's go-ahead.
		req.Header.Del("Expect")
		if _, err := io.WriteString(f.client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	req.RequestURI = ""
	cw := &countWriter{w: up.conn}
	bw := bufio.NewWriter(cw)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	up.sent += cw.n
	if err != nil {
		f.closeUpstream("writing the request: " + err.Error())
		writeStatus(f.client, http.StatusBadGateway, "sending the request upstream: "+err.Error(), nil)
		return false
	}
	var resp *http.Response
	for {
		var err error
		if idle := f.p.cfg.IdleTimeout; idle > 0 {
			// A destination that never answers does not hold the
			// connection (and its place in the job's cap) for ever.
			up.conn.SetReadDeadline(time.Now().Add(idle))
		}
		resp, err = http.ReadResponse(up.br, req)
		up.conn.SetReadDeadline(time.Time{})
		if err != nil {
			f.closeUpstream("reading the response: " + err.Error())
			writeStatus(f.client, http.StatusBadGateway, "reading the response: "+err.Error(), nil)
			return false
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// 1xx (103 Early Hints, 100 Continue): pass on, read the next.
		if err := writeInterim(f.client, resp); err != nil {
			return false
		}
	}
	switching := resp.StatusCode == http.StatusSwitchingProtocols
	removeHopHeaders(resp.Header, switching)
	var n int64
	if !switching && resp.ContentLength > 0 && len(resp.TransferEncoding) == 0 && resp.Body != http.NoBody {
		// A body of known length (most downloads): copied as is, which
		// between two TCP sockets the kernel does (splice). The body
		// reader is left alone: closing it would read past the response.
		n, err = f.copyResponse(resp)
	} else {
		cw := &countWriter{w: f.client}
		bw := bufio.NewWriter(cw)
		err = resp.Write(bw)
		if err == nil {
			err = bw.Flush()
		}
		resp.Body.Close()
		n = cw.n
	}
	up.recv += n
	if err != nil {
		f.closeUpstream("writing the response: " + err.Error())
		return false
	}
	if switching {
		// A protocol switch (WebSocket): from here on, bytes both ways.
		pre, _ := f.br.Peek(f.br.Buffered())
		upPre, _ := up.br.Peek(up.br.Buffered())
		if len(upPre) > 0 {
			if _, err := f.client.Write(upPre); err != nil {
				f.closeUpstream(err.Error())
				return false
			}
		}
		sent, recv, err := pipe(f.client, pre, up.conn, f.p.cfg.IdleTimeout)
		up.sent += sent
		up.recv += recv + int64(len(upPre))
		why := ""
		if err != nil {
			why = err.Error()
		}
		f.closeUpstream(why)
		return false
	}
	if resp.Close || req.Close {
		f.closeUpstream("")
		return false
	}
	return true
}

// copyResponse writes a response whose body has a known length: its head,
// what of the body is already read, then the rest straight from the
// upstream connection.
func (f *forwarder) copyResponse(resp *http.Response) (int64, error) {
	up := f.up
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/%d.%d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.Status)
	resp.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	if resp.Close {
		resp.Header.Set("Connection", "close")
	}
	resp.Header.Write(&b)
	b.WriteString("\r\n")
	n, err := f.client.Write(b.Bytes())
	total := int64(n)
	if err != nil {
		return total, err
	}
	buffered := min(int64(up.br.Buffered()), resp.ContentLength)
	m, err := io.CopyN(f.client, up.br, buffered)
	total += m
	if err != nil {
		return total, err
	}
	m, err = io.CopyN(f.client, up.conn, resp.ContentLength-buffered)
	return total + m, err
}

func writeInterim(w io.Writer, resp *http.Response) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %s\r\n", resp.Status)
	resp.Header.Write(&b)
	b.WriteString("\r\n")
	_, err := w.Write(b.Bytes())
	return err
}

// closeUpstream ends the current upstream connection and logs it.
func (f *forwarder) closeUpstream(why string) {
	up := f.up
	if up == nil {
		return
	}
	f.up = nil
	up.conn.Close()
	e := up.e
	e.Sent, e.Received = up.sent, up.recv
	e.Duration = time.Since(e.Time)
	if why != "" {
		e.Err = why
	}
	f.p.record(f.token, e)
}

// connect serves a CONNECT: a tunnel, or an interception when the job has
// a credential for the host.
func (f *forwarder) connect(ctx context.Context, req *http.Request) {
	p := f.p
	a := &attempt{token: f.token, via: ViaConnect, start: time.Now()}
	var err error
	a.name, a.addr, a.port, err = parseHostPort(req.RequestURI, 0)
	if err != nil {
		writeStatus(f.client, http.StatusBadRequest, "CONNECT "+strconv.Quote(req.RequestURI)+": "+err.Error(), nil)
		return
	}
	pol, addrs, rule, err := p.authorize(ctx, a, false)
	if err != nil {
		f.refuse(a, rule, err)
		return
	}
	pre, _ := f.br.Peek(f.br.Buffered())
	if inj, ok := pol.injection(a.name); ok && a.name != "" {
		if _, err := io.WriteString(f.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		p.intercept(ctx, &prefixConn{Conn: f.client, r: io.MultiReader(bytes.NewReader(pre), f.client)}, a, pol, inj)
		return
	}
	e := a.entry()
	e.Allowed, e.Rule = true, rule
	up, ad, err := p.out.dial(ctx, addrs, a.port)
	e.Addr = ad
	if err != nil {
		e.Err = err.Error()
		p.record(a.token, e)
		writeStatus(f.client, http.StatusBadGateway, "connecting to "+a.what()+": "+err.Error(), nil)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(f.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		e.Err = err.Error()
		p.record(a.token, e)
		return
	}
	if pol.Mode == Allowlist && a.name != "" {
		// Under an allowlist, a TLS client in the tunnel must name the
		// host it asked for: behind a shared front end (a CDN) the SNI,
		// not the address, picks the site; so does an HTTP request's
		// Host, which tunnelHTTP checks request by request.
		var httpIn io.Reader
		var refused string
		e.Sent, e.Received, refused, httpIn, err = tunnelChecked(f.client, pre, up, a.name, p.cfg.IdleTimeout)
		if httpIn != nil {
			f.tunnelHTTP(ctx, a, e, up, httpIn)
			return
		}
		if refused != "" {
			e.Allowed, e.Rule = false, refused
		}
	} else {
		e.Sent, e.Received, err = pipe(f.client, pre, up, p.cfg.IdleTimeout)
	}
	if err != nil {
		e.Err = err.Error()
	}
	e.Duration = time.Since(e.Time)
	p.record(a.token, e)
}

// tunnelHTTP serves the rest of a CONNECT tunnel whose client speaks
// plain HTTP: request by request over the tunnel's upstream connection,
// each naming the tunnel's host and port (modeTunnel), or answered 421 and
// the tunnel ended. The tunnel's entry is logged when it ends.
func (f *forwarder) tunnelHTTP(ctx context.Context, a *attempt, e Entry, up net.Conn, in io.Reader) {
	t := f.p.newForwarder(f.client, in, modeTunnel, ViaConnect)
	t.token, t.fixed = f.token, f.token
	t.host, t.port = a.name, a.port
	t.up = &upstream{key: a.what(), conn: up, br: bufio.NewReader(up), sent: e.Sent, recv: e.Received, e: e}
	t.loop(ctx)
}

// tunnelChecked is pipe for a CONNECT tunnel to name whose first client
// bytes are examined before they go on: a TLS ClientHello must carry no
// SNI or name, and no encrypted ClientHello. The server's bytes flow at
// once (some protocols speak first). It returns why it refused, if it did;
// or, when the client's first bytes are an HTTP request line's, the
// client's bytes from there on (httpIn, nothing of them sent yet): the
// tunnel is then the caller's to serve as HTTP (tunnelHTTP), the server's
// bytes having stopped flowing.
func tunnelChecked(client net.Conn, pre []byte, up net.Conn, name string, idle time.Duration) (sent, recv int64, refused string, httpIn io.Reader, err error) {
	ip := &idlePair{idle: idle}
	var wg sync.WaitGroup
	var down int64
	var downErr, upErr error
	wg.Go(func() {
		n, err := ip.copy(client, up, 1)
		down, downErr = n, err
		if err != nil {
			if errors.Is(err, errStopped) {
				return // stopped for tunnelHTTP
			}
			client.Close()
			up.Close()
			return
		}
		closeWrite(client)
	})
	sent, refused, httpIn, upErr = checkFirst(client, pre, up, name, ip, func() {
		ip.stop.Store(true)
		up.SetReadDeadline(time.Now())
	})
	wg.Wait()
	if httpIn != nil {
		up.SetReadDeadline(time.Time{})
	}
	return sent, down, refused, httpIn, idleErr(upErr, downErr)
}

// httpMethods are the request methods that make a tunnel's first bytes
// HTTP: a known method and a space, nothing less (a protocol whose client
// starts with other capitals, "PING" or "A001 LOGIN", is left alone).
var httpMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "OPTIONS": true, "TRACE": true, "PATCH": true,
	"CONNECT": true, "PROPFIND": true, "PROPPATCH": true, "MKCOL": true, "COPY": true, "MOVE": true, "LOCK": true,
	"UNLOCK": true, "REPORT": true, "SEARCH": true, "MKCALENDAR": true,
}

// checkFirst is tunnelChecked's way up; stop stops the way down when the
// client turns out to speak HTTP.
func checkFirst(client net.Conn, pre []byte, up net.Conn, name string, ip *idlePair, stop func()) (int64, string, io.Reader, error) {
	prefix := bytes.NewReader(pre)
	in := io.MultiReader(prefix, client) // reads exactly what is asked of it
	var first [1]byte
	if err := ip.readFirst(in, client, first[:]); err != nil {
		if errors.Is(err, errIdle) {
			client.Close()
			up.Close()
			return 0, "", nil, err
		}
		closeWrite(up)
		return 0, "", nil, nil
	}
	head := first[:]
	if first[0] >= 'A' && first[0] <= 'Z' {
		// A request line's method, read a byte at a time so that
		// nothing is waited for that another protocol would not send.
		for len(head) <= 12 && head[len(head)-1] >= 'A' && head[len(head)-1] <= 'Z' {
			var b [1]byte
			if _, err := io.ReadFull(in, b[:]); err != nil {
				break
			}
			head = append(head, b[0])
		}
		if n := len(head); n > 1 && head[n-1] == ' ' && httpMethods[string(head[:n-1])] {
			stop()
			return 0, "", io.MultiReader(bytes.NewReader(head), prefix, client), nil
		}
	}
	if first[0] == recordHandshake {
		raw, hello, err := readClientHello(io.MultiReader(bytes.NewReader(first[:]), in))
		refused := ""
		switch {
		case err != nil:
			refused = "in the tunnel: not a TLS ClientHello: " + err.Error()
		case hello.ech:
			refused = "in the tunnel: encrypted ClientHello (ECH): the proxy cannot see the name"
		case hello.serverName != "":
			if sni, _ := normalizeName(hello.serverName); sni != name {
				refused = "in the tunnel: SNI " + strconv.Quote(hello.serverName) + " is not " + name
			}
		}
		if refused != "" {
			client.Write(tlsAlert(alertAccessDenied))
			client.Close()
			up.Close()
			return 0, refused, nil, nil
		}
		head = raw
	}
	n, err := up.Write(head)
	sent := int64(n)
	if err == nil {
		// What the client sent along with its first bytes, then the
		// socket itself (spliced).
		var m int64
		if m, err = io.Copy(up, prefix); err == nil {
			sent += m
			m, err = ip.copy(up, client, 0)
		}
		sent += m
	}
	if err != nil {
		client.Close()
		up.Close()
	} else {
		closeWrite(up)
	}
	return sent, "", nil, err
}

// pipe copies both ways until both are done, half-closing each side when
// the other has finished, and returns the bytes each way, and errIdle when
// it ended a tunnel that carried nothing either way for the idle timeout.
// Between two TCP sockets the copy is spliced in the kernel.
func pipe(client net.Conn, pre []byte, up net.Conn, idle time.Duration) (sent, recv int64, err error) {
	if len(pre) > 0 {
		n, err := up.Write(pre)
		sent += int64(n)
		if err != nil {
			return sent, 0, nil
		}
	}
	ip := &idlePair{idle: idle}
	var wg sync.WaitGroup
	var up2 int64
	var upErr error
	wg.Go(func() {
		n, err := ip.copy(up, client, 0)
		up2, upErr = n, err
		if err != nil {
			client.Close()
			up.Close()
			return
		}
		closeWrite(up)
	})
	n, downErr := ip.copy(client, up, 1)
	if downErr != nil {
		client.Close()
		up.Close()
	} else {
		closeWrite(client)
	}
	wg.Wait()
	return sent + up2, n, idleErr(upErr, downErr)
}

// idleErr is errIdle, said for the log, if either way ended so.
func idleErr(errs ...error) error {
	for _, err := range errs {
		if errors.Is(err, errIdle) {
			return fmt.Errorf("closed: idle (nothing either way) for the idle timeout")
		}
	}
	return nil
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// parseHostPort reads "host:port", "host" (with def as the port), or a
// bracketed IPv6 address, into a normalized name or an address.
func parseHostPort(hp string, def uint16) (string, netip.Addr, uint16, error) {
	host, portStr, err := net.SplitHostPort(hp)
	port := def
	if err != nil {
		if def == 0 {
			return "", netip.Addr{}, 0, fmt.Errorf("%q: want host:port", hp)
		}
		host = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]")
	} else {
		n, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || n == 0 {
			return "", netip.Addr{}, 0, fmt.Errorf("%q: the port must be 1 to 65535", hp)
		}
		port = uint16(n)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", netip.Addr{}, 0, fmt.Errorf("%q: an address with a zone", hp)
		}
		return "", a.Unmap(), port, nil
	}
	name, reason := normalizeName(host)
	if reason != "" {
		return "", netip.Addr{}, 0, fmt.Errorf("%q: %s", host, reason)
	}
	return name, netip.Addr{}, port, nil
}

// hop-by-hop headers (RFC 9110 7.6.1), which a proxy does not forward.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func isUpgrade(h http.Header) bool {
	for _, v := range h.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// removeHopHeaders drops the hop-by-hop headers and those Connection
// names; keepUpgrade keeps what a protocol switch needs.
func removeHopHeaders(h http.Header, keepUpgrade bool) {
	for _, v := range h.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" && !(keepUpgrade && strings.EqualFold(t, "upgrade")) {
				h.Del(t)
			}
		}
	}
	for _, k := range hopByHop {
		if keepUpgrade && (k == "Connection" || k == "Upgrade") {
			continue
		}
		h.Del(k)
	}
	if keepUpgrade {
		h.Set("Connection", "Upgrade")
	}
}

// writeStatus answers with a short text, and closes the conversation.
func writeStatus(w io.Writer, code int, msg string, extra http.Header) {
	body := "delegate egress: " + msg + "\n"
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	extra.Write(&b)
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	w.Write(b.Bytes())
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// prefixConn is a connection some of whose first bytes were already read.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }
