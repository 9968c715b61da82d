package egress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// The ranges no job reaches unless the operator allows them (Config.Allow,
// Config.AllowPrivate), checked on every address the proxy would connect to,
// after its own resolution and again at connect time.
var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16") // cloud metadata (169.254.169.254) lives here
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
	// AWS's instance metadata over IPv6. It is inside fc00::/7, but stays
	// denied when the operator allows private ranges.
	metadata6 = netip.MustParseAddr("fd00:ec2::254")
	// NAT64's well-known prefix carries an IPv4 address in its last 32
	// bits (RFC 6052): 64:ff9b::a9fe:a9fe is 169.254.169.254 through a
	// NAT64 gateway, so the embedded address is checked too.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")

	privateRanges = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("fc00::/7"),
		// Shared address space (RFC 6598): carrier-grade NAT, and the
		// addresses of VPN overlays such as Tailscale's, an operator's
		// private network as much as 10/8 is.
		netip.MustParsePrefix("100.64.0.0/10"),
	}
	// Addresses that are nobody's unicast destination.
	reservedRanges = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),   // "this network"
		netip.MustParsePrefix("240.0.0.0/4"), // reserved, and 255.255.255.255
	}
)

// hostAddrsTTL bounds how stale the list of the host's own addresses may
// be: addresses come and go (DHCP, VPNs), and listing them is a netlink
// round trip too many to pay at every connection.
const hostAddrsTTL = 2 * time.Second

// guard decides which addresses a job may connect to.
type guard struct {
	allow        []netip.Prefix
	allowPrivate bool
	callback     netip.AddrPort

	mu      sync.Mutex
	host    []netip.Addr
	hostErr error
	hostAt  time.Time
	list    func() ([]netip.Addr, error) // the host's addresses
}

func newGuard(cfg *Config) *guard {
	g := &guard{allow: cfg.Allow, allowPrivate: cfg.AllowPrivate, callback: cfg.Callback, list: interfaceAddrs}
	if cfg.Callback.IsValid() {
		g.callback = netip.AddrPortFrom(cfg.Callback.Addr().Unmap(), cfg.Callback.Port())
	}
	return g
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap().WithZone(""))
		}
	}
	return out, nil
}

func (g *guard) hostAddrs() ([]netip.Addr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); g.hostAt.IsZero() || now.Sub(g.hostAt) > hostAddrsTTL {
		g.host, g.hostErr = g.list()
		g.hostAt = now
	}
	return g.host, g.hostErr
}

// check says whether a job may connect to a:port, and by which rule.
func (g *guard) check(a netip.Addr, port uint16) (string, bool) {
	a = a.Unmap().WithZone("")
	if port == 0 {
		return "port 0", false
	}
	if g.callback.IsValid() && a == g.callback.Addr() && port == g.callback.Port() {
		return "callback " + g.callback.String(), true
	}
	return g.checkAddr(a)
}

// checkAddr is check without the port: what a DNS answer may carry.
func (g *guard) checkAddr(a netip.Addr) (string, bool) {
	a = a.Unmap().WithZone("")
	if !a.IsValid() {
		return "no address", false
	}
	for _, p := range g.allow {
		if p.Contains(a) {
			return "operator allows " + p.String(), true
		}
	}
	if nat64.Contains(a) {
		b := a.As16()
		v4 := netip.AddrFrom4([4]byte(b[12:]))
		if rule, ok := g.checkAddr(v4); !ok {
			return rule + " (through NAT64 " + nat64.String() + ")", false
		}
	}
	switch {
	case a.IsUnspecified():
		return "unspecified address " + a.String(), false
	case a.IsLoopback():
		return "host address " + a.String() + " (loopback)", false
	case linkLocal4.Contains(a):
		return "link-local " + linkLocal4.String() + " (cloud metadata)", false
	case linkLocal6.Contains(a):
		return "link-local " + linkLocal6.String(), false
	case a == metadata6:
		return "cloud metadata " + metadata6.String(), false
	case a.IsMulticast() || a.IsInterfaceLocalMulticast() || a.IsLinkLocalMulticast():
		return "not unicast: " + a.String(), false
	}
	for _, p := range reservedRanges {
		if p.Contains(a) {
			return "reserved range " + p.String(), false
		}
	}
	host, err := g.hostAddrs()
	if err != nil {
		// Not knowing the host's addresses, deny rather than guess.
		return "host addresses unknown: " + err.Error(), false
	}
	for _, h := range host {
		if h == a {
			return "host address " + a.String(), false
		}
	}
	if !g.allowPrivate {
		for _, p := range privateRanges {
			if p.Contains(a) {
				return "private range " + p.String(), false
			}
		}
	}
	return "", true
}
