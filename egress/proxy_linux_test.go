//go:build linux

package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testnet"
)

// A client that uses the proxy variables (curl here; pip, git and npm do
// the same CONNECT and absolute-URI requests) reaches the names of its
// allowlist over HTTP and HTTPS, and nothing else: not another name, not a
// raw address, and not an allowed name whose address is metadata, private,
// or the host's own.
func TestProxyVariablesAllowlist(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-allowlist"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t,
		"allowed.test", "*.sub.test", "metadata.test", "private.test", "host.test", "denied.test:8443")})
	env := f.proxyEnv(tok)
	tests := []struct {
		url     string
		ok      bool
		site    string // the site the request must (ok) or must not reach
		via     Via
		name    string
		rule    string // a part of the log entry's rule
		curlErr string // a part of curl's error, when denied
	}{
		{"http://allowed.test/", true, "allowed", ViaHTTP, "allowed.test", "allow allowed.test", ""},
		{"https://allowed.test/", true, "allowed", ViaConnect, "allowed.test", "allow allowed.test", ""},
		{"https://files.sub.test/", true, "allowed", ViaConnect, "files.sub.test", "allow *.sub.test", ""},
		{"https://deep.files.sub.test/", true, "allowed", ViaConnect, "deep.files.sub.test", "allow *.sub.test", ""},
		{"https://denied.test/", false, "denied", ViaConnect, "denied.test", "not in allowlist", "403"},
		{"http://denied.test/", false, "denied", ViaHTTP, "denied.test", "not in allowlist", ""},
		{"http://203.0.113.10/", false, "allowed", ViaHTTP, "", "raw address", ""},
		{"https://203.0.113.10/", false, "allowed", ViaConnect, "", "raw address", "403"},
		{"http://metadata.test/", false, "metadata", ViaHTTP, "metadata.test", "link-local 169.254.0.0/16 (cloud metadata)", ""},
		{"http://169.254.169.254/", false, "metadata", ViaHTTP, "", "raw address", ""},
		{"http://private.test/", false, "private", ViaHTTP, "private.test", "private range 10.0.0.0/8", ""},
		{"http://host.test:8081/", false, "host", ViaHTTP, "host.test", "host address 203.0.113.1", ""},
		{"http://nowhere.test/", false, "", ViaHTTP, "nowhere.test", "not in allowlist", ""},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			f.w.Sites["allowed"].Reset()
			before := 0
			if tt.site != "" {
				f.w.Sites[tt.site].Reset()
				before = f.w.Sites[tt.site].Hits()
			}
			res := f.curl(t, "", env, "-i", tt.url)
			if tt.ok {
				if res.code != 0 || !strings.Contains(res.out, "hello from "+tt.site) {
					t.Fatalf("curl %s: %v\nlog:\n%s", tt.url, res, f.dump(tok))
				}
			} else {
				if strings.Contains(res.out, "hello from") {
					t.Fatalf("curl %s got through: %v", tt.url, res)
				}
				if tt.curlErr != "" && !strings.Contains(res.err, tt.curlErr) {
					t.Errorf("curl %s: %v, want %q in its error", tt.url, res, tt.curlErr)
				}
				if tt.via == ViaHTTP && !strings.Contains(res.out, "403 Forbidden") {
					t.Errorf("curl %s: %v, want a 403", tt.url, res)
				}
				if tt.site != "" && f.w.Sites[tt.site].Hits() != before {
					t.Errorf("%s reached the %s site: %+v", tt.url, tt.site, f.w.Sites[tt.site].Requests())
				}
			}
			e := f.entry(t, tok, tt.url, func(e Entry) bool {
				return e.Via == tt.via && e.Name == tt.name && e.Allowed == tt.ok && strings.Contains(e.Rule, tt.rule)
			})
			if tt.ok && (e.Sent == 0 || e.Received == 0 || !e.Addr.IsValid() || e.Port == 0) {
				t.Errorf("entry %+v lacks bytes, address or port", e)
			}
		})
	}
	// An allowed name's DNS query reached the test DNS; a denied one's
	// never left the proxy.
	if !f.w.DNS.Asked("allowed.test") || f.w.DNS.Asked("denied.test") || f.w.DNS.Asked("nowhere.test") {
		t.Errorf("the test DNS saw: %v", f.w.DNS.Queries())
	}
}

