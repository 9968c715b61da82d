package pve

import (
	"context"
	"errors"
	"net/url"
	"strings"
)

// The firewall (pve-firewall, or proxmox-firewall on a node with
// nftables=1): a VM's rules do nothing unless the datacenter's firewall
// is on and its NIC has firewall=1, whatever its node's own enable says
// (that one is the host's rules).

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
	// NFTables (a node's): proxmox-firewall, not pve-firewall, applies
	// the rules there (PVE 8.2 and later).
	NFTables *Int `json:"nftables"`
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

// SetNodeFirewall sets a node's firewall options (Sys.Modify on
// /nodes/N): "enable", "nftables"...
func (c *Client) SetNodeFirewall(ctx context.Context, node string, opts map[string]string) error {
	p := params{}
	for k, v := range opts {
		p[k] = v
	}
	return c.put(ctx, "/nodes/"+url.PathEscape(node)+"/firewall/options", p, nil)
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
	Type   string `json:"type"`   // in, out, group
	Action string `json:"action"` // ACCEPT, DROP, REJECT; a group's name for type group
	// Macro names a set of protocols and ports (SSH, DNS, Ceph...).
	Macro  string `json:"macro,omitempty"`
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
	return c.post(ctx, vmPath(node, vmid)+"/firewall/rules", ruleParams(r), nil)
}

func ruleParams(r FirewallRule) params {
	p := params{"type": r.Type, "action": r.Action, "enable": "1"}
	for k, v := range map[string]string{"macro": r.Macro, "proto": r.Proto, "dest": r.Dest, "source": r.Source, "dport": r.DPort, "iface": r.Iface, "comment": r.Comment} {
		if v != "" {
			p[k] = v
		}
	}
	return p
}

// SecurityGroupRules lists a security group's rules, in order (Sys.Audit
// on /).
func (c *Client) SecurityGroupRules(ctx context.Context, group string) ([]FirewallRule, error) {
	var rs []FirewallRule
	_, err := c.get(ctx, "/cluster/firewall/groups/"+url.PathEscape(group), nil, &rs)
	return rs, err
}

// CreateSecurityGroup makes a security group of the datacenter (Sys.Modify on /).
func (c *Client) CreateSecurityGroup(ctx context.Context, group, comment string) error {
	p := params{"group": group}
	if comment != "" {
		p["comment"] = comment
	}
	return c.post(ctx, "/cluster/firewall/groups", p, nil)
}

// AddSecurityGroupRule adds a rule, enabled, first in a security group.
func (c *Client) AddSecurityGroupRule(ctx context.Context, group string, r FirewallRule) error {
	return c.post(ctx, "/cluster/firewall/groups/"+url.PathEscape(group), ruleParams(r), nil)
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

// NodeInterface is one of a node's network interfaces (its
// /etc/network/interfaces entry).
type NodeInterface struct {
	Type        string `json:"type"` // bridge, OVSBridge, eth, bond, vlan, vnet...
	Method      string `json:"method"`
	Address     string `json:"address"`
	CIDR        string `json:"cidr"`
	Address6    string `json:"address6"`
	CIDR6       string `json:"cidr6"`
	Gateway     string `json:"gateway"`
	BridgePorts string `json:"bridge_ports"`
	VLANAware   *Int   `json:"bridge_vlan_aware"`
}

// NodeInterfaceOf reads a node's network interface (Sys.Audit on
// /nodes/N); IsNoSuchInterface tells a name the node does not have.
func (c *Client) NodeInterfaceOf(ctx context.Context, node, iface string) (NodeInterface, error) {
	var ni NodeInterface
	_, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/network/"+url.PathEscape(iface), nil, &ni)
	return ni, err
}

// IsNoSuchInterface: the node has no interface of that name.
func IsNoSuchInterface(err error) bool {
	var api *APIError
	return errors.As(err, &api) && strings.TrimSpace(api.Errors["iface"]) == "interface does not exist"
}
