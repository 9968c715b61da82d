//go:build linux

package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The test internet. Addresses are from the documentation ranges (public
// as far as the proxy can tell), except the private and metadata sites.
const (
	sitesNS   = "egsites"
	hostAddr  = "203.0.113.1" // the proxy's side of the veth: a host address
	host6     = "2001:db8:1::1"
	dnsServer = "203.0.113.53:53"
	metaAddr  = "169.254.169.254"
	meta6     = "fd00:ec2::254"
)

// site is one test web site: what reached it is recorded, so a test can
// tell that a denied request never arrived.
type site struct {
	name   string
	mu     sync.Mutex
	reqs   []siteReq
	udp    []string
	tcp    int                     // connections to its raw TCP port
	routes map[string]http.Handler // by path prefix, set by a test
}

// route serves the paths under prefix with h until the test ends.
func (s *site) route(t testing.TB, prefix string, h http.Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.routes == nil {
		s.routes = map[string]http.Handler{}
	}
	s.routes[prefix] = h
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.routes, prefix)
	})
}

type siteReq struct {
	host, path string
	header     http.Header
	tls        bool
}

func (s *site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs = append(s.reqs, siteReq{host: r.Host, path: r.URL.Path, header: r.Header.Clone(), tls: r.TLS != nil})
	var h http.Handler
	for prefix, rh := range s.routes {
		if strings.HasPrefix(r.URL.Path, prefix) {
			h = rh
		}
	}
	s.mu.Unlock()
	if h != nil {
		h.ServeHTTP(w, r)
		return
	}
	switch {
	case r.URL.Path == "/big":
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.Copy(w, io.LimitReader(zeros{}, n))
	case r.URL.Path == "/stream":
		// No length: chunked on the wire.
		for i := range 3 {
			fmt.Fprintf(w, "part %d of %s\n", i, s.name)
			w.(http.Flusher).Flush()
		}
	case r.URL.Path == "/echo":
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s got %d bytes", s.name, len(b))
	default:
		// Never the request's headers: an echo would hand an injected
		// credential back to the job (see doc.go's limits).
		fmt.Fprintf(w, "hello from %s\n", s.name)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

func (s *site) requests() []siteReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]siteReq(nil), s.reqs...)
}

func (s *site) hits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs) + len(s.udp) + s.tcp
}

func (s *site) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs, s.udp, s.tcp = nil, nil, 0
}

