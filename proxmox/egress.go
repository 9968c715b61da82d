package proxmox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	stdnet "net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// A job VM whose network goes through delegate's egress proxy (package
// egress, "Proxmox"): a VM cannot have a listener of its own, so it
// reaches the server's shared one and names its job in
// Proxy-Authorization (its https_proxy is http://job:TOKEN@PROXY); its
// NIC's firewall lets out nothing else but DHCP, which Proxmox lets out
// to any address before any rule: so the VM is on a job network of its
// own (PROXMOX_JOB_BRIDGE, checkJobNet). Before the VM starts the backend
// sets, then reads back, refusing the job if any of it is missing:
//
//	net0: ...,firewall=1
//	firewall/options: enable=1 ipfilter=1 macfilter=1 policy_in=DROP policy_out=DROP dhcp=1 radv=0
//	firewall/ipset ipfilter-net0          (the VM's address, once its agent tells it)
//	firewall/rules: out ACCEPT tcp → PROXY port, out ACCEPT tcp → CALLBACK port
//
// and it checks that the datacenter's firewall is on, as VM rules do
// nothing otherwise (checkOn). dhcp=1 lets the VM's DHCP client get its
// address (the templates' NICs use DHCP); ipfilter pins the VM to that
// address once the agent reports it, until when the VM sends nothing but
// DHCP; policy_out DROP drops everything else, DNS and ICMP included
// (clients with the proxy variables resolve nothing themselves). The
// pinned address is in force from the firewall daemon's next cycle: the
// guest probes the proxy before the job starts (waitInForce).

// Egress is the backend's part of the egress proxy.
type Egress struct {
	// Proxy is the proxy's shared listener as job VMs reach it
	// (PROXMOX_EGRESS_PROXY, an address and a port).
	Proxy netip.AddrPort
	// Callback is the callback server as job VMs reach it (from
	// CALLBACK_PUBLIC_URL); zero: none.
	Callback netip.AddrPort
}

// firewall puts job VMs behind Proxmox's firewall, the egress proxy
// their one way out.
type firewall struct {
	c      *pve.Client
	cfg    *Config
	egress *Egress
	log    *slog.Logger
}

// ipfilterSet is the IP set Proxmox's ipfilter uses for net0.
const ipfilterSet = "ipfilter-net0"

// EgressRoute implements sandbox.EgressRouter.
func (b *Backend) EgressRoute(token string) sandbox.EgressRoute {
	if b.cfg.Egress == nil {
		return sandbox.EgressRoute{}
	}
	u := url.URL{Scheme: "http", User: url.UserPassword("job", token), Host: b.cfg.Egress.Proxy.String()}
	return sandbox.EgressRoute{ProxyURL: u.String(), NoProxy: "localhost,127.0.0.1,::1"}
}

// egressRules are the rules a job VM's firewall must have.
func (fw *firewall) rules() []pve.FirewallRule {
	e := fw.egress
	rules := []pve.FirewallRule{{Type: "out", Action: "ACCEPT", Proto: "tcp", Dest: e.Proxy.Addr().String(),
		DPort: strconv.Itoa(int(e.Proxy.Port())), Iface: "net0", Comment: "delegate: the egress proxy"}}
	if e.Callback.IsValid() {
		rules = append(rules, pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "tcp", Dest: e.Callback.Addr().String(),
			DPort: strconv.Itoa(int(e.Callback.Port())), Iface: "net0", Comment: "delegate: the callback server"})
	}
	return rules
}

// egressOptions are the VM firewall's options a job VM must have.
var egressOptions = map[string]string{"enable": "1", "ipfilter": "1", "macfilter": "1", "policy_in": "DROP", "policy_out": "DROP",
	"dhcp": "1", "radv": "0"}

// errFirewall wraps what keeps a job's network from being only the proxy.
var errFirewall = errors.New("the job's network must go through delegate's egress proxy alone, and Proxmox's firewall cannot make it")

