package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// A job VM whose network goes through delegate's egress proxy (package
// egress, "Proxmox"): a VM cannot have a listener of its own, so it
// reaches the server's shared one and names its job in
// Proxy-Authorization (its https_proxy is http://job:TOKEN@PROXY); its
// NIC's firewall lets out nothing else. Before the VM starts the backend
// sets, then reads back, refusing the job if any of it is missing:
//
//	net0: ...,firewall=1
//	firewall/options: enable=1 ipfilter=1 macfilter=1 policy_in=DROP policy_out=DROP dhcp=1 radv=0
//	firewall/ipset ipfilter-net0          (the VM's address, once its agent tells it)
//	firewall/rules: out ACCEPT tcp → PROXY port, out ACCEPT tcp → CALLBACK port
//
// and it checks that the datacenter's firewall and the node's are on, as
// VM rules do nothing otherwise. dhcp=1 lets the VM's DHCP client get its
// address (the templates' NICs use DHCP); ipfilter pins the VM to that
// address once the agent reports it, until when the VM sends nothing but
// DHCP; policy_out DROP drops everything else, DNS and ICMP included
// (clients with the proxy variables resolve nothing themselves).

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

// checkFirewallOn refuses a node whose VM rules would do nothing: the
// datacenter's firewall is off by default, a node's on.
func (fw *firewall) checkOn(ctx context.Context, node string) error {
	dc, err := fw.c.ClusterFirewall(ctx)
	if err != nil {
		return fmt.Errorf("proxmox: read the datacenter's firewall options (Sys.Audit on /): %w", privilegeHint(err))
	}
	if !pve.On(dc.Enable, false) {
		return fmt.Errorf("proxmox: the datacenter's firewall is off, so no VM rule applies: turn it on (Datacenter → Firewall → Options → Firewall: Yes; PUT /cluster/firewall/options enable=1), with rules that keep the cluster reachable: %w", errFirewall)
	}
	n, err := fw.c.NodeFirewall(ctx, node)
	if err != nil {
		return fmt.Errorf("proxmox: read node %s's firewall options (Sys.Audit on /nodes/%s): %w", node, node, privilegeHint(err))
	}
	if !pve.On(n.Enable, true) {
		return fmt.Errorf("proxmox: node %s's firewall is off, so no VM rule applies there: turn it on (PUT /nodes/%s/firewall/options enable=1): %w", node, node, errFirewall)
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
		return h.Enable == 1 && h.Type == r.Type && h.Action == r.Action && h.Proto == r.Proto && h.Dest == r.Dest && h.DPort == r.DPort &&
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
		if r.Enable == 1 && r.Type == "out" && r.Action == "ACCEPT" && !slices.ContainsFunc(want, func(w pve.FirewallRule) bool { return hasRule([]pve.FirewallRule{r}, w) }) {
			return fail("its firewall accepts outbound traffic delegate did not allow (rule %d: %s %s → %s:%s)", r.Pos, r.Action, r.Proto, r.Dest, r.DPort)
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

// pinAddress puts the VM's address, as its agent reports it, in its
// ipfilter set (until then ipfilter lets it send nothing but DHCP), and
// checks the whole firewall again.
func (fw *firewall) pin(ctx context.Context, s *vmSandbox) error {
	ifaces, err := fw.c.AgentNetworkInterfaces(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: VM %d's addresses (agent network-get-interfaces): %w", s.vmid, privilegeHint(err))
	}
	var ip string
	for _, in := range ifaces {
		for _, a := range in.IPAddresses {
			if addr, err := netip.ParseAddr(a.Address); err == nil && a.Type == "ipv4" && !addr.IsLoopback() && !addr.IsLinkLocalUnicast() {
				ip = addr.String()
				break
			}
		}
		if ip != "" {
			break
		}
	}
	if ip == "" {
		return fmt.Errorf("proxmox: VM %d reports no IPv4 address to pin: %w", s.vmid, errFirewall)
	}
	if es, _, err := fw.c.VMIPSet(ctx, s.node, s.vmid, ipfilterSet); err == nil &&
		!slices.ContainsFunc(es, func(e pve.IPSetEntry) bool { return e.CIDR == ip || e.CIDR == ip+"/32" }) {
		if err := fw.c.AddVMIPSetEntry(ctx, s.node, s.vmid, ipfilterSet, ip+"/32"); err != nil {
			return fmt.Errorf("proxmox: pin VM %d to %s: %w", s.vmid, ip, privilegeHint(err))
		}
	}
	return fw.check(ctx, s, ip)
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
