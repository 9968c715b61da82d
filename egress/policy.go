package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrUnknownToken is what a Policies implementation returns (wrapped or
// not) for a token no running job holds: the proxy answers 407 and serves
// nothing.
var ErrUnknownToken = errors.New("unknown job token")

// ErrInvalid is wrapped by every error about bad input: a rule, an
// injection binding, a policy.
var ErrInvalid = errors.New("invalid egress setting")

// Policies gives the proxy a job's policy by the job's token. The engine
// implements it; the proxy asks at every connection and every DNS query,
// and keeps no job state of its own, so a policy the engine changes applies
// to the next attempt.
type Policies interface {
	Policy(ctx context.Context, token string) (Policy, error)
}

// Mode is what a job's network may reach.
type Mode int

const (
	// None: nothing at all.
	None Mode = iota
	// Egress: every name and public address, except the always-denied
	// ranges (see Config).
	Egress
	// Allowlist: only the names of Policy.Allow (and their ports when a
	// rule gives one), and never an address in an always-denied range.
	Allowlist
)

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Egress:
		return "egress"
	case Allowlist:
		return "allowlist"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Policy is one job's network policy.
type Policy struct {
	Mode  Mode
	Allow []Rule // Allowlist only
	// Ask: a request the allowlist denies waits (Config.AskWait, 30 s by
	// default) for Config.Asker's answer, and goes through if the policy
	// allows it meanwhile.
	Ask bool
	// Inject lists the credentials the proxy adds for their hosts (TLS
	// interception with CA for those hosts alone). Reaching a host is still
	// the allowlist's decision: an injection allows nothing by itself.
	Inject []Injection
	// CA is the job's own certificate authority, required when Inject is
	// not empty (NewCA with the injected hosts).
	CA *CA
}

// Validate checks a policy as the engine builds it.
func (p Policy) Validate() error {
	switch p.Mode {
	case None, Egress:
		if len(p.Allow) > 0 {
			return fmt.Errorf("%w: allow: only an allowlist policy has rules (mode %s)", ErrInvalid, p.Mode)
		}
	case Allowlist:
	default:
		return fmt.Errorf("%w: mode: must be none, egress or allowlist (got %s)", ErrInvalid, p.Mode)
	}
	for i, r := range p.Allow {
		if _, err := ParseRule(r.String()); err != nil || r.Host == "" {
			return fmt.Errorf("%w: allow[%d]: not a parsed rule (%q)", ErrInvalid, i, r.String())
		}
	}
	if len(p.Inject) > 0 {
		if p.CA == nil {
			return fmt.Errorf("%w: ca: a policy that injects credentials needs the job's CA", ErrInvalid)
		}
		for i, in := range p.Inject {
			if !p.CA.covers(in.Host) {
				return fmt.Errorf("%w: inject[%d]: host %s is outside the CA's name constraints %v", ErrInvalid, i, in.Host, p.CA.Hosts())
			}
		}
	}
	return nil
}

// Rule is one entry of an allowlist: a host name, or every name below a
// domain ("*.pythonhosted.org"), on every port or on one.
type Rule struct {
	Host     string // lower case, no trailing dot; the domain for a wildcard
	Wildcard bool   // names below Host, at any depth (not Host itself)
	Port     uint16 // 0: any port
}

func (r Rule) String() string {
	s := r.Host
	if r.Wildcard {
		s = "*." + s
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}

// matchName says whether the rule covers name (normalized), whatever the
// port: DNS answers for a name any of whose ports is allowed.
func (r Rule) matchName(name string) bool {
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Host)
	}
	return name == r.Host
}

func (r Rule) match(name string, port uint16) bool {
	return r.matchName(name) && (r.Port == 0 || r.Port == port)
}

// RuleError says which rule of a list is wrong and why.
type RuleError struct {
	Index  int    // position in the list; -1 for a lone rule
	Value  string // the rule as given
	Reason string
}

func (e *RuleError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("allow rule %q: %s", e.Value, e.Reason)
	}
	return fmt.Sprintf("allow[%d] %q: %s", e.Index, e.Value, e.Reason)
}

func (e *RuleError) Unwrap() error { return ErrInvalid }

// ParseRule reads one allowlist entry: "pypi.org", "*.pythonhosted.org",
// "github.com:443".
func ParseRule(s string) (Rule, error) {
	r, reason := parseRule(s)
	if reason != "" {
		return Rule{}, &RuleError{Index: -1, Value: s, Reason: reason}
	}
	return r, nil
}

