package cli

import (
	"slices"
	"strings"
	"testing"
)

// TestOAuthConfig: DELEGATE_OAUTH_* are read together, each mistake named
// with its rule; none set is no issuer.
func TestOAuthConfig(t *testing.T) {
	host := hostInfo{CPUs: 8, MemoryBytes: 32 << 30}
	for _, tc := range []struct {
		env     map[string]string
		issuers []string
		want    string // an error line; "" none
	}{
		{env: map[string]string{}},
		{env: map[string]string{"DELEGATE_OAUTH_ISSUERS": " https://id.example.com , https://login.example.org/realms/team", "DELEGATE_OAUTH_RESOURCE": "https://d.example.com/mcp"},
			issuers: []string{"https://id.example.com", "https://login.example.org/realms/team"}},
		{env: map[string]string{"DELEGATE_OAUTH_RESOURCE": "https://d.example.com/mcp"}, want: "DELEGATE_OAUTH_ISSUERS: name at least one issuer URL"},
		{env: map[string]string{"DELEGATE_OAUTH_ISSUERS": "https://id.example.com"}, want: "DELEGATE_OAUTH_RESOURCE: must be set with DELEGATE_OAUTH_ISSUERS"},
		{env: map[string]string{"DELEGATE_OAUTH_ISSUERS": "http://id.example.com", "DELEGATE_OAUTH_RESOURCE": "https://d.example.com/mcp"},
			want: `DELEGATE_OAUTH_ISSUERS: "http://id.example.com" must be https (http only on the loopback interface`},
		{env: map[string]string{"DELEGATE_OAUTH_NAME_CLAIM": "a b"}, want: `DELEGATE_OAUTH_NAME_CLAIM: "a b" must be a claim's name`},
	} {
		c, err := loadConfig(func(k string) string { return tc.env[k] }, host)
		if tc.want == "" {
			if err != nil || !slices.Equal(c.OAuth.Issuers, tc.issuers) {
				t.Errorf("%v: issuers %q, %v", tc.env, c.OAuth.Issuers, err)
			}
			if v, err := c.OAuthVerifier(); err != nil || (v == nil) != (len(tc.issuers) == 0) {
				t.Errorf("%v: verifier %v, %v", tc.env, v, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "\n  "+tc.want) {
			t.Errorf("%v: %v, want a line %q", tc.env, err, tc.want)
		}
	}
}