// checkOn refuses a cluster whose VM rules would do nothing: the
// datacenter's firewall decides (off by default). A node's own enable
// does not: it switches the host's rules, and VM rules apply whatever it
// says (pve-firewall src/PVE/Firewall.pm update: the guests' chains are
// made when the datacenter's firewall is on; proxmox-firewall likewise).
// It says which daemon applies them on the node: proxmox-firewall where
// the node's nftables option is on, pve-firewall elsewhere.
func (fw *firewall) checkOn(ctx context.Context, node string) (daemon string, err error) {
	dc, err := fw.c.ClusterFirewall(ctx)
	if err != nil {
		return "", fmt.Errorf("proxmox: read the datacenter's firewall options (Sys.Audit on /): %w", privilegeHint(err))
	}
	if !pve.On(dc.Enable, false) {
		return "", fmt.Errorf("proxmox: the datacenter's firewall is off, so no VM rule applies: turn it on (Datacenter → Firewall → Options → Firewall: Yes; PUT /cluster/firewall/options enable=1), "+
			"first allowing what the nodes need, as docs/PROXMOX.md lists (its input policy drops everything else on every node): %w", errFirewall)
	}
	daemon = "pve-firewall"
	if n, err := fw.c.NodeFirewall(ctx, node); err != nil {
		fw.log.Debug("cannot read the node's firewall options: its firewall daemon is taken to be pve-firewall", "node", node, "err", err)
	} else if pve.On(n.NFTables, false) {
		daemon = "proxmox-firewall"
	}
	return daemon, nil
}

// checkJobNet checks what the API shows of the job network on a node:
// with dhcp=1, Proxmox's firewall lets a VM's DHCP packets (UDP 68→67,
// 546→547) out to any address before its rules (pve-firewall
// ruleset_create_vm_chain; proxmox-firewall's allow-dhcp-out), so a job
// may send UDP to port 67 of any host it can reach: the job network
// must be one of its own, whose only other host is the egress proxy's
// (and its DHCP server). So PROXMOX_JOB_BRIDGE must be a bridge of the
// node, and the node itself must have no address on the job network (it
// would be a neighbour of every job, and often a router): none on the
// bridge without a VLAN, none on the bridge's VLAN interface with one.
// What is behind the bridge's ports (a switch, a router) the API cannot
// show: docs/PROXMOX.md says what it must be.
func (fw *firewall) checkJobNet(ctx context.Context, node string) error {
	bridge, vlan := fw.cfg.Bridge, fw.cfg.VLAN
	ni, err := fw.c.NodeInterfaceOf(ctx, node, bridge)
	switch {
	case pve.IsNoSuchInterface(err):
		return fmt.Errorf("proxmox: PROXMOX_JOB_BRIDGE=%s: node %s has no such interface: %w", bridge, node, errFirewall)
	case err != nil:
		return fmt.Errorf("proxmox: read node %s's interface %s (Sys.Audit on /nodes/%s): %w", node, bridge, node, privilegeHint(err))
	case ni.Type != "bridge" && ni.Type != "OVSBridge" && ni.Type != "vnet":
		return fmt.Errorf("proxmox: PROXMOX_JOB_BRIDGE=%s is a %s on node %s, not a bridge: %w", bridge, ni.Type, node, errFirewall)
	}
	onIt := func(what string, ni pve.NodeInterface) error {
		if addr := cmp.Or(ni.CIDR, ni.Address, ni.CIDR6, ni.Address6); addr != "" {
			return fmt.Errorf("proxmox: node %s has an address on the job network (%s on %s): a job VM could send DHCP's UDP to it, and through it, "+
				"to any host it routes to; give the egress jobs a network of their own (PROXMOX_JOB_BRIDGE without the node's address, "+
				"or PROXMOX_JOB_VLAN; docs/PROXMOX.md, \"A job network of its own\"): %w", node, addr, what, errFirewall)
		}
		return nil
	}
	if vlan == 0 {
		return onIt(bridge, ni)
	}
	for _, name := range []string{fmt.Sprintf("%s.%d", bridge, vlan), fmt.Sprintf("vlan%d", vlan)} {
		vi, err := fw.c.NodeInterfaceOf(ctx, node, name)
		switch {
		case pve.IsNoSuchInterface(err):
		case err != nil:
			return fmt.Errorf("proxmox: read node %s's interface %s (Sys.Audit on /nodes/%s): %w", node, name, node, privilegeHint(err))
		default:
			if err := onIt(name, vi); err != nil {
				return err
			}
		}
	}
	return nil
}

