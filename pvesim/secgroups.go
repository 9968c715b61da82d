package pvesim

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"sync"
)

// Security groups (pve-firewall src/PVE/API2/Firewall/Groups.pm, the
// [group name] sections of cluster.fw): named lists of rules, defined
// for the datacenter, that a VM's rule of type "group" (its action the
// group's name) brings in at its place. Listing them is every user's
// (the method checks nothing); a group's rules need Sys.Audit on /,
// changing them Sys.Modify.

// secGroup is one security group.
type secGroup struct {
	comment string
	rules   []map[string]string // in order
}

var secGroupRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\-_]+$`) })

// GET /cluster/firewall/groups
func hSecGroups(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(s.secGroups)) {
		g := s.secGroups[name]
		e := map[string]any{"group": name, "digest": fwDigest(name, g.comment, g.rules)}
		if g.comment != "" {
			e["comment"] = g.comment
		}
		out = append(out, e)
	}
	return out, nil
}

// POST /cluster/firewall/groups: a new group ("Security group 'x'
// already exists").
func hCreateSecGroup(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	name := c.str("group")
	if !secGroupRe().MatchString(name) {
		return nil, paramErr("group", "invalid format - security group name must match "+secGroupRe().String())
	}
	if c.has("rename") {
		return nil, fmt.Errorf("pvesim: renaming a security group is not simulated")
	}
	if s.secGroups[name] != nil {
		return nil, dieErr("Security group '%s' already exists", name)
	}
	s.secGroups[name] = &secGroup{comment: c.str("comment")}
	return nil, nil
}

// GET /cluster/firewall/groups/{group}: its rules, with their positions.
func hSecGroupRules(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.secGroups[c.str("group")]
	if g == nil {
		return nil, dieErr("no such security group '%s'", c.str("group"))
	}
	return ruleList(g.rules), nil
}

// POST /cluster/firewall/groups/{group}: a rule, first in the group.
func hAddSecGroupRule(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.secGroups[c.str("group")]
	if g == nil {
		return nil, dieErr("no such security group '%s'", c.str("group"))
	}
	r := map[string]string{}
	for _, k := range ruleKeys {
		if c.has(k) {
			r[k] = c.str(k)
		}
	}
	if r["type"] == "group" {
		// rule_env "group": a group holds in and out rules only.
		return nil, paramErr("type", "security groups cannot contain security groups")
	}
	if err := verifyRule(r, newVMFirewall(), s.secGroups); err != nil {
		return nil, err
	}
	if _, ok := r["enable"]; !ok {
		r["enable"] = "0"
	}
	g.rules = slices.Insert(g.rules, 0, r)
	return nil, nil
}

// ruleList is a list of rules as the API returns it (pos, enable a number).
func ruleList(rules []map[string]string) []map[string]any {
	out := []map[string]any{}
	for i, r := range rules {
		e := map[string]any{"pos": i}
		for k, val := range r {
			if k == "enable" {
				n, _ := strconv.Atoi(val)
				e[k] = n
				continue
			}
			e[k] = val
		}
		out = append(out, e)
	}
	return out
}
