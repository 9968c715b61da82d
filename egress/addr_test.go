package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestGuard(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")}
	base := Config{Callback: netip.MustParseAddrPort("192.0.2.2:8765")}
	tests := []struct {
		addr string
		port uint16
		cfg  func(*Config)
		want string // "" for allowed, else a part of the rule
	}{
		{"203.0.113.10", 443, nil, ""},
		{"2001:db8:1::10", 443, nil, ""},
		{"169.254.169.254", 80, nil, "link-local 169.254.0.0/16 (cloud metadata)"},
		{"::ffff:169.254.169.254", 80, nil, "link-local 169.254.0.0/16"},
		{"64:ff9b::a9fe:a9fe", 80, nil, "link-local 169.254.0.0/16 (cloud metadata) (through NAT64"},
		{"64:ff9b::cb00:710a", 80, nil, ""}, // 203.0.113.10 through NAT64
		{"fe80::1", 80, nil, "link-local fe80::/10"},
		{"fd00:ec2::254", 80, nil, "cloud metadata fd00:ec2::254"},
		{"fd00:ec2::254", 80, func(c *Config) { c.AllowPrivate = true }, "cloud metadata"},
		{"169.254.169.254", 80, func(c *Config) { c.AllowPrivate = true }, "link-local"},
		{"127.0.0.1", 80, nil, "loopback"},
		{"127.9.9.9", 80, nil, "loopback"},
		{"::1", 80, nil, "loopback"},
		{"0.0.0.0", 80, nil, "unspecified"},
		{"::", 80, nil, "unspecified"},
		{"0.1.2.3", 80, nil, "reserved range 0.0.0.0/8"},
		{"255.255.255.255", 80, nil, "reserved range 240.0.0.0/4"},
		{"224.0.0.1", 80, nil, "not unicast"},
		{"ff02::1", 80, nil, "not unicast"},
		{"192.0.2.2", 22, nil, "host address 192.0.2.2"},
		{"2001:db8::2", 22, nil, "host address 2001:db8::2"},
		{"192.0.2.2", 8765, nil, ""}, // the callback
		{"10.1.2.3", 80, nil, "private range 10.0.0.0/8"},
		{"172.16.0.1", 80, nil, "private range 172.16.0.0/12"},
		{"172.32.0.1", 80, nil, ""},
		{"192.168.1.1", 80, nil, "private range 192.168.0.0/16"},
		{"100.100.1.1", 80, nil, "private range 100.64.0.0/10"},
		{"fd12::1", 80, nil, "private range fc00::/7"},
		{"10.1.2.3", 80, func(c *Config) { c.AllowPrivate = true }, ""},
		{"192.0.2.2", 22, func(c *Config) { c.AllowPrivate = true }, "host address"},
		{"10.1.2.3", 80, func(c *Config) { c.Allow = []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")} }, ""},
		{"10.1.3.3", 80, func(c *Config) { c.Allow = []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")} }, "private range"},
		{"169.254.169.254", 80, func(c *Config) { c.Allow = []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")} }, ""},
		{"203.0.113.10", 0, nil, "port 0"},
	}
	for _, tt := range tests {
		cfg := base
		if tt.cfg != nil {
			tt.cfg(&cfg)
		}
		g := newGuard(&cfg)
		g.list = func() ([]netip.Addr, error) { return host, nil }
		rule, ok := g.check(netip.MustParseAddr(tt.addr), tt.port)
		if tt.want == "" && !ok || tt.want != "" && (ok || !strings.Contains(rule, tt.want)) {
			t.Errorf("%s:%d: check = %q %v; want %q", tt.addr, tt.port, rule, ok, tt.want)
		}
	}
}

// Not knowing the host's addresses, the guard denies.
func TestGuardFailsClosed(t *testing.T) {
	g := newGuard(&Config{})
	g.list = func() ([]netip.Addr, error) { return nil, errors.New("netlink: no") }
	if rule, ok := g.check(netip.MustParseAddr("203.0.113.10"), 443); ok || !strings.Contains(rule, "host addresses unknown") {
		t.Fatalf("check = %q %v, want a denial", rule, ok)
	}
}

// The real host's addresses are listed (the default, not a stub).
func TestGuardListsHostAddresses(t *testing.T) {
	addrs, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	g := newGuard(&Config{AllowPrivate: true})
	for _, a := range addrs {
		if a.IsLinkLocalUnicast() {
			continue
		}
		if rule, ok := g.check(a, 9); ok {
			t.Errorf("host address %s allowed (%q)", a, rule)
		}
	}
}