// setFirewall gives a stopped job VM its firewall: options, the ipfilter
// set, the rules to the proxy and the callback server (those a template
// brought are kept; what is missing is added), then reads it all back.
func (fw *firewall) set(ctx context.Context, s *vmSandbox) error {
	if err := fw.c.SetVMFirewall(ctx, s.node, s.vmid, egressOptions); err != nil {
		return fmt.Errorf("proxmox: set VM %d's firewall options (VM.Config.Network): %w", s.vmid, privilegeHint(err))
	}
	if _, ok, err := fw.c.VMIPSet(ctx, s.node, s.vmid, ipfilterSet); err != nil {
		return fmt.Errorf("proxmox: VM %d's IP sets: %w", s.vmid, privilegeHint(err))
	} else if !ok {
		if err := fw.c.CreateVMIPSet(ctx, s.node, s.vmid, ipfilterSet); err != nil {
			return fmt.Errorf("proxmox: create VM %d's %s: %w", s.vmid, ipfilterSet, privilegeHint(err))
		}
	}
	have, err := fw.c.VMFirewallRules(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: VM %d's firewall rules: %w", s.vmid, privilegeHint(err))
	}
	for _, r := range fw.rules() {
		if !hasRule(have, r) {
			if err := fw.c.AddVMFirewallRule(ctx, s.node, s.vmid, r); err != nil {
				return fmt.Errorf("proxmox: add VM %d's firewall rule to %s:%s: %w", s.vmid, r.Dest, r.DPort, privilegeHint(err))
			}
		}
	}
	return fw.check(ctx, s, "")
}

// hasRule says whether rules hold r, enabled.
func hasRule(rules []pve.FirewallRule, r pve.FirewallRule) bool {
	return slices.ContainsFunc(rules, func(h pve.FirewallRule) bool {
		return h.Enable == 1 && h.Macro == "" && h.Source == "" && h.Type == r.Type && h.Action == r.Action && h.Proto == r.Proto && h.Dest == r.Dest && h.DPort == r.DPort &&
			(h.Iface == "" || h.Iface == r.Iface)
	})
}

// checkFirewall reads a job VM's firewall back: its NIC's firewall flag,
// the options, the rules, and (with ip) the ipfilter set holding the
// VM's address; an outbound rule that accepts anything else is refused.
func (fw *firewall) check(ctx context.Context, s *vmSandbox, ip string) error {
	cfg, err := fw.c.VMConfig(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's config: %w", s.vmid, privilegeHint(err))
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("proxmox: VM %d: %s: %w", s.vmid, fmt.Sprintf(format, args...), errFirewall)
	}
	if !strings.Contains(","+cfg.Option("net0")+",", ",firewall=1,") {
		return fail("net0 has no firewall=1 (%s)", cfg.Option("net0"))
	}
	for _, k := range netKeys(cfg) {
		if k != "net0" {
			return fail("it has a second NIC, %s, which the firewall rules do not cover", k)
		}
	}
	o, err := fw.c.VMFirewall(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's firewall options: %w", s.vmid, privilegeHint(err))
	}
	if !pve.On(o.Enable, false) || !pve.On(o.IPFilter, false) || !pve.On(o.MACFilter, true) || o.PolicyOut != "DROP" || o.PolicyIn != "DROP" {
		return fail("its firewall options are %+v, not enable=1 ipfilter=1 macfilter=1 policy_in=DROP policy_out=DROP", o)
	}
	rules, err := fw.c.VMFirewallRules(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's firewall rules: %w", s.vmid, privilegeHint(err))
	}
	want := fw.rules()
	for _, r := range want {
		if !hasRule(rules, r) {
			return fail("it lacks the rule out ACCEPT tcp → %s:%s", r.Dest, r.DPort)
		}
	}
	for _, r := range rules {
		if r.Enable != 1 {
			continue
		}
		what := fmt.Sprintf("rule %d", r.Pos)
		inner := []pve.FirewallRule{r}
		if r.Type == "group" {
			// A security group's rules apply at its place: they are read.
			if inner, err = fw.c.SecurityGroupRules(ctx, r.Action); err != nil {
				return fmt.Errorf("proxmox: VM %d's firewall uses security group %q, whose rules delegate cannot read (Sys.Audit on /): %w", s.vmid, r.Action, privilegeHint(err))
			}
			what = fmt.Sprintf("rule %d, security group %s", r.Pos, r.Action)
		}
		for _, g := range inner {
			if g.Enable != 1 || g.Action != "ACCEPT" {
				continue
			}
			desc := fmt.Sprintf("%s: %s %s %s%s → %s:%s", what, g.Type, g.Action, g.Macro, g.Proto, g.Dest, g.DPort)
			switch {
			case g.Type == "in":
				return fail("its firewall accepts inbound traffic, which a job VM must not (%s)", desc)
			case g.Type == "out" && (r.Type == "group" || !slices.ContainsFunc(want, func(w pve.FirewallRule) bool { return hasRule([]pve.FirewallRule{g}, w) })):
				return fail("its firewall accepts outbound traffic delegate did not allow (%s)", desc)
			}
		}
	}
	if ip == "" {
		return nil
	}
	es, ok, err := fw.c.VMIPSet(ctx, s.node, s.vmid, ipfilterSet)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's %s: %w", s.vmid, ipfilterSet, privilegeHint(err))
	}
	if !ok || !slices.ContainsFunc(es, func(e pve.IPSetEntry) bool { return e.CIDR == ip || e.CIDR == ip+"/32" }) {
		return fail("its %s does not hold its address %s", ipfilterSet, ip)
	}
	return nil
}