// A job must name itself: no token, or an unknown one, gets 407.
func TestProxyAuthentication(t *testing.T) {
	f := newFixture(t, nil)
	f.jobs.set("known", Policy{Mode: Egress})
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"no token", []string{"http_proxy=http://" + f.proxy}},
		{"unknown token", []string{"http_proxy=http://job:nope@" + f.proxy}},
	} {
		res := f.curl(t, "", tc.env, "-i", "http://allowed.test/")
		if !strings.Contains(res.out, "407") || f.w.Sites["allowed"].Hits() != 0 {
			t.Errorf("%s: %v", tc.name, res)
		}
	}
	if res := f.curl(t, "", []string{"http_proxy=http://job:known@" + f.proxy}, "http://allowed.test/"); res.code != 0 {
		t.Errorf("known token: %v", res)
	}
	// Bearer works too, for clients that can set a header.
	if res := f.curl(t, "", nil, "-x", "http://"+f.proxy, "--proxy-header", "Proxy-Authorization: Bearer known", "http://allowed.test/"); res.code != 0 {
		t.Errorf("bearer: %v", res)
	}
}

// Egress allows every name and public address, and still none of the
// always-denied ranges; the callback address alone of the host's.
func TestProxyVariablesEgress(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-egress"
	f.jobs.set(tok, Policy{Mode: Egress})
	env := f.proxyEnv(tok)
	tests := []struct {
		url  string
		ok   bool
		site string
		rule string
	}{
		{"http://denied.test/", true, "denied", "egress"},
		{"https://denied.test/", true, "denied", "egress"},
		{"http://203.0.113.11/", true, "denied", "egress"},
		{"http://127.0.0.1:8082/", true, "host", "callback 127.0.0.1:8082"},
		{"http://169.254.169.254/", false, "metadata", "link-local 169.254.0.0/16 (cloud metadata)"},
		{"http://metadata.test/", false, "metadata", "link-local 169.254.0.0/16 (cloud metadata)"},
		{"http://[fd00:ec2::254]/", false, "metadata", "cloud metadata fd00:ec2::254"},
		{"http://[::ffff:169.254.169.254]/", false, "metadata", "link-local 169.254.0.0/16"},
		{"http://10.99.0.10/", false, "private", "private range 10.0.0.0/8"},
		{"http://203.0.113.1:8081/", false, "host", "host address 203.0.113.1"},
		{"http://[2001:db8:1::1]:8081/", false, "host", "host address 2001:db8:1::1"},
		{"http://127.0.0.1:8081/", false, "host", "loopback"},
		{"http://[::1]:8082/", false, "host", "loopback"},
		{"http://0.0.0.0:8082/", false, "host", "unspecified"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			s := f.w.Sites[tt.site]
			s.Reset()
			res := f.curl(t, "", env, "-i", tt.url)
			got := res.code == 0 && strings.Contains(res.out, "hello from "+tt.site)
			if got != tt.ok {
				t.Fatalf("curl %s: %v", tt.url, res)
			}
			if !tt.ok && s.Hits() != 0 {
				t.Errorf("%s reached %s", tt.url, tt.site)
			}
			f.entry(t, tok, tt.url, func(e Entry) bool { return e.Allowed == tt.ok && strings.Contains(e.Rule, tt.rule) })
		})
	}
}