// world is the test internet, built once per test binary.
type world struct {
	dir      string
	roots    *x509.CertPool // the test CA: the "system roots" of the test
	rootsPEM string         // its file
	sites    map[string]*site
	dns      *testDNS
	resolver *net.Resolver
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func getWorld(t testing.TB) *world {
	t.Helper()
	if netnsErr != nil {
		t.Skip(netnsErr)
	}
	worldOnce.Do(func() { theWorld, worldErr = buildWorld() })
	if worldErr != nil {
		t.Fatal(worldErr)
	}
	for _, s := range theWorld.sites {
		s.reset()
	}
	theWorld.dns.reset()
	return theWorld
}

// fatalT turns t.Fatal into an error, for building the world once.
type fatalT struct {
	testing.TB
	err error
}

func buildWorld() (w *world, err error) {
	dir, err := os.MkdirTemp("", "egress-world-")
	if err != nil {
		return nil, err
	}
	tempDirs = append(tempDirs, dir)
	for _, args := range [][]string{
		{"netns", "add", sitesNS},
		{"link", "add", "veth-h", "type", "veth", "peer", "name", "veth-s", "netns", sitesNS},
		{"addr", "add", hostAddr + "/24", "dev", "veth-h"},
		{"addr", "add", host6 + "/64", "dev", "veth-h", "nodad"},
		{"link", "set", "veth-h", "up"},
		{"-n", sitesNS, "link", "set", "lo", "up"},
		{"-n", sitesNS, "addr", "add", "203.0.113.10/24", "dev", "veth-s"},
		{"-n", sitesNS, "addr", "add", "2001:db8:1::10/64", "dev", "veth-s", "nodad"},
		{"-n", sitesNS, "link", "set", "veth-s", "up"},
		{"-n", sitesNS, "route", "add", "default", "via", hostAddr},
		{"-n", sitesNS, "addr", "add", metaAddr + "/32", "dev", "lo"},
		{"-n", sitesNS, "addr", "add", meta6 + "/128", "dev", "lo", "nodad"},
		{"-n", sitesNS, "addr", "add", "10.99.0.10/32", "dev", "lo"},
		{"route", "add", metaAddr + "/32", "via", "203.0.113.10"},
		{"route", "add", "10.99.0.10/32", "via", "203.0.113.10"},
		{"-6", "route", "add", meta6 + "/128", "via", "2001:db8:1::10"},
	} {
		if err := ipCmd(args...); err != nil {
			return nil, err
		}
	}
	for _, a := range []string{"203.0.113.11", "203.0.113.12", "203.0.113.13", "203.0.113.53"} {
		if err := ipCmd("-n", sitesNS, "addr", "add", a+"/24", "dev", "veth-s"); err != nil {
			return nil, err
		}
	}
	w = &world{dir: dir, sites: map[string]*site{}}
	ft := &fatalT{}
	defer func() {
		if r := recover(); r != nil {
			if r != ft {
				panic(r)
			}
			err = ft.err
		}
	}()

	// The test CA, and a certificate for every site name from it; and one
	// from a CA nobody trusts, for badcert.test.
	ca, caKey := newTestCA(ft, "delegate egress test CA")
	other, otherKey := newTestCA(ft, "untrusted CA")
	w.roots = x509.NewCertPool()
	w.roots.AddCert(ca)
	w.rootsPEM = filepath.Join(dir, "roots.pem")
	must(ft, os.WriteFile(w.rootsPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644))
	good := leafFor(ft, ca, caKey, "allowed.test", "denied.test", "inject.test", "*.sub.test", "*.files.sub.test", "rebind.test", "metadata.test", "private.test", "host.test", "callback.test")
	bad := leafFor(ft, other, otherKey, "badcert.test")

	serve := func(name, addr string, cert *tls.Certificate) *site {
		s := w.sites[name]
		if s == nil {
			s = &site{name: name}
			w.sites[name] = s
		}
		ns := sitesNS
		if strings.HasPrefix(addr, hostAddr+":") || strings.HasPrefix(addr, "127.") {
			ns = ""
		}
		var ln net.Listener
		var err error
		if ns == "" {
			ln, err = net.Listen("tcp", addr)
		} else {
			err = inNetns(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
		}
		must(ft, err)
		if cert != nil {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
		}
		go http.Serve(ln, s)
		return s
	}
	serve("allowed", "203.0.113.10:80", nil)
	serve("allowed", "203.0.113.10:443", good)
	serve("allowed", "[2001:db8:1::10]:80", nil)
	serve("denied", "203.0.113.11:80", nil)
	serve("denied", "203.0.113.11:443", good)
	serve("inject", "203.0.113.12:80", nil)
	serve("inject", "203.0.113.12:443", good)
	serve("badcert", "203.0.113.13:443", bad)
	serve("private", "10.99.0.10:80", nil)
	serve("metadata", metaAddr+":80", nil)
	serve("metadata", "["+meta6+"]:80", nil)
	serve("host", hostAddr+":8081", nil)
	serve("host", "127.0.0.1:8082", nil)

	// Raw TCP and UDP sinks: a connection or a datagram that gets there
	// is recorded.
	for _, sink := range []struct{ name, addr string }{
		{"allowed", "203.0.113.10:2222"}, {"metadata", metaAddr + ":2222"},
	} {
		s := w.sites[sink.name]
		var ln net.Listener
		must(ft, inNetns(sitesNS, func() (err error) { ln, err = net.Listen("tcp", sink.addr); return err }))
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.tcp++
				s.mu.Unlock()
				c.Close()
			}
		}()
	}
	for _, sink := range []struct{ name, addr string }{
		{"denied", "203.0.113.11:9999"}, {"metadata", metaAddr + ":9999"},
	} {
		s := w.sites[sink.name]
		var pc net.PacketConn
		must(ft, inNetns(sitesNS, func() (err error) { pc, err = net.ListenPacket("udp", sink.addr); return err }))
		go func() {
			buf := make([]byte, 2048)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.mu.Lock()
				s.udp = append(s.udp, string(buf[:n]))
				s.mu.Unlock()
			}
		}()
	}

	w.dns = &testDNS{}
	var pc net.PacketConn
	must(ft, inNetns(sitesNS, func() (err error) { pc, err = net.ListenPacket("udp", dnsServer); return err }))
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: w.dns, NotifyStartedFunc: func() { close(started) }}
	go srv.ActivateAndServe()
	<-started
	w.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, dnsServer)
	}}
	return w, nil
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatal(args ...any) {
	f.err = fmt.Errorf("building the test world: %s", fmt.Sprint(args...))
	panic(f)
}
func (f *fatalT) Fatalf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newTestCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	must(t, err)
	c, err := x509.ParseCertificate(der)
	must(t, err)
	return c, key
}

func leafFor(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names ...string) *tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	must(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// testDNS is the test internet's DNS: a few names, and one that answers
// a public address first and the metadata address afterwards (DNS
// rebinding).
type testDNS struct {
	mu      sync.Mutex
	queries []string
	rebinds int
}

var zone = map[string][]string{
	"allowed.test.":        {"203.0.113.10", "2001:db8:1::10"},
	"denied.test.":         {"203.0.113.11"},
	"inject.test.":         {"203.0.113.12"},
	"badcert.test.":        {"203.0.113.13"},
	"private.test.":        {"10.99.0.10"},
	"metadata.test.":       {metaAddr},
	"host.test.":           {hostAddr},
	"files.sub.test.":      {"203.0.113.10"},
	"deep.files.sub.test.": {"203.0.113.10"},
}

func (d *testDNS) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	qs := q.Question[0]
	d.mu.Lock()
	d.queries = append(d.queries, strings.ToLower(qs.Name)+" "+dns.TypeToString[qs.Qtype])
	addrs, ok := zone[strings.ToLower(qs.Name)]
	if strings.EqualFold(qs.Name, "rebind.test.") {
		ok = true
		addrs = []string{metaAddr}
		if qs.Qtype == dns.TypeA {
			if d.rebinds == 0 {
				addrs = []string{"203.0.113.10"}
			}
			d.rebinds++
		}
	}
	d.mu.Unlock()
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	// The zone's SOA says "no such record" (or name) with authority.
	soa := &dns.SOA{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 0},
		Ns: "ns.test.", Mbox: "root.test.", Serial: 1, Refresh: 60, Retry: 60, Expire: 60, Minttl: 0}
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		hdr := dns.RR_Header{Name: qs.Name, Class: dns.ClassINET, Ttl: 0}
		switch {
		case a.Is4() && qs.Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case a.Is6() && qs.Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = append(m.Ns, soa)
	}
	w.WriteMsg(m)
}

func (d *testDNS) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queries, d.rebinds = nil, 0
}

// asked says whether a query for name reached the test DNS.
func (d *testDNS) asked(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range d.queries {
		if strings.HasPrefix(q, name+". ") {
			return true
		}
	}
	return false
}