// pin puts the VM's address in its ipfilter set (until then ipfilter
// lets it send nothing but DHCP), checks the whole firewall again, and
// waits until the firewall is in force (waitInForce). The address is the
// IPv4 address of the interface whose hardware address is net0's MAC,
// which DHCP may give it well after the guest agent answers (and a
// guest may have other interfaces first, Docker's docker0 among them):
// it is polled for, AddressTimeout at most.
func (fw *firewall) pin(ctx context.Context, s *vmSandbox, daemon string) error {
	cfg, err := fw.c.VMConfig(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's config: %w", s.vmid, privilegeHint(err))
	}
	mac := nicMAC(cfg.Option("net0"))
	if mac == "" {
		return fmt.Errorf("proxmox: VM %d's net0 (%s) has no MAC address: %w", s.vmid, cfg.Option("net0"), errFirewall)
	}
	deadline := time.Now().Add(fw.cfg.AddressTimeout)
	var ip, seen string
	for {
		ifaces, err := fw.c.AgentNetworkInterfaces(ctx, s.node, s.vmid)
		switch {
		case err == nil:
			ip, seen = addressOf(ifaces, mac)
		case lastingAgentError(err):
			return fmt.Errorf("proxmox: VM %d's addresses (agent network-get-interfaces): %w", s.vmid, privilegeHint(err))
		default:
			seen = err.Error()
		}
		if ip != "" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxmox: VM %d's net0 (MAC %s) got no IPv4 address within %s (is DHCP served on the job network?; the agent reports: %s): %w",
				s.vmid, mac, fw.cfg.AddressTimeout, seen, errFirewall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(fw.cfg.PollInterval):
		}
	}
	if es, _, err := fw.c.VMIPSet(ctx, s.node, s.vmid, ipfilterSet); err == nil &&
		!slices.ContainsFunc(es, func(e pve.IPSetEntry) bool { return e.CIDR == ip || e.CIDR == ip+"/32" }) {
		if err := fw.c.AddVMIPSetEntry(ctx, s.node, s.vmid, ipfilterSet, ip+"/32"); err != nil {
			return fmt.Errorf("proxmox: pin VM %d to %s: %w", s.vmid, ip, privilegeHint(err))
		}
	}
	if err := fw.check(ctx, s, ip); err != nil {
		return err
	}
	return fw.waitInForce(ctx, s, daemon)
}

// nicMAC is the MAC address of a NIC's config, lower case: the value
// of its model key ("virtio=BC:24:11:..,bridge=vmbr0") or of macaddr.
func nicMAC(net string) string {
	for _, p := range strings.Split(net, ",") {
		if _, v, ok := strings.Cut(p, "="); ok {
			if hw, err := stdnet.ParseMAC(v); err == nil && len(hw) == 6 {
				return hw.String()
			}
		}
	}
	return ""
}

