package pvesim

import (
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/pve"
)

// TestFirewall: the firewall's methods check what pve-firewall checks
// (verify_rule for a VM, the formats, IP sets' duplicates), a rule is
// disabled unless asked otherwise, a clone copies its source's firewall,
// and the datacenter's firewall is off until enabled.
func TestFirewall(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	c := s.c
	if o, err := c.ClusterFirewall(ctx); err != nil || pve.On(o.Enable, false) {
		t.Errorf("datacenter firewall %+v %v: want off", o, err)
	}
	if o, err := c.NodeFirewall(ctx, "pve1"); err != nil || !pve.On(o.Enable, true) {
		t.Errorf("node firewall %+v %v: want on", o, err)
	}
	if err := c.SetVMFirewall(ctx, "pve1", tplID, map[string]string{"enable": "1", "policy_out": "DROP", "ipfilter": "1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetVMFirewall(ctx, "pve1", tplID, map[string]string{"policy_out": "LET-GO"}); err == nil || !strings.Contains(err.Error(), "policy_out") {
		t.Errorf("a bad policy: %v", err)
	}
	if err := c.SetVMFirewall(ctx, "pve1", 4242, map[string]string{"enable": "1"}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a VM that does not exist: %v", err)
	}
	for _, tc := range []struct {
		rule      pve.FirewallRule
		wantField string
		wantMsg   string
	}{
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", DPort: "443"}, "proto", "missing property - 'dport' requires this property"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "icmp", DPort: "443"}, "dport", "protocol 'icmp' does not support ports"},
		{pve.FirewallRule{Type: "out", Action: "ALLOW"}, "action", "unknown action 'ALLOW'"},
		{pve.FirewallRule{Type: "forward", Action: "ACCEPT"}, "type", "invalid rule type 'forward' for rule_env 'vm'"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Dest: "10.0.0.1,fd00::1"}, "dest", "detected mixed ipv4/ipv6 addresses"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Dest: "10.0.0.300"}, "dest", "invalid IP address"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Dest: "+nope"}, "dest", "no such ipset 'nope'"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "tcp", DPort: "70000"}, "dport", "invalid port '70000'"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "bogus"}, "proto", "unknown protocol 'bogus'"},
		{pve.FirewallRule{Type: "out", Action: "ACCEPT", Iface: "eth0"}, "iface", "net\\d+"},
	} {
		err := c.AddVMFirewallRule(ctx, "pve1", tplID, tc.rule)
		var ae *pve.APIError
		if !errorsAs(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Errors[tc.wantField], tc.wantMsg) {
			t.Errorf("%+v: %v, want 400 %s: %s", tc.rule, err, tc.wantField, tc.wantMsg)
		}
	}
	good := pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "tcp", Dest: "10.0.0.5", DPort: "3128", Iface: "net0"}
	if err := c.AddVMFirewallRule(ctx, "pve1", tplID, good); err != nil {
		t.Fatal(err)
	}
	// Without enable a rule is off (create_rule), and new rules go first.
	r := s.raw(t, "POST", "/api2/json/nodes/pve1/qemu/9000/firewall/rules", "PVEAPIToken="+testTokenID+"="+testTokenSecret,
		"application/x-www-form-urlencoded", "type=in&action=DROP")
	if r.Status != 200 {
		t.Fatalf("raw rule: %d %s", r.Status, r.Reason)
	}
	rules, err := c.VMFirewallRules(ctx, "pve1", tplID)
	if err != nil || len(rules) != 2 || rules[0].Type != "in" || rules[0].Enable != 0 || rules[1].Dest != "10.0.0.5" || rules[1].Enable != 1 || rules[1].Pos != 1 {
		t.Errorf("rules %+v %v", rules, err)
	}
	if err := c.CreateVMIPSet(ctx, "pve1", tplID, "ipfilter-net0"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVMIPSet(ctx, "pve1", tplID, "ipfilter-net0"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("a second set of one name: %v", err)
	}
	if err := c.AddVMIPSetEntry(ctx, "pve1", tplID, "nope", "10.0.0.9/32"); err == nil || !strings.Contains(err.Error(), "no such IPSet 'nope'") {
		t.Errorf("an entry of a set that is not: %v", err)
	}
	for _, bad := range []struct{ cidr, want string }{{"0.0.0.0/0", "zero prefix"}, {"10.0.0.1/33", "valid IP address or CIDR"}} {
		if err := c.AddVMIPSetEntry(ctx, "pve1", tplID, "ipfilter-net0", bad.cidr); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("entry %s: %v, want %q", bad.cidr, err, bad.want)
		}
	}
	if err := c.AddVMIPSetEntry(ctx, "pve1", tplID, "ipfilter-net0", "10.0.0.9/32"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddVMIPSetEntry(ctx, "pve1", tplID, "ipfilter-net0", "10.0.0.9/32"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("an entry twice: %v", err)
	}
	// A clone has its source's firewall.
	id := cloneAndBoot(t, s, 123, nil)
	fw := s.VMFirewall(id)
	if fw.Options["policy_out"] != "DROP" || len(fw.Rules) != 2 || len(fw.IPSets["ipfilter-net0"]) != 1 {
		t.Errorf("the clone's firewall: %+v", fw)
	}
	if es, ok, err := c.VMIPSet(ctx, "pve1", id, "ipfilter-net0"); err != nil || !ok || len(es) != 1 || es[0].CIDR != "10.0.0.9/32" {
		t.Errorf("the clone's set: %v %v %v", es, ok, err)
	}
}
