package pvesim

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The firewall (pve-firewall): the datacenter's options (cluster.fw; the
// firewall is off by default), each node's (host.fw; on by default, but
// it filters nothing while the datacenter's is off), and each VM's
// (firewall/<vmid>.fw: options, rules, IP sets), which a clone copies
// from its source (qemu-server's clone calls clone_vmfw_conf). What is
// checked is what PVE::Firewall checks (verify_rule, parse_address_list,
// parse_port_name_number_or_range, the IP set API's duplicates); nothing
// filters packets here: a test reads what was configured (VMFirewall).

// vmFirewall is one VM's firewall configuration.
type vmFirewall struct {
	options map[string]string
	rules   []map[string]string // in order (pos is the index)
	ipsets  map[string][]ipsetEntry
	order   []string // ipset names, as created
}

type ipsetEntry struct {
	cidr, comment string
	nomatch       bool
}

func newVMFirewall() *vmFirewall {
	return &vmFirewall{options: map[string]string{}, ipsets: map[string][]ipsetEntry{}}
}

func (f *vmFirewall) clone() *vmFirewall {
	out := newVMFirewall()
	out.options = maps.Clone(f.options)
	for _, r := range f.rules {
		out.rules = append(out.rules, maps.Clone(r))
	}
	for k, v := range f.ipsets {
		out.ipsets[k] = slices.Clone(v)
	}
	out.order = slices.Clone(f.order)
	return out
}

// VMFirewall is a VM's firewall as tests see it.
type VMFirewall struct {
	Options map[string]string
	Rules   []map[string]string
	IPSets  map[string][]string // name → cidrs
}

// VMFirewall returns a VM's firewall configuration (empty if it has none).
func (s *Server) VMFirewall(vmid int) VMFirewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := VMFirewall{Options: map[string]string{}, IPSets: map[string][]string{}}
	v := s.vms[vmid]
	if v == nil || v.fw == nil {
		return out
	}
	out.Options = maps.Clone(v.fw.options)
	for _, r := range v.fw.rules {
		out.Rules = append(out.Rules, maps.Clone(r))
	}
	for k, es := range v.fw.ipsets {
		for _, e := range es {
			out.IPSets[k] = append(out.IPSets[k], e.cidr)
		}
	}
	return out
}

// SetFirewall turns the datacenter's firewall (node "") or a node's on or
// off, as an administrator does.
func (s *Server) SetFirewall(node string, enable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := "0"
	if enable {
		v = "1"
	}
	if node == "" {
		s.clusterFW["enable"] = v
		return
	}
	if s.nodeFW[node] == nil {
		s.nodeFW[node] = map[string]string{}
	}
	s.nodeFW[node]["enable"] = v
}

// fwFor returns a VM's firewall, made empty on first use. Call with s.mu
// held.
func (v *vm) fwFor() *vmFirewall {
	if v.fw == nil {
		v.fw = newVMFirewall()
	}
	return v.fw
}

// digest is the config's digest, as the firewall API returns it.
func fwDigest(parts ...any) string {
	h := sha1.Sum([]byte(fmt.Sprint(parts...)))
	return hex.EncodeToString(h[:])
}

// withDigest is copy_opject_with_digest: the options, as JSON values,
// and the digest.
func withDigest(opts map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range opts {
		if n, err := strconv.Atoi(v); err == nil {
			out[k] = n
		} else {
			out[k] = v
		}
	}
	out["digest"] = fwDigest(opts)
	return out
}

// setOptions applies a PUT .../firewall/options: delete first, then set.
func setOptions(c *call, opts map[string]string, keys []string) error {
	if c.has("delete") {
		for _, k := range strings.Split(c.str("delete"), ",") {
			if k = strings.TrimSpace(k); k != "" {
				delete(opts, k)
			}
		}
	}
	for _, k := range keys {
		if c.has(k) && !(c.has("delete") && slices.Contains(strings.Split(c.str("delete"), ","), k)) {
			opts[k] = c.str(k)
		}
	}
	return nil
}

func hClusterFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return withDigest(c.s.clusterFW), nil
}

func hSetClusterFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return nil, setOptions(c, c.s.clusterFW, []string{"enable", "policy_in", "policy_out", "policy_forward", "ebtables", "log_ratelimit"})
}

func (s *Server) nodeFirewall(node string) map[string]string {
	if s.nodeFW[node] == nil {
		s.nodeFW[node] = map[string]string{}
	}
	return s.nodeFW[node]
}

func hNodeFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.node(c.str("node")) == nil {
		return nil, dieErr("no such node '%s'", c.str("node"))
	}
	return withDigest(c.s.nodeFirewall(c.str("node"))), nil
}

func hSetNodeFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.node(c.str("node")) == nil {
		return nil, dieErr("no such node '%s'", c.str("node"))
	}
	return nil, setOptions(c, c.s.nodeFirewall(c.str("node")), []string{"enable", "nftables", "ndp", "nosmurfs", "tcpflags",
		"log_level_in", "log_level_out", "log_level_forward", "protection_synflood"})
}

func hVMFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	return withDigest(v.fwFor().options), nil
}

func hSetVMFWOptions(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	return nil, setOptions(c, v.fwFor().options, []string{"enable", "ipfilter", "macfilter", "policy_in", "policy_out",
		"dhcp", "radv", "ndp", "log_level_in", "log_level_out"})
}

func hVMFWRules(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	return ruleList(v.fwFor().rules), nil
}

// ruleKeys are the properties of a rule (create_rule's parameters).
var ruleKeys = []string{"type", "action", "macro", "iface", "source", "dest", "proto", "dport", "sport", "icmp-type", "enable", "log", "comment"}

func hAddVMFWRule(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	fw := v.fwFor()
	r := map[string]string{}
	for _, k := range ruleKeys {
		if c.has(k) {
			r[k] = c.str(k)
		}
	}
	if err := verifyRule(r, fw, c.s.secGroups); err != nil {
		return nil, err
	}
	// API2/Firewall/Rules.pm create_rule: a rule is disabled unless enable
	// is given, and goes first (pos is not used).
	if _, ok := r["enable"]; !ok {
		r["enable"] = "0"
	}
	fw.rules = slices.Insert(fw.rules, 0, r)
	return nil, nil
}

// verifyRule is PVE::Firewall::verify_rule for a VM's rule (rule_env
// "vm"), as far as a rule of delegate's kind goes; errors are the
// parameter errors it raises.
func verifyRule(r map[string]string, fw *vmFirewall, groups map[string]*secGroup) error {
	typ, action := r["type"], r["action"]
	switch typ {
	case "in", "out":
		if !regexp.MustCompile(`^(ACCEPT|DROP|REJECT)$`).MatchString(action) {
			return paramErr("action", fmt.Sprintf("unknown action '%s'", action))
		}
	case "group":
		if groups[action] == nil {
			return paramErr("action", fmt.Sprintf("no such security group '%s'", action))
		}
	default:
		return paramErr("type", fmt.Sprintf("invalid rule type '%s' for rule_env 'vm'", typ))
	}
	if iface := r["iface"]; iface != "" && !regexp.MustCompile(`^net\d+$`).MatchString(iface) {
		return paramErr("iface", `value does not match the regex pattern 'net\d+'`)
	}
	if m := r["macro"]; m != "" && fwMacros[m] == nil {
		return paramErr("macro", fmt.Sprintf("unknown macro '%s'", m))
	}
	proto := r["proto"]
	for _, port := range []string{"dport", "sport"} {
		if r[port] == "" {
			continue
		}
		if proto == "" {
			return paramErr("proto", fmt.Sprintf("missing property - '%s' requires this property", port))
		}
		if !protocolsWithPorts[proto] {
			return paramErr(port, fmt.Sprintf("protocol '%s' does not support ports", proto))
		}
	}
	for _, k := range []string{"source", "dest"} {
		if val := r[k]; strings.HasPrefix(val, "+") {
			name := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(val, "+"), "guest/"), "dc/")
			if _, ok := fw.ipsets[name]; !ok {
				return paramErr(k, fmt.Sprintf("no such ipset '%s'", name))
			}
		} else if val != "" && fwAliasRe().MatchString(val) {
			return paramErr(k, fmt.Sprintf("no such alias '%s'", val))
		}
	}
	return nil
}