// addressOf finds the IPv4 address of the interface whose hardware
// address is mac (not loopback, not link-local); seen says what the agent
// reported instead, for an error.
func addressOf(ifaces []pve.NetworkInterface, mac string) (ip, seen string) {
	var saw []string
	for _, in := range ifaces {
		var addrs []string
		for _, a := range in.IPAddresses {
			addr, err := netip.ParseAddr(a.Address)
			if err != nil || a.Type != "ipv4" || addr.IsLoopback() || addr.IsLinkLocalUnicast() {
				continue
			}
			if strings.EqualFold(in.HardwareAddress, mac) {
				return addr.String(), ""
			}
			addrs = append(addrs, addr.String())
		}
		saw = append(saw, fmt.Sprintf("%s %s [%s]", in.Name, in.HardwareAddress, strings.Join(addrs, " ")))
	}
	return "", strings.Join(saw, "; ")
}

// probeScript connects to the proxy ($ARGV[0]) and asks it something: an
// HTTP answer (407, most likely: no credentials) says the VM's packets
// reach it, its firewall in force. A constant: the address is an
// argument. Exit 0: answered; 1: refused or closed; 2: no answer in 3 s.
const probeScript = `use IO::Socket::INET; $SIG{ALRM} = sub { exit 2 }; alarm 3;
my $s = IO::Socket::INET->new(PeerAddr => $ARGV[0], Proto => "tcp") or exit 1;
print $s "OPTIONS * HTTP/1.0\r\n\r\n"; my $l = <$s>;
exit(defined $l && $l =~ m{^HTTP/1\.[01] [0-9]{3}} ? 0 : 1);`

// waitInForce waits until the VM reaches the egress proxy: Proxmox's
// firewall daemon applies a VM's rules and IP sets on a cycle
// (pve-firewall every 10 s, proxmox-firewall every 5 s), so the address
// just pinned is dropped until the next one, and a job that started at
// once would see its first connections dropped and retried for up to
// ~15 s. The guest probes the proxy (probeScript, with the guest's perl)
// every PollInterval, FirewallWait at most; a guest without perl is not
// probed (the log says so).
func (fw *firewall) waitInForce(ctx context.Context, s *vmSandbox, daemon string) error {
	deadline := time.Now().Add(fw.cfg.FirewallWait)
	proxy := fw.egress.Proxy.String()
	for tries := 1; ; tries++ {
		r, err := s.run(ctx, []string{fw.cfg.GuestPerl, "-e", probeScript, proxy})
		switch {
		case err != nil:
			return fmt.Errorf("proxmox: probe the egress proxy from VM %d: %w", s.vmid, err)
		case r.code == 0:
			fw.log.Debug("the egress proxy answers the job VM: its firewall is in force", "vmid", s.vmid, "probes", tries)
			return nil
		case r.code == 127 || r.code == 126:
			fw.log.Warn("cannot probe the egress proxy from the job VM (no perl there): its first connections may be dropped until Proxmox's firewall applies its rules",
				"vmid", s.vmid, "perl", fw.cfg.GuestPerl)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxmox: VM %d does not reach the egress proxy at %s within %s of its firewall being set "+
				"(is the proxy up and reachable from the job network, PROXMOX_EGRESS_PROXY its address there, and %s running on node %s?): %w",
				s.vmid, proxy, fw.cfg.FirewallWait, daemon, s.node, errFirewall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(fw.cfg.PollInterval):
		}
	}
}

// ParseEgress reads PROXMOX_EGRESS_PROXY (host:port, the address job VMs
// reach) and the callback server's public URL into an Egress.
func ParseEgress(proxy, callbackURL string) (*Egress, error) {
	ap, err := netip.ParseAddrPort(proxy)
	if err != nil || ap.Port() == 0 {
		return nil, fmt.Errorf("PROXMOX_EGRESS_PROXY=%q: must be the address and port job VMs reach the egress proxy at, like 10.0.0.5:3128", proxy)
	}
	e := &Egress{Proxy: ap}
	if callbackURL != "" {
		u, err := url.Parse(callbackURL)
		if err != nil {
			return nil, fmt.Errorf("CALLBACK_PUBLIC_URL: %w", err)
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		addr, err := netip.ParseAddr(host)
		if err != nil {
			ips, lerr := net.DefaultResolver.LookupNetIP(context.Background(), "ip4", host)
			if lerr != nil || len(ips) == 0 {
				return nil, fmt.Errorf("CALLBACK_PUBLIC_URL=%s: job VMs' firewall needs the callback server's address: %v", callbackURL, lerr)
			}
			addr = ips[0]
		}
		p, _ := strconv.Atoi(port)
		e.Callback = netip.AddrPortFrom(addr, uint16(p))
	}
	return e, nil
}
