//go:build linux

// Package testnet builds a small internet for the network tests of
// delegate's packages (test hosts have none): the test runs again in
// fresh network and mount namespaces (Isolate), so that nothing it adds —
// interfaces, routes, /etc/resolv.conf — touches the host or other tests;
// there a "sites" namespace, reached over a veth pair, holds test web
// sites (HTTP and HTTPS with a test CA, and one whose certificate no one
// trusts), raw TCP and UDP sinks, a fake cloud metadata service at
// 169.254.169.254, a private address, and a test DNS server that answers
// for names like allowed.test and denied.test, and for rebind.test first
// with a public address and then with the metadata one (World). It serves
// the egress proxy's own tests (the whole binary in one pair of
// namespaces: Main) and those of the packages that wire the proxy (local,
// engine, e2e: a process a test, Isolate).
package testnet

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The test internet's addresses: documentation ranges (public as far as a
// proxy can tell), except the private and metadata sites.
const (
	SitesNS   = "tnsites"
	HostAddr  = "203.0.113.1" // this side of the veth: an address of the host's
	Host6     = "2001:db8:1::1"
	DNSServer = "203.0.113.53:53"
	MetaAddr  = "169.254.169.254"
	Meta6     = "fd00:ec2::254"
	// Allowed, Denied and Inject are the addresses of allowed.test,
	// denied.test and inject.test; Private is private.test's (10/8).
	Allowed = "203.0.113.10"
	Denied  = "203.0.113.11"
	Inject  = "203.0.113.12"
	Private = "10.99.0.10"
	// BadCert is badcert.test's: its HTTPS certificate is signed by a CA
	// that is not in the test's roots.
	BadCert = "203.0.113.13"
)

// isolatedEnv marks a test binary running one test in its own namespaces.
const isolatedEnv = "DELEGATE_TESTNET_ISOLATED"

// Isolate runs the calling test again, alone, in a new process in fresh
// network and mount namespaces, and returns false in the calling process
// (which has nothing more to do: the test's result is the other
// process's); in that process it returns true. Without root it skips.
//
//	func TestX(t *testing.T) {
//		if !testnet.Isolate(t) {
//			return
//		}
//		w := testnet.World(t)
//		...
func Isolate(t *testing.T) bool {
	t.Helper()
	if os.Getenv(isolatedEnv) != "" {
		if !underMain {
			t.Cleanup(removeWorld) // this process is this test's alone
		}
		return true
	}
	if why := cannotIsolate(); why != "" {
		t.Skip(why)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run", "^" + regexpQuote(t.Name()) + "$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout", time.Until(d).Round(time.Second).String())
	}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.bench") || strings.HasPrefix(a, "-test.benchtime") || strings.HasPrefix(a, "-test.benchmem") {
			args = append(args, a)
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	err = runHeld(cmd)
	text := out.String()
	t.Log("isolated run:\n" + indent(text))
	if strings.Contains(text, "--- SKIP: "+t.Name()) && err == nil {
		t.Skip("skipped in its namespaces")
	}
	if err != nil || !strings.Contains(text, "--- PASS: "+t.Name()) {
		t.Fatalf("the isolated run failed (%v)", err)
	}
	return false
}

// cannotIsolate says why the tests cannot have namespaces of their own
// here, or "".
func cannotIsolate() string {
	if os.Geteuid() != 0 {
		return "the network tests need root (network namespaces, veth pairs)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the network tests need ip (iproute2)"
	}
	return ""
}

// underMain says that this process runs all the package's tests (Main),
// not one (Isolate): the world is removed when they all have run.
var underMain bool

// removeWorld removes the world's files, once the process is done with
// them.
func removeWorld() {
	if theWorld != nil {
		os.RemoveAll(theWorld.Dir)
	}
}

// notIsolated is why Main ran the tests outside namespaces of their own:
// World skips the tests that need it.
var notIsolated string

// Main runs the package's tests, all of them, in one new process in fresh
// network and mount namespaces, and returns its exit code: for a package
// whose tests nearly all need the test internet (egress), one process and
// one World for all instead of one a test (Isolate). Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testnet.Main(m)) }
//
// Without root (or ip) the tests run here and World skips them.
func Main(m *testing.M) int {
	if os.Getenv(isolatedEnv) != "" {
		underMain = true
		code := m.Run()
		removeWorld()
		return code
	}
	if notIsolated = cannotIsolate(); notIsolated != "" {
		return m.Run()
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testnet:", err)
		return 2
	}
	// World mounts a tmpfs of its own on /run/netns (where ip netns keeps
	// its names); a directory made for that is removed after.
	_, statErr := os.Stat("/run/netns")
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	code := 0
	if err := runHeld(cmd); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			fmt.Fprintln(os.Stderr, "testnet: running the tests in new namespaces:", err)
			return 2
		}
		code = ee.ExitCode()
	}
	if statErr != nil {
		os.Remove("/run/netns")
	}
	return code
}

