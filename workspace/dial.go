package workspace

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// DialFunc opens a connection for Clone: the caller's address policy.
// It has net.Dialer.DialContext's shape.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// PublicDial is the default policy: it connects only to public addresses.
// The check runs on the address actually connected to, after the name was
// resolved (net.Dialer's Control hook), so a name that resolves to a
// refused address, or a redirect to one, is refused as well.
func PublicDial(ctx context.Context, network, address string) (net.Conn, error) {
	d := net.Dialer{Control: func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %q: %w", ErrAddressRefused, address, err)
		}
		return CheckAddress(ap.Addr())
	}}
	return d.DialContext(ctx, network, address)
}

// refusedPrefixes: what IsPrivate and its kin do not cover.
var refusedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT, shared
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and broadcast
	netip.MustParsePrefix("100::/64"),        // discard
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("fec0::/10"),       // site-local, deprecated
}

// embedsIPv4: IPv6 prefixes whose addresses carry an IPv4 address that
// decides where they go (NAT64, 6to4).
var embedsIPv4 = []struct {
	p   netip.Prefix
	off int
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
}

// CheckAddress is the default policy's test of one address: it refuses
// loopback, link-local, private (RFC 1918, unique local), carrier-grade
// NAT, unspecified, multicast, reserved and documentation addresses, IPv6
// addresses that embed a refused IPv4 address, and every address of this
// host's own interfaces.
func CheckAddress(ip netip.Addr) error {
	ip = ip.Unmap()
	why := ""
	switch {
	case !ip.IsValid():
		why = "not an address"
	case ip.IsLoopback():
		why = "loopback"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		why = "link-local"
	case ip.IsPrivate():
		why = "private"
	case ip.IsUnspecified():
		why = "unspecified"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		why = "multicast"
	}
	for _, p := range refusedPrefixes {
		if why == "" && p.Contains(ip) {
			why = "reserved (" + p.String() + ")"
		}
	}
	for _, e := range embedsIPv4 {
		if why == "" && e.p.Contains(ip) {
			b := ip.As16()
			v4 := netip.AddrFrom4([4]byte(b[e.off : e.off+4]))
			if err := CheckAddress(v4); err != nil {
				why = "embeds " + v4.String()
			}
		}
	}
	if why == "" && ownAddress(ip) {
		why = "this host's own"
	}
	if why != "" {
		return fmt.Errorf("%w: %s is %s", ErrAddressRefused, ip, why)
	}
	return nil
}

// ownAddress tells whether ip is an address of one of this host's
// interfaces (read at each call: interfaces come and go).
func ownAddress(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		// Unknown: refuse rather than let an address of ours through.
		return true
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if own, ok := netip.AddrFromSlice(n.IP); ok && own.Unmap() == ip {
				return true
			}
		}
	}
	return false
}