// The operator may open the private ranges; metadata and the host stay
// closed.
func TestProxyAllowPrivate(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.AllowPrivate = true })
	const tok = "job-private"
	f.jobs.set(tok, Policy{Mode: Egress})
	env := f.proxyEnv(tok)
	if res := f.curl(t, "", env, "http://private.test/"); !strings.Contains(res.out, "hello from private") {
		t.Errorf("private.test with AllowPrivate: %v", res)
	}
	for _, u := range []string{"http://metadata.test/", "http://[fd00:ec2::254]/", "http://203.0.113.1:8081/"} {
		if res := f.curl(t, "", env, u); strings.Contains(res.out, "hello") {
			t.Errorf("%s with AllowPrivate: %v", u, res)
		}
	}
	f2 := newFixture(t, func(c *Config) { c.Allow = []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")} })
	f2.jobs.set(tok, Policy{Mode: Egress})
	if res := f2.curl(t, "", f2.proxyEnv(tok), "http://169.254.169.254/"); !strings.Contains(res.out, "hello from metadata") {
		t.Errorf("metadata allowed by the operator: %v", res)
	}
}

// A sandbox wired as the local backend will wire it: clients that ignore
// the proxy variables are caught by the transparent listeners and the
// sandbox's resolver; nothing else leaves, by TCP, UDP or DNS.
func TestSandboxAllowlist(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-sandbox"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test", "metadata.test", "rebind.test")})
	sb := newSandbox(t, f.p, tok)
	allowed, denied, meta := f.w.Sites["allowed"], f.w.Sites["denied"], f.w.Sites["metadata"]

	tests := []struct {
		name    string
		args    []string
		env     []string
		code    int    // curl's exit code
		out     string // in its output
		entry   func(Entry) bool
		notSite *testnet.Site
	}{
		{name: "http by name", args: []string{"http://allowed.test/"}, out: "hello from allowed",
			entry: named(ViaTransparentH, "allowed.test", true)},
		{name: "https by name", args: []string{"https://allowed.test/"}, out: "hello from allowed",
			entry: named(ViaTransparent, "allowed.test", true)},
		{name: "proxy variables", args: []string{"https://allowed.test/"}, out: "hello from allowed",
			env:   []string{"https_proxy=" + sandboxProxyURL},
			entry: named(ViaConnect, "allowed.test", true)},
		{name: "denied name: no address", args: []string{"https://denied.test/"}, code: 6,
			entry: func(e Entry) bool { return e.Via == ViaDNS && e.Name == "denied.test" && e.QType == "A" && !e.Allowed }, notSite: denied},
		{name: "denied name with its address: SNI", args: []string{"--resolve", "denied.test:443:203.0.113.11", "https://denied.test/"}, code: 35,
			entry: named(ViaTransparent, "denied.test", false), notSite: denied},
		{name: "denied name with its address: Host", args: []string{"--resolve", "denied.test:80:203.0.113.11", "-i", "http://denied.test/"}, out: "403 Forbidden",
			entry: named(ViaTransparentH, "denied.test", false), notSite: denied},
		// The proxy connects where it resolves the name, not where the
		// client's connection was going.
		{name: "an allowed name at another address", args: []string{"--resolve", "allowed.test:80:203.0.113.11", "http://allowed.test/"}, out: "hello from allowed",
			entry: func(e Entry) bool {
				return e.Via == ViaTransparentH && e.Name == "allowed.test" && e.Addr.String() == "203.0.113.10"
			}, notSite: denied},
		{name: "raw address over http", args: []string{"-i", "http://203.0.113.10/"}, out: "403 Forbidden",
			entry: func(e Entry) bool {
				return e.Via == ViaTransparentH && e.Rule == "raw address: an allowlist names hosts"
			}, notSite: allowed},
		{name: "raw address over https: no SNI", args: []string{"-k", "https://203.0.113.10/"}, code: 35,
			entry: func(e Entry) bool { return e.Via == ViaTransparent && strings.HasPrefix(e.Rule, "TLS without SNI") }, notSite: allowed},
		{name: "metadata by address", args: []string{"-i", "http://169.254.169.254/latest/meta-data/"}, out: "403 Forbidden",
			entry: func(e Entry) bool { return e.Via == ViaTransparentH && !e.Allowed }, notSite: meta},
		{name: "metadata by an allowed name: no address", args: []string{"http://metadata.test/"}, code: 6,
			entry: func(e Entry) bool {
				return e.Name == "metadata.test" && e.QType == "A" && strings.HasPrefix(e.Rule, "link-local")
			},
			notSite: meta},
		{name: "metadata by an allowed name and its address", args: []string{"--resolve", "metadata.test:80:169.254.169.254", "-i", "http://metadata.test/"}, out: "403 Forbidden",
			entry: func(e Entry) bool {
				return e.Via == ViaTransparentH && e.Name == "metadata.test" && strings.HasPrefix(e.Rule, "link-local")
			}, notSite: meta},
		// The name's DNS moves to the metadata address after the job's
		// lookup: the proxy connects where it told the job, which it
		// checked, not where the name points now.
		{name: "DNS rebinding", args: []string{"-i", "http://rebind.test/"}, out: "hello from allowed",
			entry: func(e Entry) bool {
				return e.Via == ViaTransparentH && e.Name == "rebind.test" && e.Allowed && e.Addr.String() == "203.0.113.10"
			}, notSite: meta},
		{name: "Host names another port: the real one counts", args: []string{"-H", "Host: allowed.test:2222", "http://allowed.test/"}, out: "hello from allowed",
			entry: func(e Entry) bool {
				return e.Via == ViaTransparentH && e.Name == "allowed.test" && e.Port == 80 && e.Allowed
			}},
		{name: "another port", args: []string{"http://203.0.113.10:2222/"}, code: 7, notSite: allowed},
		{name: "metadata, another port", args: []string{"http://169.254.169.254:2222/"}, code: 7, notSite: meta},
		{name: "the callback", args: []string{fmt.Sprintf("http://10.0.2.2:%d/", sandboxCallback)}, out: "hello from host",
			entry: func(e Entry) bool { return e.Via == ViaCallback && e.Allowed && e.Received > 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, s := range f.w.Sites {
				s.Reset()
			}
			f.w.DNS.Reset()
			res := f.curl(t, sb.ns, tt.env, tt.args...)
			if res.code != tt.code || !strings.Contains(res.out, tt.out) {
				t.Fatalf("curl %v: %v, want exit %d and %q\nlog:\n%s", tt.args, res, tt.code, tt.out, f.dump(tok))
			}
			if tt.entry != nil {
				f.entry(t, tok, tt.name, tt.entry)
			}
			if tt.notSite != nil && tt.notSite.Hits() != 0 {
				t.Errorf("reached %s: %+v", tt.notSite.Name, tt.notSite.Requests())
			}
		})
	}

	t.Run("UDP goes nowhere", func(t *testing.T) {
		for _, addr := range []string{testnet.MetaAddr + ":9999", "203.0.113.11:9999"} {
			c, err := dialIn(sb.ns, "udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("leak"))
			c.Close()
		}
		// A datagram dropped leaves no event to wait for: a while for
		// one to arrive, which none should.
		time.Sleep(300 * time.Millisecond)
		if meta.Hits()+denied.Hits() != 0 {
			t.Errorf("a datagram left the sandbox: %q %q", meta.Datagrams(), denied.Datagrams())
		}
	})

	t.Run("DNS answers only what is allowed", func(t *testing.T) {
		f.w.DNS.Reset()
		for _, tc := range []struct {
			net, server, name string
			qtype             uint16
			rcode             int
			answer            string
		}{
			// Whichever server the job asks, the sandbox's resolver answers:
			// the local backend's (10.0.2.3), the test DNS, another.
			{"udp", "10.0.2.3:53", "allowed.test.", dns.TypeA, dns.RcodeSuccess, "203.0.113.10"},
			{"udp", testnet.DNSServer, "allowed.test.", dns.TypeA, dns.RcodeSuccess, "203.0.113.10"},
			{"udp", "8.8.8.8:53", "allowed.test.", dns.TypeAAAA, dns.RcodeSuccess, "2001:db8:1::10"},
			{"tcp", testnet.DNSServer, "allowed.test.", dns.TypeA, dns.RcodeSuccess, "203.0.113.10"},
			{"udp", testnet.DNSServer, "allowed.test.", dns.TypeTXT, dns.RcodeSuccess, ""},
			{"udp", testnet.DNSServer, "allowed.test.", dns.TypeHTTPS, dns.RcodeSuccess, ""},
			{"udp", testnet.DNSServer, "denied.test.", dns.TypeA, dns.RcodeNameError, ""},
			{"tcp", testnet.DNSServer, "denied.test.", dns.TypeA, dns.RcodeNameError, ""},
			{"udp", testnet.DNSServer, "metadata.test.", dns.TypeA, dns.RcodeNameError, ""},
		} {
			c, err := dialIn(sb.ns, tc.net, tc.server)
			if err != nil {
				t.Fatal(err)
			}
			co := &dns.Conn{Conn: c}
			q := new(dns.Msg)
			q.SetQuestion(tc.name, tc.qtype)
			co.SetDeadline(time.Now().Add(3 * time.Second))
			if err := co.WriteMsg(q); err != nil {
				t.Fatal(err)
			}
			r, err := co.ReadMsg()
			c.Close()
			if err != nil {
				t.Fatalf("%s %s over %s: %v", tc.name, dns.TypeToString[tc.qtype], tc.net, err)
			}
			got := ""
			for _, rr := range r.Answer {
				switch a := rr.(type) {
				case *dns.A:
					got = a.A.String()
				case *dns.AAAA:
					got = a.AAAA.String()
				}
			}
			if r.Rcode != tc.rcode || got != tc.answer || (tc.answer == "" && len(r.Answer) != 0) {
				t.Errorf("%s %s over %s to %s: rcode %s, answer %v", tc.name, dns.TypeToString[tc.qtype], tc.net, tc.server, dns.RcodeToString[r.Rcode], r.Answer)
			}
		}
		if f.w.DNS.Asked("denied.test") {
			t.Error("a query for a denied name reached the real DNS")
		}
		f.entry(t, tok, "the TXT query", func(e Entry) bool {
			return e.Via == ViaDNS && e.Name == "allowed.test" && e.QType == "TXT" && e.Allowed && strings.Contains(e.Rule, "no TXT records are served")
		})
	})

	// Not DNS, on the DNS port: dropped (no answer, nothing forwarded).
	t.Run("garbage on port 53", func(t *testing.T) {
		c, err := dialIn(sb.ns, "udp", testnet.DNSServer)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("\x00\x01\x80\x00not a query at all"))
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(make([]byte, 512)); err == nil {
			t.Errorf("an answer of %d bytes to a DNS response", n)
		}
	})
}

