package pve

import (
	"context"
	"net/url"
)

// The firewall (pve-firewall): a VM's rules do nothing unless the
// datacenter's firewall and its node's are on, and its NIC has
// firewall=1.

// FirewallOptions are a firewall's options as the API returns them: the
// datacenter's, a node's, or a VM's. A value not set is absent.
type FirewallOptions struct {
	Enable    *Int   `json:"enable"`
	IPFilter  *Int   `json:"ipfilter"`
	MACFilter *Int   `json:"macfilter"`
	DHCP      *Int   `json:"dhcp"`
	RADV      *Int   `json:"radv"`
	PolicyIn  string `json:"policy_in"`
	PolicyOut string `json:"policy_out"`
}

// On says whether an option is set to 1; unset is def.
func On(v *Int, def bool) bool {
	if v == nil {
		return def
	}
	return *v == 1
}

// ClusterFirewall reads the datacenter's firewall options (Sys.Audit on /).
func (c *Client) ClusterFirewall(ctx context.Context) (FirewallOptions, error) {
	var o FirewallOptions
	_, err := c.get(ctx, "/cluster/firewall/options", nil, &o)
	return o, err
}

// NodeFirewall reads a node's firewall options (Sys.Audit on /nodes/N).
func (c *Client) NodeFirewall(ctx context.Context, node string) (FirewallOptions, error) {
	var o FirewallOptions
	_, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/firewall/options", nil, &o)
	return o, err
}

// VMFirewall reads a VM's firewall options (VM.Audit).
func (c *Client) VMFirewall(ctx context.Context, node string, vmid int) (FirewallOptions, error) {
	var o FirewallOptions
	_, err := c.get(ctx, vmPath(node, vmid)+"/firewall/options", nil, &o)
	return o, err
}

// SetVMFirewall sets a VM's firewall options (VM.Config.Network): each
// value of opts, "enable" → "1" and so on.
func (c *Client) SetVMFirewall(ctx context.Context, node string, vmid int, opts map[string]string) error {
	p := params{}
	for k, v := range opts {
		p[k] = v
	}
	return c.put(ctx, vmPath(node, vmid)+"/firewall/options", p, nil)
}

// FirewallRule is one rule of a VM's firewall.
type FirewallRule struct {
	Pos    Int    `json:"pos"`
	Type   string `json:"type"`   // in, out
	Action string `json:"action"` // ACCEPT, DROP, REJECT
	Proto  string `json:"proto,omitempty"`
	Dest   string `json:"dest,omitempty"`
	Source string `json:"source,omitempty"`
	DPort  string `json:"dport,omitempty"`
	Iface  string `json:"iface,omitempty"`
	Enable Int    `json:"enable"`
	// Comment says what the rule is for.
	Comment string `json:"comment,omitempty"`
}

// VMFirewallRules lists a VM's rules, in order.
func (c *Client) VMFirewallRules(ctx context.Context, node string, vmid int) ([]FirewallRule, error) {
	var rs []FirewallRule
	_, err := c.get(ctx, vmPath(node, vmid)+"/firewall/rules", nil, &rs)
	return rs, err
}

// AddVMFirewallRule adds a rule, enabled, first in the VM's list.
func (c *Client) AddVMFirewallRule(ctx context.Context, node string, vmid int, r FirewallRule) error {
	p := params{"type": r.Type, "action": r.Action, "enable": "1"}
	for k, v := range map[string]string{"proto": r.Proto, "dest": r.Dest, "source": r.Source, "dport": r.DPort, "iface": r.Iface, "comment": r.Comment} {
		if v != "" {
			p[k] = v
		}
	}
	return c.post(ctx, vmPath(node, vmid)+"/firewall/rules", p, nil)
}

// IPSetEntry is an entry of an IP set.
type IPSetEntry struct {
	CIDR string `json:"cidr"`
}

// VMIPSet lists an IP set of a VM's firewall; ok is false when there is
// no such set.
func (c *Client) VMIPSet(ctx context.Context, node string, vmid int, name string) ([]IPSetEntry, bool, error) {
	var sets []struct {
		Name string `json:"name"`
	}
	if _, err := c.get(ctx, vmPath(node, vmid)+"/firewall/ipset", nil, &sets); err != nil {
		return nil, false, err
	}
	found := false
	for _, s := range sets {
		found = found || s.Name == name
	}
	if !found {
		return nil, false, nil
	}
	var es []IPSetEntry
	_, err := c.get(ctx, vmPath(node, vmid)+"/firewall/ipset/"+url.PathEscape(name), nil, &es)
	return es, true, err
}

// CreateVMIPSet makes an IP set in a VM's firewall.
func (c *Client) CreateVMIPSet(ctx context.Context, node string, vmid int, name string) error {
	return c.post(ctx, vmPath(node, vmid)+"/firewall/ipset", params{"name": name}, nil)
}

// AddVMIPSetEntry adds an address or network to a VM's IP set.
func (c *Client) AddVMIPSetEntry(ctx context.Context, node string, vmid int, name, cidr string) error {
	return c.post(ctx, vmPath(node, vmid)+"/firewall/ipset/"+url.PathEscape(name), params{"cidr": cidr}, nil)
}