// IsolatedBench is Isolate for a benchmark: the benchmark runs in its own
// namespaces and its figures are printed.
func IsolatedBench(b *testing.B) bool {
	b.Helper()
	if os.Getenv(isolatedEnv) != "" {
		if !underMain {
			b.Cleanup(removeWorld)
		}
		return true
	}
	if os.Geteuid() != 0 {
		b.Skip("the network benchmarks need root")
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	args := []string{"-test.run", "^$", "-test.bench", "^" + regexpQuote(b.Name()) + "$", "-test.benchmem"}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.benchtime") || strings.HasPrefix(a, "-test.count") {
			args = append(args, a)
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := runHeld(cmd); err != nil {
		b.Fatalf("the isolated run failed: %v", err)
	}
	b.SkipNow() // its figures are the other process's
	return false
}

// runHeld runs cmd from a thread held until it ends. Its parent-death
// signal (SIGKILL) fires when the thread that forked it ends, not the
// process, and the Go runtime ends a thread whenever a goroutine locked
// to it returns, which package local does on purpose (a sandbox's
// network namespace is made on such a thread): a test binary that runs
// sandboxes could otherwise kill its own isolated run (pgtest had that
// flake: TestServerOutlivesItsStartersThread).
func runHeld(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cmd.Run()
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t")
}

// Site is one test web site: what reached it is recorded, so that a test
// can tell that a denied request never arrived.
type Site struct {
	Name   string
	mu     sync.Mutex
	reqs   []Request
	udp    []string
	tcp    int
	routes map[string]http.Handler // by path prefix
}

// Route serves the paths under prefix with h until the test ends.
func (s *Site) Route(t testing.TB, prefix string, h http.Handler) {
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

// Request is a request a site served.
type Request struct {
	Host, Path string
	Header     http.Header
	TLS        bool
}

func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs = append(s.reqs, Request{Host: r.Host, Path: r.URL.Path, Header: r.Header.Clone(), TLS: r.TLS != nil})
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
	switch r.URL.Path {
	case "/big":
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.Copy(w, io.LimitReader(zeros{}, n))
	case "/stream":
		// No length: chunked on the wire.
		for i := range 3 {
			fmt.Fprintf(w, "part %d of %s\n", i, s.Name)
			w.(http.Flusher).Flush()
		}
	case "/echo":
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s got %d bytes", s.Name, len(b))
	default:
		// Never the request's headers: an echo would hand an injected
		// credential back to the job.
		fmt.Fprintf(w, "hello from %s\n", s.Name)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// Requests returns the requests the site served.
func (s *Site) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Datagrams returns the datagrams its UDP port got.
func (s *Site) Datagrams() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.udp...)
}

// Hits counts what reached the site: requests, connections to its raw
// TCP port, datagrams to its UDP port.
func (s *Site) Hits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs) + len(s.udp) + s.tcp
}

// Reset forgets what reached the site.
func (s *Site) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs, s.udp, s.tcp = nil, nil, 0
}

// W is the test internet.
type W struct {
	Dir string
	// Roots holds the test CA, which signed every site's certificate;
	// RootsPEM is its file and RootsBytes its PEM.
	Roots      *x509.CertPool
	RootsPEM   string
	RootsBytes []byte
	Sites      map[string]*Site
	DNS        *DNS
	// Resolver asks the test DNS.
	Resolver *net.Resolver
}

var (
	worldOnce sync.Once
	theWorld  *W
	worldErr  error
)

// World returns the test internet, built once per (isolated) process:
// call it after Isolate. The process's /etc/resolv.conf names the test
// DNS, and SSL_CERT_FILE names the test CA, so that the programs it
// starts (a built delegate) resolve and trust as the world needs.
func World(t testing.TB) *W {
	t.Helper()
	if os.Getenv(isolatedEnv) == "" {
		if notIsolated != "" {
			t.Skip(notIsolated)
		}
		t.Fatal("testnet.World outside its namespaces: call testnet.Isolate (or Main) first")
	}
	worldOnce.Do(func() { theWorld, worldErr = build() })
	if worldErr != nil {
		t.Fatal(worldErr)
	}
	for _, s := range theWorld.Sites {
		s.Reset()
	}
	theWorld.DNS.Reset()
	return theWorld
}

