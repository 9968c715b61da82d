package pvesim

import (
	"context"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The guests' network. A VM with a NIC gets a network namespace of its
// own whose connections to any address land on the simulator, on the
// ports the local backend's egress namespace listens on (egress_linux.go
// there: 3128, 80, 443, DNS, and Options.CallbackPort): its connections
// are judged by its firewall as pve-firewall last compiled it, and one
// let out to a host of Options.Hosts is carried there (a test's stand-in
// for delegate's egress proxy); any other is closed. Three things of a
// real cluster come with it:
//
//   - DHCP is slower than the guest agent: a NIC's IPv4 address (its
//     lease, 10.10.x.y from the vmid) appears in network-get-interfaces
//     Options.DHCPDelay after the agent answers; before that the NIC has
//     its IPv6 link-local address only. A template with Docker (the
//     fixture TemplateSpec.Docker) reports docker0 (172.17.0.1) before
//     eth0, as a guest running Docker does.
//   - The firewall applies on a cycle (pve-firewall src/PVE/Firewall.pm
//     update, run by pve-firewall's daemon every 10 s; proxmox-firewall
//     every 5 s): a VM's options, rules and IP sets are in force from the
//     first cycle after they changed (Options.FirewallInterval), not when
//     the API call returns.
//   - What a VM may send (ruleset_create_vm_chain): nothing is filtered
//     while the datacenter's firewall is off, or for a NIC without
//     firewall=1 or a VM whose firewall is not enabled, or a VM the daemon
//     has not compiled yet; otherwise, with ipfilter, nothing from an
//     address outside ipfilter-net0; then the first enabled "out" rule
//     that matches (a security group's rules count at its place) decides (ACCEPT lets it out, DROP and REJECT do not),
//     then policy_out (ACCEPT by default).

// compiledFW is a VM's firewall as one cycle of the daemon compiled it.
type compiledFW struct {
	enabled   bool // the datacenter's firewall, the VM's, and net0's flag
	ipfilter  bool
	policyOut string
	rules     []map[string]string
	ipsets    map[string][]ipsetEntry
	groups    map[string][]map[string]string // the security groups' rules
}

// compileFirewall is one cycle of pve-firewall: every VM's firewall as
// configured now becomes the one in force. Call with s.mu held.
func (s *Server) compileFirewall() {
	dc := s.clusterFW["enable"] == "1"
	groups := map[string][]map[string]string{}
	for name, g := range s.secGroups {
		for _, r := range g.rules {
			groups[name] = append(groups[name], maps.Clone(r))
		}
	}
	active := map[int]*compiledFW{}
	for id, v := range s.vms {
		if v.ct {
			continue
		}
		c := &compiledFW{groups: groups}
		fw := v.fw
		c.enabled = dc && fw != nil && fw.options["enable"] == "1" && netOption(v.conf["net0"], "firewall") == "1"
		if fw != nil {
			c.ipfilter = fw.options["ipfilter"] == "1"
			c.policyOut = fw.options["policy_out"]
			for _, r := range fw.rules {
				c.rules = append(c.rules, maps.Clone(r))
			}
			c.ipsets = map[string][]ipsetEntry{}
			for k, es := range fw.ipsets {
				c.ipsets[k] = slices.Clone(es)
			}
		}
		active[id] = c
	}
	s.fwActive = active
}

// runFirewall compiles the firewall every FirewallInterval until the
// simulator closes.
func (s *Server) runFirewall() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(s.opts.FirewallInterval)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
				s.mu.Lock()
				s.compileFirewall()
				s.mu.Unlock()
			}
		}
	}()
}

// lets says whether VM vmid's firewall in force lets a TCP connection
// out to dst. Call with s.mu held.
func (s *Server) lets(vmid int, dst netip.AddrPort) bool {
	c := s.fwActive[vmid]
	if c == nil || !c.enabled {
		return true // not filtered (yet)
	}
	if c.ipfilter {
		src, ok := s.lease(vmid)
		if !ok || !inSet(c.ipsets["ipfilter-net0"], src) {
			return false
		}
	}
	for _, r := range c.rules {
		rules := []map[string]string{r}
		if r["type"] == "group" {
			rules = c.groups[r["action"]] // its rules, in its place
		}
		for _, r2 := range rules {
			if r["enable"] != "1" || r2["enable"] != "1" || r2["type"] != "out" || !ruleMatches(r2, c, dst) {
				continue
			}
			return r2["action"] == "ACCEPT"
		}
	}
	return c.policyOut != "DROP" && c.policyOut != "REJECT"
}

// ruleMatches: a rule's protocol (or macro), destination and
// destination port take a TCP connection to dst (a rule with a source
// or an alias matches nothing here).
func ruleMatches(r map[string]string, c *compiledFW, dst netip.AddrPort) bool {
	if r["source"] != "" {
		return false
	}
	if m := r["macro"]; m != "" {
		ports := fwMacros[m]
		if !slices.ContainsFunc(ports, func(p string) bool { return portIn(p, dst.Port()) }) {
			return false
		}
		r = maps.Clone(r)
		delete(r, "dport")
		delete(r, "proto")
	}
	if p := r["proto"]; p != "" && p != "tcp" && p != "6" {
		return false
	}
	if d := r["dest"]; d != "" {
		ok := false
		for _, a := range strings.Split(d, ",") {
			if name, isSet := strings.CutPrefix(a, "+"); isSet {
				ok = ok || inSet(c.ipsets[name], dst.Addr())
			} else {
				ok = ok || addrIn(a, dst.Addr())
			}
		}
		if !ok {
			return false
		}
	}
	if p := r["dport"]; p != "" && !portIn(p, dst.Port()) {
		return false
	}
	return true
}

