package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

type onePolicy Policy

func (p onePolicy) Policy(context.Context, string) (Policy, error) { return Policy(p), nil }

// Whatever led to a dial, the address is checked once more as the socket
// connects: a listener on the host's loopback stays out of reach even when
// handed to the dialer directly.
func TestDialerChecksAtConnect(t *testing.T) {
	p, err := New(Config{Policies: onePolicy{Mode: Egress}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ap := netip.MustParseAddrPort(ln.Addr().String())
	for _, a := range []netip.AddrPort{ap, netip.MustParseAddrPort("169.254.169.254:80")} {
		c, _, err := p.out.dial(context.Background(), []netip.Addr{a.Addr()}, a.Port())
		var d *deniedError
		if err == nil || !errors.As(err, &d) {
			if c != nil {
				c.Close()
			}
			t.Errorf("dial %s: %v, want a denial", a, err)
		}
	}
}

func TestNewChecksConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Policies is required"},
		{Config{Policies: onePolicy{}, AskWait: -1}, "cannot be negative"},
		{Config{Policies: onePolicy{}, Allow: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/24")}}, "not a range"},
		{Config{Policies: onePolicy{}, Callback: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)}, "needs a port"},
	} {
		if _, err := New(tc.cfg); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	p, _ := New(Config{Policies: onePolicy{}})
	defer p.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	for name, serve := range map[string]func() error{
		"transparent": func() error { return p.ServeTransparent(context.Background(), ln, "") },
		"callback":    func() error { return p.ServeCallback(context.Background(), ln, "t") },
		"dns":         func() error { return p.ServeDNSStream(context.Background(), ln, "") },
	} {
		if err := serve(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

type addrPolicies struct {
	mu   sync.Mutex
	seen []netip.AddrPort
}

func (a *addrPolicies) Policy(ctx context.Context, _ string) (Policy, error) {
	ap, _ := ClientAddr(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, ap)
	return Policy{Mode: None}, nil
}

// The engine's policy lookup learns where the client is.
func TestClientAddr(t *testing.T) {
	pols := &addrPolicies{}
	p, err := New(Config{Policies: pols})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Serve(ctx, ln, "tok"); close(done) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("CONNECT x.test:443 HTTP/1.1\r\nHost: x.test:443\r\n\r\n"))
	c.Read(make([]byte, 512))
	pols.mu.Lock()
	defer pols.mu.Unlock()
	if want := netip.MustParseAddrPort(c.LocalAddr().String()); len(pols.seen) != 1 || pols.seen[0] != want {
		t.Errorf("ClientAddr = %v, want %v", pols.seen, want)
	}
}

type countingResolver struct {
	mu    sync.Mutex
	calls []string
}

func (r *countingResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, network+" "+host)
	all := []netip.Addr{netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("203.0.113.10")}
	switch network {
	case "ip4":
		return all[1:], nil
	case "ip6":
		return all[:1], nil
	}
	return all, nil
}

// A job's lookups are kept for the TTL its resolver gives, for that job
// only: the address it was told is the one it is connected to.
func TestResolveCache(t *testing.T) {
	r := &countingResolver{}
	p, err := New(Config{Policies: onePolicy{Mode: Egress}, Resolver: r})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	v4, _ := p.out.lookup(ctx, "a", "ip4", "x.test")  // the job's DNS query
	both, _ := p.out.lookup(ctx, "a", "ip", "x.test") // its connection
	if len(r.calls) != 1 || len(v4) != 1 || len(both) != 1 || both[0] != v4[0] {
		t.Errorf("after a query and a connection: calls %v, answered %v, connected to %v", r.calls, v4, both)
	}
	both, _ = p.out.lookup(ctx, "b", "ip", "x.test") // another job
	if len(r.calls) != 2 || len(both) != 2 || !both[0].Is4() {
		t.Errorf("another job: calls %v, addresses %v (IPv4 first)", r.calls, both)
	}
	p.out.lookup(ctx, "b", "ip6", "x.test")
	if len(r.calls) != 2 {
		t.Errorf("the connection's lookup was not kept for the job's queries: %v", r.calls)
	}
}