// IP runs the ip command.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// InNetns runs fn on a thread that has entered the named network
// namespace: the sockets fn makes belong to it.
func InNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func build() (*W, error) {
	// Mounts made here stay here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("making mounts private: %w", err)
	}
	dir, err := os.MkdirTemp("", "testnet-")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		return nil, err
	}
	if err := unix.Mount("tmpfs", "/run/netns", "tmpfs", 0, "mode=0755"); err != nil {
		return nil, fmt.Errorf("a tmpfs on /run/netns: %w", err)
	}
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+strings.TrimSuffix(DNSServer, ":53")+"\noptions timeout:2 attempts:1\n"), 0o644); err != nil {
		return nil, err
	}
	if err := unix.Mount(rc, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("binding resolv.conf: %w", err)
	}
	cmds := [][]string{
		{"link", "set", "lo", "up"},
		{"netns", "add", SitesNS},
		{"link", "add", "veth-h", "type", "veth", "peer", "name", "veth-s", "netns", SitesNS},
		{"addr", "add", HostAddr + "/24", "dev", "veth-h"},
		{"addr", "add", Host6 + "/64", "dev", "veth-h", "nodad"},
		{"link", "set", "veth-h", "up"},
		{"-n", SitesNS, "link", "set", "lo", "up"},
		{"-n", SitesNS, "addr", "add", Allowed + "/24", "dev", "veth-s"},
		{"-n", SitesNS, "addr", "add", "2001:db8:1::10/64", "dev", "veth-s", "nodad"},
		{"-n", SitesNS, "link", "set", "veth-s", "up"},
		{"-n", SitesNS, "route", "add", "default", "via", HostAddr},
		{"-n", SitesNS, "addr", "add", MetaAddr + "/32", "dev", "lo"},
		{"-n", SitesNS, "addr", "add", Meta6 + "/128", "dev", "lo", "nodad"},
		{"-n", SitesNS, "addr", "add", Private + "/32", "dev", "lo"},
		{"route", "add", MetaAddr + "/32", "via", Allowed},
		{"route", "add", Private + "/32", "via", Allowed},
		{"-6", "route", "add", Meta6 + "/128", "via", "2001:db8:1::10"},
		// A default route, as a host on the internet has: what the proxy
		// must not reach is refused by its rules, not by a missing route.
		{"route", "add", "default", "via", Allowed},
	}
	for _, a := range []string{Denied, Inject, BadCert, "203.0.113.53"} {
		cmds = append(cmds, []string{"-n", SitesNS, "addr", "add", a + "/24", "dev", "veth-s"})
	}
	for _, args := range cmds {
		if err := IP(args...); err != nil {
			return nil, err
		}
	}
	w := &W{Dir: dir, Sites: map[string]*Site{}}
	ca, caKey, err := newCA("delegate test CA")
	if err != nil {
		return nil, err
	}
	w.Roots = x509.NewCertPool()
	w.Roots.AddCert(ca)
	w.RootsBytes = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	w.RootsPEM = filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(w.RootsPEM, w.RootsBytes, 0o644); err != nil {
		return nil, err
	}
	// The programs this process starts trust the test CA as their
	// system roots (Go reads SSL_CERT_FILE; so do curl and openssl).
	os.Setenv("SSL_CERT_FILE", w.RootsPEM)
	leaf, err := leafFor(ca, caKey, "allowed.test", "denied.test", "inject.test", "*.sub.test", "*.files.sub.test",
		"rebind.test", "metadata.test", "private.test", "host.test", "callback.test")
	if err != nil {
		return nil, err
	}
	// badcert.test's certificate, from a CA nobody trusts.
	other, otherKey, err := newCA("untrusted CA")
	if err != nil {
		return nil, err
	}
	bad, err := leafFor(other, otherKey, "badcert.test")
	if err != nil {
		return nil, err
	}
	serve := func(name, addr string, cert *tls.Certificate) error {
		s := w.Sites[name]
		if s == nil {
			s = &Site{Name: name}
			w.Sites[name] = s
		}
		var ln net.Listener
		var err error
		if strings.HasPrefix(addr, HostAddr+":") || strings.HasPrefix(addr, "127.") {
			ln, err = net.Listen("tcp", addr)
		} else {
			err = InNetns(SitesNS, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
		}
		if err != nil {
			return err
		}
		if cert != nil {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
		}
		go http.Serve(ln, s)
		return nil
	}
	for _, s := range []struct {
		name, addr string
		cert       *tls.Certificate
	}{
		{"allowed", Allowed + ":80", nil}, {"allowed", Allowed + ":443", leaf}, {"allowed", "[2001:db8:1::10]:80", nil},
		{"denied", Denied + ":80", nil}, {"denied", Denied + ":443", leaf},
		{"inject", Inject + ":80", nil}, {"inject", Inject + ":443", leaf},
		{"badcert", BadCert + ":443", bad},
		{"private", Private + ":80", nil},
		{"metadata", MetaAddr + ":80", nil}, {"metadata", "[" + Meta6 + "]:80", nil},
		{"host", HostAddr + ":8081", nil}, {"host", "127.0.0.1:8082", nil},
	} {
		if err := serve(s.name, s.addr, s.cert); err != nil {
			return nil, err
		}
	}
	// Raw TCP and UDP sinks: what gets there is recorded.
	for _, sink := range []struct{ name, addr string }{{"allowed", Allowed + ":2222"}, {"metadata", MetaAddr + ":2222"}} {
		s := w.Sites[sink.name]
		var ln net.Listener
		if err := InNetns(SitesNS, func() (err error) { ln, err = net.Listen("tcp", sink.addr); return err }); err != nil {
			return nil, err
		}
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
	for _, sink := range []struct{ name, addr string }{{"denied", Denied + ":9999"}, {"metadata", MetaAddr + ":9999"}} {
		s := w.Sites[sink.name]
		var pc net.PacketConn
		if err := InNetns(SitesNS, func() (err error) { pc, err = net.ListenPacket("udp", sink.addr); return err }); err != nil {
			return nil, err
		}
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
	w.DNS = &DNS{}
	var pc net.PacketConn
	if err := InNetns(SitesNS, func() (err error) { pc, err = net.ListenPacket("udp", DNSServer); return err }); err != nil {
		return nil, err
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: w.DNS, NotifyStartedFunc: func() { close(started) }}
	go srv.ActivateAndServe()
	<-started
	w.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, DNSServer)
	}}
	return w, nil
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return c, key, err
}