// fwMacros are some of Firewall.pm's $pve_fw_macros, by name: the TCP
// ports each lets through (what the guests' network judges).
var fwMacros = map[string][]string{
	"SSH": {"22"}, "HTTP": {"80"}, "HTTPS": {"443"}, "Web": {"80", "443"}, "DNS": {"53"}, "NTP": nil, "Ping": nil,
	"SMTP": {"25"}, "Ceph": {"6789", "3300", "6800:7300"},
}

// protocolsWithPorts is Firewall.pm's $PROTOCOLS_WITH_PORTS.
var protocolsWithPorts = map[string]bool{"udp": true, "17": true, "udplite": true, "136": true, "tcp": true, "6": true,
	"dccp": true, "33": true, "sctp": true, "132": true}

var fwAliasRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+$`) })

func hVMIPSets(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	fw := v.fwFor()
	out := []map[string]any{}
	for _, name := range fw.order {
		out = append(out, map[string]any{"name": name, "digest": fwDigest(fw.ipsets[name])})
	}
	return out, nil
}

func hCreateVMIPSet(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	fw := v.fwFor()
	name := c.str("name")
	if c.has("rename") {
		return nil, paramErr("name", fmt.Sprintf("IPSet '%s' does not exist", c.str("rename")))
	}
	if _, ok := fw.ipsets[name]; ok {
		return nil, paramErr("name", fmt.Sprintf("IPSet '%s' already exists", name))
	}
	fw.ipsets[name] = nil
	fw.order = append(fw.order, name)
	return nil, nil
}

func hVMIPSet(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	es, ok := v.fwFor().ipsets[c.str("name")]
	if !ok {
		return nil, dieErr("no such IPSet '%s'", c.str("name"))
	}
	out := []map[string]any{}
	for _, e := range es {
		m := map[string]any{"cidr": e.cidr, "digest": fwDigest(es)}
		if e.comment != "" {
			m["comment"] = e.comment
		}
		if e.nomatch {
			m["nomatch"] = 1
		}
		out = append(out, m)
	}
	return out, nil
}

func hAddVMIPSet(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	fw := v.fwFor()
	name := c.str("name")
	es, ok := fw.ipsets[name]
	if !ok {
		return nil, dieErr("no such IPSet '%s'", name)
	}
	cidr := c.str("cidr")
	if p, err := netip.ParsePrefix(cidr); err == nil && p.Bits() == 0 {
		return nil, paramErr("cidr", "a zero prefix is not allowed in ipset entries")
	}
	if fwAliasRe().MatchString(cidr) {
		return nil, paramErr("cidr", fmt.Sprintf("no such alias '%s'", cidr))
	}
	for _, e := range es {
		if e.cidr == cidr {
			return nil, paramErr("cidr", fmt.Sprintf("address '%s' already exists", cidr))
		}
	}
	fw.ipsets[name] = append(es, ipsetEntry{cidr: cidr, comment: c.str("comment"), nomatch: c.boolOr("nomatch", false)})
	return nil, nil
}

// Formats of the firewall's parameters (Firewall.pm), checked as PVE
// checks them.

// verifyIPOrCIDR is pve_verify_ip_or_cidr (an address, or a network).
func verifyIPOrCIDR(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return nil
	}
	return fmt.Errorf("value does not look like a valid IP address or CIDR network\n")
}

// verifyAddrSpec is parse_address_list: an IP set (+name), an alias, or a
// list of addresses, networks or one range of one IP version.
func verifyAddrSpec(s string) error {
	if strings.HasPrefix(s, "+") {
		if len(s) > 65 {
			return fmt.Errorf("ipset name too long\n")
		}
		return nil
	}
	if fwAliasRe().MatchString(s) {
		if len(s) > 64 {
			return fmt.Errorf("alias name too long\n")
		}
		return nil
	}
	elems := strings.Split(s, ",")
	if strings.Join(elems, ",") != s || slices.Contains(elems, "") {
		return fmt.Errorf("extraneous commas in list\n")
	}
	version, ranged := 0, false
	for _, e := range elems {
		var a netip.Addr
		if lo, hi, ok := strings.Cut(e, "-"); ok {
			ranged = true
			l, err1 := netip.ParseAddr(lo)
			h, err2 := netip.ParseAddr(hi)
			if err1 != nil || err2 != nil || l.Is4() != h.Is4() {
				return fmt.Errorf("invalid IP address: Invalid IP %s\n", e)
			}
			a = l
		} else if p, err := netip.ParsePrefix(e); err == nil {
			a = p.Addr()
		} else if addr, err := netip.ParseAddr(e); err == nil {
			a = addr
		} else {
			return fmt.Errorf("invalid IP address: Invalid IP %s\n", e)
		}
		v := 4
		if !a.Is4() {
			v = 6
		}
		if version != 0 && v != version {
			return fmt.Errorf("detected mixed ipv4/ipv6 addresses in address list '%s'\n", s)
		}
		version = v
	}
	if ranged && len(elems) > 1 {
		return fmt.Errorf("you can't use a range in a list\n")
	}
	return nil
}

// verifyPortSpec is parse_port_name_number_or_range for numbers and
// ranges (a service name from /etc/services is also taken there; here
// only those of /etc/services a job's rule would use).
func verifyPortSpec(s string) error {
	elems := strings.Split(s, ",")
	if strings.Join(elems, ",") != s || slices.Contains(elems, "") {
		return fmt.Errorf("extraneous commas in list\n")
	}
	count := 0
	for _, e := range elems {
		if lo, hi, ok := strings.Cut(e, ":"); ok {
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("invalid port '%s'\n", e)
			}
			if a > 65535 {
				return fmt.Errorf("invalid port '%d'\n", a)
			}
			if b > 65535 {
				return fmt.Errorf("invalid port '%d'\n", b)
			}
			if a > b {
				return fmt.Errorf("backwards range '%d:%d' not allowed, did you mean '%d:%d'?\n", a, b, b, a)
			}
			count += 2
			continue
		}
		n, err := strconv.Atoi(e)
		if err != nil {
			if !knownServices[e] {
				return fmt.Errorf("invalid port '%s'\n", e)
			}
			continue
		}
		if n > 65535 {
			return fmt.Errorf("invalid port '%d'\n", n)
		}
		count++
	}
	if count > 15 {
		return fmt.Errorf("too many entries in port list (> 15 numbers)\n")
	}
	return nil
}

// knownServices are names of /etc/services a rule may use for a port.
var knownServices = map[string]bool{"http": true, "https": true, "ssh": true, "domain": true, "ftp": true, "smtp": true}

// verifyProtocol is pve_fw_verify_protocol_spec: a name or number of
// /etc/protocols.
func verifyProtocol(s string) error {
	switch s {
	case "tcp", "udp", "icmp", "ipv6-icmp", "icmpv6", "udplite", "dccp", "sctp", "gre", "esp", "ah", "igmp", "ipip", "vrrp":
		return nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 255 {
		return nil
	}
	return fmt.Errorf("unknown protocol '%s'\n", s)
}