// ParseRules reads an allowlist; the error names the first bad entry.
func ParseRules(list []string) ([]Rule, error) {
	rules := make([]Rule, 0, len(list))
	for i, s := range list {
		r, reason := parseRule(s)
		if reason != "" {
			return nil, &RuleError{Index: i, Value: s, Reason: reason}
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func parseRule(s string) (Rule, string) {
	if s == "" {
		return Rule{}, "empty: give a host name such as pypi.org"
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@") {
		return Rule{}, "a host name, optionally *. before it and :port after it, not a URL"
	}
	var r Rule
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if strings.Count(s, ":") > 1 || strings.HasPrefix(s, "[") {
			return Rule{}, "an address, not a name: an allowlist names hosts"
		}
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return Rule{}, "the port after ':' must be a number from 1 to 65535"
		}
		host, r.Port = s[:i], uint16(p)
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard = true
		host = rest
	}
	if strings.Contains(host, "*") {
		return Rule{}, "a wildcard may only be a leading '*.' (as in *.pythonhosted.org)"
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return Rule{}, "an address, not a name: an allowlist names hosts"
	}
	name, reason := normalizeName(host)
	if reason != "" {
		return Rule{}, reason
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		return Rule{}, "*." + name + " would allow a whole top-level domain: name a domain below it"
	}
	r.Host = name
	return r, ""
}

// normalizeName lower-cases a host name and drops one trailing dot; it
// returns why the name is not one.
func normalizeName(s string) (string, string) {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", "empty host name"
	}
	if len(s) > 253 {
		return "", "a host name is at most 253 characters"
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return "", "empty label (two dots in a row)"
		}
		if len(label) > 63 {
			return "", "a label (between dots) is at most 63 characters"
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", "a label may not begin or end with '-'"
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 'A' && c <= 'Z':
			case c >= 0x80:
				return "", "not ASCII: write an international name in its xn-- form"
			default:
				return "", fmt.Sprintf("character %q is not allowed in a host name", c)
			}
		}
	}
	return strings.ToLower(s), ""
}

// Change is a widening of a job's allowlist, for the job's timeline.
type Change struct {
	Added []Rule
}

// Empty says whether the widening added nothing new.
func (c Change) Empty() bool { return len(c.Added) == 0 }

func (c Change) String() string {
	if c.Empty() {
		return "allowlist unchanged"
	}
	s := make([]string, len(c.Added))
	for i, r := range c.Added {
		s[i] = r.String()
	}
	return "allowlist widened: " + strings.Join(s, ", ")
}

// Widen returns the policy with the rules added (those it already has are
// left out of the change). Only an allowlist can be widened: egress already
// allows every name, and a job with no network has no route to widen.
// The engine stores the result, then calls Proxy.PolicyChanged.
func (p Policy) Widen(add ...Rule) (Policy, Change, error) {
	if p.Mode != Allowlist {
		return p, Change{}, fmt.Errorf("%w: only an allowlist can be widened (this policy is %s)", ErrInvalid, p.Mode)
	}
	var ch Change
	allow := slices.Clone(p.Allow)
	for _, r := range add {
		if _, err := ParseRule(r.String()); err != nil || r.Host == "" {
			return p, Change{}, fmt.Errorf("%w: widen: %q is not a parsed rule", ErrInvalid, r.String())
		}
		if slices.Contains(allow, r) {
			continue
		}
		allow = append(allow, r)
		ch.Added = append(ch.Added, r)
	}
	p.Allow = allow
	return p, ch, nil
}

// allowRule returns the rule of an allowlist that lets name:port through.
func (p Policy) allowRule(name string, port uint16) (Rule, bool) {
	for _, r := range p.Allow {
		if r.match(name, port) {
			return r, true
		}
	}
	return Rule{}, false
}

// allowsName says whether any port of name is allowed (for DNS).
func (p Policy) allowsName(name string) (Rule, bool) {
	for _, r := range p.Allow {
		if r.matchName(name) {
			return r, true
		}
	}
	return Rule{}, false
}

// injection returns the credential bound to host, if any.
func (p Policy) injection(host string) (Injection, bool) {
	for _, in := range p.Inject {
		if in.Host == host {
			return in, true
		}
	}
	return Injection{}, false
}