func leafFor(ca *x509.Certificate, caKey *ecdsa.PrivateKey, names ...string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// DNS is the test internet's name server.
type DNS struct {
	mu      sync.Mutex
	queries []string
	rebinds int // A queries for rebind.test answered
}

var zone = map[string][]string{
	"allowed.test.":        {Allowed, "2001:db8:1::10"},
	"denied.test.":         {Denied},
	"inject.test.":         {Inject},
	"badcert.test.":        {BadCert},
	"private.test.":        {Private},
	"metadata.test.":       {MetaAddr},
	"host.test.":           {HostAddr},
	"files.sub.test.":      {Allowed},
	"pypi.sub.test.":       {Allowed},
	"git.sub.test.":        {Allowed},
	"deep.more.sub.test.":  {Allowed},
	"deep.files.sub.test.": {Allowed},
}

// ServeDNS implements dns.Handler.
func (d *DNS) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	qs := q.Question[0]
	d.mu.Lock()
	d.queries = append(d.queries, strings.ToLower(qs.Name)+" "+dns.TypeToString[qs.Qtype])
	addrs, ok := zone[strings.ToLower(qs.Name)]
	if strings.EqualFold(qs.Name, "rebind.test.") {
		// DNS rebinding: the first A answer is public, the later ones
		// the metadata address.
		ok, addrs = true, []string{MetaAddr}
		if qs.Qtype == dns.TypeA {
			if d.rebinds == 0 {
				addrs = []string{Allowed}
			}
			d.rebinds++
		}
	}
	d.mu.Unlock()
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
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
		m.Ns = append(m.Ns, &dns.SOA{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET},
			Ns: "ns.test.", Mbox: "root.test.", Serial: 1, Refresh: 60, Retry: 60, Expire: 60})
	}
	w.WriteMsg(m)
}

// Reset forgets the queries (and rebinds rebind.test anew).
func (d *DNS) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queries, d.rebinds = nil, 0
}

// Queries returns the queries that reached the test DNS, "name. TYPE".
func (d *DNS) Queries() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.queries...)
}

// Asked says whether a query for name reached the test DNS.
func (d *DNS) Asked(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range d.queries {
		if strings.HasPrefix(q, strings.TrimSuffix(name, ".")+". ") {
			return true
		}
	}
	return false
}

// ErrNotIsolated is what the helpers say outside Isolate's namespaces.
var ErrNotIsolated = errors.New("not in the test's own namespaces")