// A job with no network gets nothing, not even the callback or DNS.
func TestSandboxNone(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-none"
	f.jobs.set(tok, Policy{Mode: None})
	sb := newSandbox(t, f.p, tok)
	for _, args := range [][]string{
		{"http://allowed.test/"},
		{"--resolve", "allowed.test:443:203.0.113.10", "https://allowed.test/"},
		{"-x", sandboxProxyURL, "http://allowed.test/"},
		{fmt.Sprintf("http://10.0.2.2:%d/", sandboxCallback)},
	} {
		if res := f.curl(t, sb.ns, nil, args...); strings.Contains(res.out, "hello") {
			t.Errorf("curl %v: %v", args, res)
		}
	}
	f.entry(t, tok, "the callback refused", func(e Entry) bool { return e.Via == ViaCallback && !e.Allowed && e.Rule == "network none" })
	if f.w.Sites["allowed"].Hits()+f.w.Sites["host"].Hits() != 0 || f.w.DNS.Asked("allowed.test") {
		t.Error("a job with no network reached something")
	}
}

// Plain HTTP through the proxy: request bodies (sized and chunked),
// chunked responses, HEAD, and several requests, to one host and to two,
// on one client connection; each upstream connection is one log entry.
func TestPlainHTTPRelay(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-plain"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test", "denied.test")})
	env := f.proxyEnv(tok)
	body := strings.Repeat("x", 100000)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"sized body", []string{"--data-binary", body, "http://allowed.test/echo"}, "allowed got 100000 bytes"},
		{"chunked body", []string{"-H", "Transfer-Encoding: chunked", "--data-binary", body, "http://allowed.test/echo"}, "allowed got 100000 bytes"},
		{"expect 100-continue", []string{"-H", "Expect: 100-continue", "--data-binary", body, "http://allowed.test/echo"}, "allowed got 100000 bytes"},
		{"chunked response", []string{"http://allowed.test/stream"}, "part 0 of allowed\npart 1 of allowed\npart 2 of allowed\n"},
		{"HEAD", []string{"-I", "http://allowed.test/"}, "200 OK"},
		{"two requests, one host", []string{"http://allowed.test/a", "http://allowed.test/b"}, "hello from allowed\nhello from allowed\n"},
		{"two hosts", []string{"http://allowed.test/", "http://denied.test/", "http://allowed.test/"}, "hello from allowed\nhello from denied\nhello from allowed\n"},
	} {
		res := f.curl(t, "", env, tc.args...)
		if res.code != 0 || !strings.Contains(res.out, tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, res, tc.want)
		}
	}
	// The last curl: three requests on one connection, three upstream
	// connections (allowed, denied, allowed again), each logged.
	n := 0
	if !testkit.Poll(5*time.Second, func() bool {
		n = 0
		for _, e := range f.log.Entries(tok) {
			if e.Via == ViaHTTP && e.Allowed && e.Sent > 0 && e.Received > 0 {
				n++
			}
		}
		return n == 9
	}) {
		t.Fatalf("%d allowed upstream connections logged, want 9:\n%s", n, f.dump(tok))
	}
}
