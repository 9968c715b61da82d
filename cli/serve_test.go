package cli_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/cli"
)

const goodToken = "serve-test-token-0123456789abcdef"

var oauthEnv = map[string]string{"DELEGATE_OAUTH_ISSUERS": "https://id.example.com", "DELEGATE_OAUTH_RESOURCE": "https://delegate.example.com/mcp"}

// withEnv is env with k set to v.
func withEnv(env map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for key, val := range env {
		if key != k {
			out[key] = val
		}
	}
	return out
}

func TestServeHTTPToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("  "+goodToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	openFile := filepath.Join(dir, "open")
	if err := os.WriteFile(openFile, []byte(goodToken), 0o644); err != nil {
		t.Fatal(err)
	}
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		env   map[string]string
		args  []string
		code  int
		err   string // in stderr
		token bool   // serve got a token
		oauth bool   // serve got an issuer's verifier
	}{
		{name: "loopback without a token", args: []string{"--http", "127.0.0.1:8080"}},
		{name: "localhost without a token", args: []string{"--http", "localhost:0"}},
		{name: "ipv6 loopback without a token", args: []string{"--http", "[::1]:0"}},
		{name: "every interface without a token", args: []string{"--http", ":8080"}, code: 2,
			err: "--http :8080 accepts connections from other machines, and no token is set: set DELEGATE_HTTP_TOKEN (or DELEGATE_HTTP_TOKEN_FILE) so that /mcp, the dashboard and /metrics require it, or DELEGATE_OAUTH_ISSUERS"},
		{name: "0.0.0.0 without a token", args: []string{"--http", "0.0.0.0:8080"}, code: 2, err: "set DELEGATE_HTTP_TOKEN"},
		{name: "a LAN address without a token", args: []string{"--http", "192.168.1.5:8080"}, code: 2, err: "set DELEGATE_HTTP_TOKEN"},
		{name: "every interface with a token", env: map[string]string{"DELEGATE_HTTP_TOKEN": goodToken},
			args: []string{"--http", "0.0.0.0:8080"}, token: true},
		{name: "loopback with a token", env: map[string]string{"DELEGATE_HTTP_TOKEN": goodToken},
			args: []string{"--http", "127.0.0.1:8080"}, token: true},
		{name: "token file", env: map[string]string{"DELEGATE_HTTP_TOKEN_FILE": tokenFile},
			args: []string{"--http", "0.0.0.0:8080"}, token: true},
		{name: "token file others can read", env: map[string]string{"DELEGATE_HTTP_TOKEN_FILE": openFile},
			args: []string{"--http", "0.0.0.0:8080"}, code: 2, err: "mode 0644 lets others read it: chmod 600"},
		{name: "empty token file", env: map[string]string{"DELEGATE_HTTP_TOKEN_FILE": emptyFile},
			args: []string{"--http", "0.0.0.0:8080"}, code: 2, err: "DELEGATE_HTTP_TOKEN_FILE=" + emptyFile + ": the file is empty"},
		{name: "missing token file", env: map[string]string{"DELEGATE_HTTP_TOKEN_FILE": filepath.Join(dir, "nope")},
			args: []string{"--http", "127.0.0.1:0"}, code: 2, err: "DELEGATE_HTTP_TOKEN_FILE: open"},
		{name: "both", env: map[string]string{"DELEGATE_HTTP_TOKEN": goodToken, "DELEGATE_HTTP_TOKEN_FILE": tokenFile},
			args: []string{"--http", "127.0.0.1:0"}, code: 2, err: "set one, not both"},
		{name: "weak token", env: map[string]string{"DELEGATE_HTTP_TOKEN": "hunter2"},
			args: []string{"--http", "127.0.0.1:0"}, code: 2, err: "DELEGATE_HTTP_TOKEN: must be at least 16 characters"},
		{name: "stdio ignores the token", env: map[string]string{"DELEGATE_HTTP_TOKEN": "hunter2"}},
		{name: "max sessions", args: []string{"--http", "127.0.0.1:0", "--max-sessions", "0"}, code: 2, err: "--max-sessions: must be from 1"},
		{name: "tls needs both", args: []string{"--http", "127.0.0.1:0", "--tls-cert", "c.pem"}, code: 2, err: "give both"},
		{name: "tls needs http", args: []string{"--tls-key", "k.pem"}, code: 2, err: "--tls-key: only with --http"},
		{name: "bad address", args: []string{"--http", "8080"}, code: 2, err: "must be HOST:PORT"},
		{name: "an issuer on loopback", env: oauthEnv, args: []string{"--http", "127.0.0.1:8080"}, oauth: true},
		{name: "an issuer and a token beyond loopback", env: withEnv(oauthEnv, "DELEGATE_HTTP_TOKEN", goodToken),
			args: []string{"--http", "0.0.0.0:8080"}, token: true, oauth: true},
		{name: "an issuer beyond loopback without a token", env: oauthEnv, args: []string{"--http", "0.0.0.0:8080"}, oauth: true},
		{name: "an issuer without its resource", env: withEnv(oauthEnv, "DELEGATE_OAUTH_RESOURCE", ""), args: []string{"--http", "127.0.0.1:8080"}, code: 2,
			err: "DELEGATE_OAUTH_RESOURCE: must be set with DELEGATE_OAUTH_ISSUERS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness()
			for k, v := range tc.env {
				h.env[k] = v
			}
			var got *cli.ServeOptions
			h.serve = func(o cli.ServeOptions) error { got = &o; return nil }
			r := h.run(t, append([]string{"serve"}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.err) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.err)
			}
			if tc.code != 0 {
				if got != nil {
					t.Fatal("served anyway")
				}
				return
			}
			if got == nil {
				t.Fatal("did not serve")
			}
			if (got.Token != nil) != tc.token {
				t.Fatalf("token %v, want one: %v", got.Token, tc.token)
			}
			if (got.OAuth != nil) != tc.oauth || tc.oauth && got.OAuth.Resource() != oauthEnv["DELEGATE_OAUTH_RESOURCE"] {
				t.Fatalf("issuer's verifier %v, want one: %v", got.OAuth, tc.oauth)
			}
			if tc.token {
				req := httptest.NewRequest("GET", "/mcp", nil)
				req.Header.Set("Authorization", "Bearer "+goodToken)
				if !got.Token.Bearer(req) {
					t.Error("the token loaded is not the one configured")
				}
			}
		})
	}
}