func inSet(es []ipsetEntry, a netip.Addr) bool {
	in := false
	for _, e := range es {
		if addrIn(e.cidr, a) {
			if e.nomatch {
				return false
			}
			in = true
		}
	}
	return in
}

// addrIn: a is the address, in the CIDR or the range (a-b) spec names.
func addrIn(spec string, a netip.Addr) bool {
	if lo, hi, ok := strings.Cut(spec, "-"); ok {
		l, err1 := netip.ParseAddr(lo)
		h, err2 := netip.ParseAddr(hi)
		return err1 == nil && err2 == nil && l.Compare(a) <= 0 && a.Compare(h) <= 0
	}
	if p, err := netip.ParsePrefix(spec); err == nil {
		return p.Contains(a)
	}
	b, err := netip.ParseAddr(spec)
	return err == nil && b == a
}

// portIn: port is one of a dport spec's ports or ranges ("80,443",
// "8000:8100").
func portIn(spec string, port uint16) bool {
	for _, p := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(p, ":")
		l, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		h := l
		if isRange {
			if h, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		if int(port) >= l && int(port) <= h {
			return true
		}
	}
	return false
}

// hasNIC: the VM has a NIC now. A guest booted with one keeps its
// network namespace here when the NIC is hot-unplugged (unplugNICs), but
// its packets have nowhere to go: nothing it sends is carried. Call with
// s.mu held.
func (s *Server) hasNIC(vmid int) bool {
	v := s.vms[vmid]
	return v != nil && slices.ContainsFunc(slices.Collect(maps.Keys(v.conf)), netKeyRe().MatchString)
}

// lease is a VM's IPv4 address on net0 once DHCP gave it one: the guest
// booted and DHCPDelay passed. Call with s.mu held.
func (s *Server) lease(vmid int) (netip.Addr, bool) {
	v := s.vms[vmid]
	if v == nil || v.guest == nil || v.conf["net0"] == "" || time.Now().Before(v.guest.bootAt.Add(s.opts.DHCPDelay)) {
		return netip.Addr{}, false
	}
	return leaseAddr(vmid), true
}

// leaseAddr is the address DHCP gives a VM: 10.10.x.y from its vmid.
func leaseAddr(vmid int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 10, byte(vmid / 250 % 250), byte(vmid%250 + 2)})
}

// guestNet is the guests' network as the local backend serves a
// sandbox's listeners (sandbox.EgressServer): the token is the vmid.
type guestNet struct{ s *Server }

// Serve implements sandbox.EgressServer: the port-3128 listener (a proxy's).
func (n guestNet) Serve(ctx context.Context, ln net.Listener, token string) error {
	return n.serveTCP(ctx, ln, token)
}

// ServeTransparent implements sandbox.EgressServer: ports 80 and 443.
func (n guestNet) ServeTransparent(ctx context.Context, ln net.Listener, token string) error {
	return n.serveTCP(ctx, ln, token)
}

// ServeCallback implements sandbox.EgressServer.
func (n guestNet) ServeCallback(ctx context.Context, ln net.Listener, token string) error {
	return n.serveTCP(ctx, ln, token)
}

// ServeDNSStream implements sandbox.EgressServer: DNS over TCP.
func (n guestNet) ServeDNSStream(ctx context.Context, ln net.Listener, token string) error {
	return n.serveTCP(ctx, ln, token)
}

// ServeDNS implements sandbox.EgressServer: no name server answers.
func (n guestNet) ServeDNS(ctx context.Context, pc net.PacketConn, token string) error {
	<-ctx.Done()
	return pc.Close()
}

// serveTCP judges each connection a guest makes by its firewall in force,
// and carries the ones it lets out to their host.
func (n guestNet) serveTCP(ctx context.Context, ln net.Listener, token string) error {
	vmid, _ := strconv.Atoi(token)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.carry(ctx, vmid, conn)
		}()
	}
}

// carry takes one connection where it was going, or closes it: dropped
// by the firewall, or to no host the simulator knows.
func (n guestNet) carry(ctx context.Context, vmid int, conn net.Conn) {
	defer conn.Close()
	dst, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	s := n.s
	s.mu.Lock()
	ok := s.hasNIC(vmid) && s.lets(vmid, dst)
	host := s.opts.Hosts[dst.String()]
	s.mu.Unlock()
	if !ok || host == "" {
		return
	}
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close(); up.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		io.Copy(up, conn)
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		close(done)
	}()
	io.Copy(conn, up)
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	<-done
}

// FirewallCycle runs one cycle of pve-firewall now: the firewall as
// configured is in force from here on (tests set a long
// FirewallInterval and call it).
func (s *Server) FirewallCycle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compileFirewall()
}
