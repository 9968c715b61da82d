package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		in      string
		want    Rule
		wantErr string
	}{
		{in: "pypi.org", want: Rule{Host: "pypi.org"}},
		{in: "PyPI.org.", want: Rule{Host: "pypi.org"}},
		{in: "*.pythonhosted.org", want: Rule{Host: "pythonhosted.org", Wildcard: true}},
		{in: "github.com:443", want: Rule{Host: "github.com", Port: 443}},
		{in: "*.example.co.uk:8443", want: Rule{Host: "example.co.uk", Wildcard: true, Port: 8443}},
		{in: "", wantErr: "empty"},
		{in: "https://pypi.org", wantErr: "not a URL"},
		{in: "pypi.org/simple", wantErr: "not a URL"},
		{in: "github.com:0", wantErr: "1 to 65535"},
		{in: "github.com:65536", wantErr: "1 to 65535"},
		{in: "github.com:https", wantErr: "1 to 65535"},
		{in: "10.0.0.1", wantErr: "an address, not a name"},
		{in: "[::1]:443", wantErr: "an address, not a name"},
		{in: "::1", wantErr: "an address, not a name"},
		{in: "*", wantErr: "leading '*.'"},
		{in: "*.com", wantErr: "whole top-level domain"},
		{in: "a.*.com", wantErr: "leading '*.'"},
		{in: "foo*.com", wantErr: "leading '*.'"},
		{in: "bad..name", wantErr: "two dots"},
		{in: "-bad.com", wantErr: "begin or end with '-'"},
		{in: "bücher.de", wantErr: "xn--"},
		{in: "a b.com", wantErr: "not allowed in a host name"},
		{in: strings.Repeat("a", 64) + ".com", wantErr: "63"},
	}
	for _, tt := range tests {
		got, err := ParseRule(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseRule(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("ParseRule(%q): %v does not wrap ErrInvalid", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if again, _ := ParseRule(got.String()); again != got {
			t.Errorf("ParseRule(%q).String() = %q does not read back", tt.in, got.String())
		}
	}
}

func TestParseRulesNamesTheEntry(t *testing.T) {
	_, err := ParseRules([]string{"pypi.org", "github.com:99999"})
	var re *RuleError
	if !errors.As(err, &re) || re.Index != 1 || !strings.Contains(err.Error(), `allow[1] "github.com:99999"`) {
		t.Fatalf("error %v does not name allow[1]", err)
	}
}

func TestRuleMatch(t *testing.T) {
	pol := Policy{Mode: Allowlist, Allow: mustRules(t, "pypi.org", "*.pythonhosted.org", "github.com:443")}
	tests := []struct {
		name string
		port uint16
		want string // the rule, "" for denied
	}{
		{"pypi.org", 443, "pypi.org"},
		{"pypi.org", 80, "pypi.org"},
		{"www.pypi.org", 443, ""},
		{"files.pythonhosted.org", 443, "*.pythonhosted.org"},
		{"a.b.pythonhosted.org", 443, "*.pythonhosted.org"},
		{"pythonhosted.org", 443, ""},
		{"evilpythonhosted.org", 443, ""},
		{"github.com", 443, "github.com:443"},
		{"github.com", 22, ""},
		{"api.github.com", 443, ""},
	}
	for _, tt := range tests {
		r, ok := pol.allowRule(tt.name, tt.port)
		got := ""
		if ok {
			got = r.String()
		}
		if got != tt.want {
			t.Errorf("%s:%d: allowed by %q, want %q", tt.name, tt.port, got, tt.want)
		}
	}
	// DNS answers for a name any port of which is allowed.
	if _, ok := pol.allowsName("github.com"); !ok {
		t.Error("github.com:443 does not let DNS answer for github.com")
	}
}

func TestVerdict(t *testing.T) {
	cb := netip.MustParseAddrPort("127.0.0.1:8765")
	allow := Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")}
	tests := []struct {
		name     string
		pol      Policy
		a        attempt
		wantOK   bool
		wantRule string
		askable  bool
	}{
		{"none", Policy{Mode: None}, attempt{name: "allowed.test", port: 443}, false, "network none", false},
		{"egress name", Policy{Mode: Egress}, attempt{name: "x.test", port: 443}, true, "egress", false},
		{"egress address", Policy{Mode: Egress}, attempt{addr: netip.MustParseAddr("203.0.113.9"), port: 80}, true, "egress", false},
		{"allowed", allow, attempt{name: "allowed.test", port: 443}, true, "allow allowed.test", false},
		{"not listed", allow, attempt{name: "denied.test", port: 443}, false, "not in allowlist", true},
		{"raw address", allow, attempt{addr: netip.MustParseAddr("203.0.113.9"), port: 443}, false, "raw address: an allowlist names hosts", false},
		{"callback", allow, attempt{addr: cb.Addr(), port: cb.Port()}, true, "callback 127.0.0.1:8765", false},
		{"callback other port", allow, attempt{addr: cb.Addr(), port: 22}, false, "raw address: an allowlist names hosts", false},
		{"callback none", Policy{Mode: None}, attempt{addr: cb.Addr(), port: cb.Port()}, false, "network none", false},
	}
	for _, tt := range tests {
		rule, ok, askable := verdict(tt.pol, &tt.a, cb, false)
		if ok != tt.wantOK || rule != tt.wantRule || askable != tt.askable {
			t.Errorf("%s: verdict = %q %v %v; want %q %v %v", tt.name, rule, ok, askable, tt.wantRule, tt.wantOK, tt.askable)
		}
	}
}

func TestWiden(t *testing.T) {
	pol := Policy{Mode: Allowlist, Allow: mustRules(t, "pypi.org")}
	wider, ch, err := pol.Widen(mustRules(t, "pypi.org", "*.pythonhosted.org")...)
	if err != nil {
		t.Fatal(err)
	}
	if got := ch.String(); got != "allowlist widened: *.pythonhosted.org" {
		t.Errorf("change = %q", got)
	}
	if len(pol.Allow) != 1 || len(wider.Allow) != 2 {
		t.Errorf("Widen changed the original (%v) or missed the new rule (%v)", pol.Allow, wider.Allow)
	}
	if _, ch, _ := wider.Widen(mustRules(t, "pypi.org")...); !ch.Empty() {
		t.Errorf("widening with a rule it has: %v", ch)
	}
	for _, m := range []Mode{None, Egress} {
		if _, _, err := (Policy{Mode: m}).Widen(mustRules(t, "x.test")...); !errors.Is(err, ErrInvalid) {
			t.Errorf("widening %s: %v, want ErrInvalid", m, err)
		}
	}
	if _, _, err := pol.Widen(Rule{Host: "bad..name"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("widening with an unparsed rule: %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	ca, err := NewCA([]string{"api.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	in, err := mustBinding(t, "TOKEN", "api.test Authorization Bearer {}").Inject("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := mustBinding(t, "OTHER", "other.test X-Key {}").Inject("v")
	tests := []struct {
		name    string
		pol     Policy
		wantErr string
	}{
		{"none", Policy{Mode: None}, ""},
		{"allowlist", Policy{Mode: Allowlist, Allow: mustRules(t, "a.test")}, ""},
		{"egress with rules", Policy{Mode: Egress, Allow: mustRules(t, "a.test")}, "only an allowlist"},
		{"bad mode", Policy{Mode: 7}, "mode"},
		{"injection without CA", Policy{Mode: Egress, Inject: []Injection{in}}, "needs the job's CA"},
		{"injection", Policy{Mode: Egress, Inject: []Injection{in}, CA: ca}, ""},
		{"injection outside the CA", Policy{Mode: Egress, Inject: []Injection{other}, CA: ca}, "outside the CA's name constraints"},
		{"unparsed rule", Policy{Mode: Allowlist, Allow: []Rule{{Host: "A..b"}}}, "allow[0]"},
	}
	for _, tt := range tests {
		err := tt.pol.Validate()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: Validate() = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

func mustRules(t testing.TB, s ...string) []Rule {
	t.Helper()
	rs, err := ParseRules(s)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
