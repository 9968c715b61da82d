package oauthrs_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/oauthrs"
	"github.com/delegate-dev/delegate/oauthrs/oauthtest"
	jose "github.com/go-jose/go-jose/v4"
)

const resource = "http://127.0.0.1:8080/mcp"

func newVerifier(t *testing.T, c oauthrs.Config) *oauthrs.Verifier {
	t.Helper()
	if c.Resource == "" {
		c.Resource = resource
	}
	v, err := oauthrs.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// payload is a JWT's claims, unverified (to make forgeries of).
func payload(t *testing.T, jwt string) map[string]any {
	t.Helper()
	parts := strings.Split(jwt, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	return claims
}

// withPayload is jwt with its claims replaced and its signature kept.
func withPayload(t *testing.T, jwt string, claims map[string]any) string {
	t.Helper()
	raw, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(jwt, ".")
	return parts[0] + "." + base64.RawURLEncoding.EncodeToString(raw) + "." + parts[2]
}

// forge signs claims with a key of its own, naming the key id kid.
func forge(t *testing.T, claims map[string]any, kid string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(claims)
	sig, err := signer.Sign(raw)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sig.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func kidOf(t *testing.T, jwt string) string {
	t.Helper()
	jws, err := jose.ParseSigned(jwt, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	return jws.Signatures[0].Header.KeyID
}

// TestAuthenticate: tokens of a real OpenID provider, accepted and
// refused, each refusal with the RFC 6750 code a client acts on and words
// saying what to change.
func TestAuthenticate(t *testing.T) {
	op := oauthtest.Start(t)
	other := oauthtest.Start(t) // an issuer this server does not accept
	op.AddClient("agent", "s1", oauthtest.Client{Subject: "agent-7", Audience: []string{resource}})
	op.AddClient("two-audiences", "s1", oauthtest.Client{Subject: "agent-8", Audience: []string{"https://other.example/api", resource}})
	op.AddClient("elsewhere", "s1", oauthtest.Client{Audience: []string{"https://other.example/mcp"}})
	op.AddClient("expired", "s1", oauthtest.Client{Audience: []string{resource}, Lifetime: -time.Minute})
	other.AddClient("agent", "s1", oauthtest.Client{Subject: "agent-7", Audience: []string{resource}})
	v := newVerifier(t, oauthrs.Config{Issuers: []string{op.Issuer}})
	host := strings.TrimPrefix(op.Issuer, "http://")

	valid := op.Token(t, "agent", "s1", "openid", "delegate:jobs", "delegate:sandboxes")
	claims := payload(t, valid)
	tampered := maps(claims, "sub", "agent-admin")
	for _, tc := range []struct {
		name, token string
		principal   string
		scopes      []delegate.Scope
		code        string // RFC 6750 error; "" accepted
		status      int
		reason      string
	}{
		{name: "valid", token: valid, principal: host + ":agent-7", scopes: []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}},
		{name: "admin", token: op.Token(t, "agent", "s1", "delegate:admin"), principal: host + ":agent-7", scopes: []delegate.Scope{delegate.ScopeAdmin}},
		{name: "one of two audiences", token: op.Token(t, "two-audiences", "s1", "delegate:jobs"), principal: host + ":agent-8", scopes: []delegate.Scope{delegate.ScopeJobs}},
		{name: "wrong audience", token: op.Token(t, "elsewhere", "s1", "delegate:jobs"), code: "invalid_token", status: 401,
			reason: "not for this server: its aud must hold " + resource},
		{name: "wrong issuer", token: other.Token(t, "agent", "s1", "delegate:jobs"), code: "invalid_token", status: 401,
			reason: "issued by \"" + other.Issuer + "\", which this server does not accept (it accepts " + op.Issuer + ")"},
		{name: "expired", token: op.Token(t, "expired", "s1", "delegate:jobs"), code: "invalid_token", status: 401, reason: "the access token expired at"},
		{name: "tampered", token: withPayload(t, valid, tampered), code: "invalid_token", status: 401,
			reason: "signature does not verify with the issuer's published keys"},
		{name: "forged with the issuer's key id", token: forge(t, claims, kidOf(t, valid)), code: "invalid_token", status: 401,
			reason: "signature does not verify with the issuer's published keys"},
		{name: "forged with a key id of its own", token: forge(t, claims, "made-up"), code: "invalid_token", status: 401,
			reason: `publishes no key "made-up"`},
		{name: "no delegate scope", token: op.Token(t, "agent", "s1", "openid", "profile"), code: "insufficient_scope", status: 403,
			reason: "has none of delegate's scopes"},
		{name: "opaque", token: "2YotnFZFEjr1zCsicMWpAA", code: "invalid_token", status: 401,
			reason: "not a JWT: delegate accepts only JWT access tokens (RFC 9068) from " + op.Issuer + "; opaque tokens are refused"},
		{name: "unsigned", token: withPayload(t, "eyJhbGciOiJub25lIn0..x", claims), code: "invalid_token", status: 401, reason: "is not a JWT signed with one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Authenticate(context.Background(), tc.token)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.Name != tc.principal || !slices.Equal(p.Scopes, tc.scopes) {
					t.Fatalf("principal %q scopes %v, want %q %v", p.Name, p.Scopes, tc.principal, tc.scopes)
				}
				return
			}
			var te *oauthrs.TokenError
			if !errors.As(err, &te) || te.Code != tc.code || oauthrs.Status(err) != tc.status {
				t.Fatalf("principal %v error %v, want %s (%d)", p, err, tc.code, tc.status)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q, want it to say %q", err, tc.reason)
			}
			// The challenge names the metadata, the code, and the words,
			// their quotes made safe for a quoted-string.
			want := `Bearer resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp", error="` + tc.code +
				`", error_description="` + strings.ReplaceAll(err.Error(), `"`, "'") + `"`
			if got := v.Challenge("", err); !strings.HasPrefix(got, want) {
				t.Fatalf("challenge\n%s\nwant it to start\n%s", got, want)
			}
		})
	}
}

func maps(m map[string]any, k string, v any) map[string]any {
	out := map[string]any{}
	for key, val := range m {
		out[key] = val
	}
	out[k] = v
	return out
}

// TestPrincipalClaims: the configured claim names the principal, prefixed
// by its issuer; scopes may come as scp; a token without the claim, or
// with one that names nothing, is refused.
func TestPrincipalClaims(t *testing.T) {
	op := oauthtest.Start(t)
	host := strings.TrimPrefix(op.Issuer, "http://")
	op.AddClient("bob", "s", oauthtest.Client{Audience: []string{resource}, ScopeClaim: "scp",
		Claims: map[string]any{"email": "bob@example.com", "preferred_username": "local"}})
	op.AddClient("nameless", "s", oauthtest.Client{Audience: []string{resource}, Claims: map[string]any{"email": 42}})
	byEmail := newVerifier(t, oauthrs.Config{Issuers: []string{op.Issuer}, NameClaim: "email"})
	p, err := byEmail.Authenticate(context.Background(), op.Token(t, "bob", "s", "delegate:sandboxes", "delegate:jobs", "other:scope"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != host+":bob@example.com" || !slices.Equal(p.Scopes, []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}) {
		t.Fatalf("principal %+v", p)
	}
	// A user who calls themselves "local" is not the local user.
	byUsername := newVerifier(t, oauthrs.Config{Issuers: []string{op.Issuer}, NameClaim: "preferred_username"})
	if p, err := byUsername.Authenticate(context.Background(), op.Token(t, "bob", "s", "delegate:jobs")); err != nil || p.Name != host+":local" || p.Name == delegate.LocalPrincipal {
		t.Fatalf("principal %v, %v", p, err)
	}
	for _, tc := range []struct{ claim, client, want string }{
		{"email", "nameless", "the access token's email claim must be a non-empty string, which names its principal (got 42)"},
		{"upn", "bob", "the access token has no upn claim, which names its principal here (DELEGATE_OAUTH_NAME_CLAIM)"},
	} {
		v := newVerifier(t, oauthrs.Config{Issuers: []string{op.Issuer}, NameClaim: tc.claim})
		_, err := v.Authenticate(context.Background(), op.Token(t, tc.client, "s", "delegate:jobs"))
		if err == nil || err.Error() != tc.want || oauthrs.Status(err) != 401 {
			t.Errorf("%s of %s: %v, want %q", tc.claim, tc.client, err, tc.want)
		}
	}
}

// TestKeysCached: the issuer's keys are fetched once for many tokens, and
// tokens naming keys it does not have (a rotation, or an attacker's
// made-up ids) refetch them at most once in a while.
func TestKeysCached(t *testing.T) {
	op := oauthtest.Start(t)
	op.AddClient("agent", "s", oauthtest.Client{Audience: []string{resource}})
	v := newVerifier(t, oauthrs.Config{Issuers: []string{op.Issuer}})
	valid := op.Token(t, "agent", "s", "delegate:jobs")
	for range 5 {
		if _, err := v.Authenticate(context.Background(), valid); err != nil {
			t.Fatal(err)
		}
	}
	if n := op.KeyFetches(); n != 1 {
		t.Fatalf("%d key fetches for five tokens, want 1", n)
	}
	claims := payload(t, valid)
	for i := range 5 {
		_, err := v.Authenticate(context.Background(), forge(t, claims, "made-up-"+string(rune('a'+i))))
		if oauthrs.Status(err) != 401 {
			t.Fatalf("forged token: %v", err)
		}
	}
	if n := op.KeyFetches(); n != 1 {
		t.Fatalf("%d key fetches after five unknown key ids moments after the first fetch, want 1", n)
	}
}

// TestIssuerUnreachable: an issuer that cannot be reached is the server's
// trouble, not the token's: 503, saying which issuer, and the server
// starts regardless.
func TestIssuerUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	op := oauthtest.Start(t)
	op.AddClient("agent", "s", oauthtest.Client{Audience: []string{resource}})
	token := op.Token(t, "agent", "s", "delegate:jobs")
	v := newVerifier(t, oauthrs.Config{Issuers: []string{srv.URL}})
	_, err := v.Authenticate(context.Background(), withPayload(t, token, maps(payload(t, token), "iss", srv.URL)))
	if !errors.Is(err, delegate.ErrUnavailable) || oauthrs.Status(err) != 503 ||
		!strings.Contains(err.Error(), "the issuer "+srv.URL+" could not be reached to check the token (OpenID discovery at "+srv.URL+"/.well-known/openid-configuration)") {
		t.Fatalf("%v (status %d)", err, oauthrs.Status(err))
	}
}

// TestConfigCheck: each bad setting is named with its rule.
func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		c    oauthrs.Config
		want string
	}{
		{oauthrs.Config{Resource: resource}, "DELEGATE_OAUTH_ISSUERS: name at least one issuer URL"},
		{oauthrs.Config{Issuers: []string{"id.example.com"}, Resource: resource}, `DELEGATE_OAUTH_ISSUERS: "id.example.com" must be an absolute https URL`},
		{oauthrs.Config{Issuers: []string{"http://id.example.com"}, Resource: resource}, `DELEGATE_OAUTH_ISSUERS: "http://id.example.com" must be https (http only on the loopback interface`},
		{oauthrs.Config{Issuers: []string{"https://id.example.com"}}, "DELEGATE_OAUTH_RESOURCE: must be set with DELEGATE_OAUTH_ISSUERS"},
		{oauthrs.Config{Issuers: []string{"https://id.example.com"}, Resource: "https://d.example.com/mcp#x"}, "must have no query or fragment"},
		{oauthrs.Config{Issuers: []string{"https://id.example.com"}, Resource: "ftp://d.example.com/mcp"}, "DELEGATE_OAUTH_RESOURCE: \"ftp://d.example.com/mcp\" must be an absolute https URL"},
		{oauthrs.Config{Issuers: []string{"https://id.example.com"}, Resource: resource, NameClaim: "e mail"}, "DELEGATE_OAUTH_NAME_CLAIM: \"e mail\" must be a claim's name"},
	} {
		if _, err := oauthrs.New(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
	if _, err := oauthrs.New(oauthrs.Config{Issuers: []string{"https://id.example.com", "http://localhost:5556/realms/x"}, Resource: "https://d.example.com/mcp"}); err != nil {
		t.Error(err)
	}
}

// TestMetadata: the Protected Resource Metadata names the issuers, the
// resource and the scopes, at the root well-known path and at the one
// followed by the resource's path, which the challenge names.
func TestMetadata(t *testing.T) {
	v := newVerifier(t, oauthrs.Config{Issuers: []string{"https://id.example.com", "https://login.example.org/realms/team"}, Resource: "https://d.example.com/tools/mcp"})
	if got, want := v.MetadataURL(), "https://d.example.com/.well-known/oauth-protected-resource/tools/mcp"; got != want {
		t.Fatalf("metadata URL %s, want %s", got, want)
	}
	if got := v.MetadataPaths(); !slices.Equal(got, []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/tools/mcp"}) {
		t.Fatalf("paths %v", got)
	}
	w := httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(w, httptest.NewRequest("GET", "/.well-known/oauth-protected-resource/tools/mcp", nil))
	var doc map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	want := map[string]any{
		"resource":                 "https://d.example.com/tools/mcp",
		"authorization_servers":    []any{"https://id.example.com", "https://login.example.org/realms/team"},
		"scopes_supported":         []any{"delegate:jobs", "delegate:sandboxes", "delegate:admin"},
		"bearer_methods_supported": []any{"header"},
		"resource_name":            "delegate",
	}
	if a, b := mustJSON(t, doc), mustJSON(t, want); a != b {
		t.Fatalf("document\n%s\nwant\n%s", a, b)
	}
	if got, want := v.Challenge("delegate", nil), `Bearer realm="delegate", resource_metadata="https://d.example.com/.well-known/oauth-protected-resource/tools/mcp", scope="delegate:jobs delegate:sandboxes"`; got != want {
		t.Fatalf("challenge without a token\n%s\nwant\n%s", got, want)
	}
	w = httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(w, httptest.NewRequest("POST", "/.well-known/oauth-protected-resource", nil))
	if w.Code != 405 {
		t.Fatalf("POST: %d", w.Code)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestChallengeFunc: the header a Guard's refusal gets: no error code
// for a request without credentials, the code and words for a refused
// one (another authenticator's refusal is invalid_token, or
// insufficient_scope for a missing scope), nothing for the server's own
// trouble.
func TestChallengeFunc(t *testing.T) {
	v := newVerifier(t, oauthrs.Config{Issuers: []string{"https://id.example.com"}})
	challenge := v.ChallengeFunc("delegate")
	const prefix = `Bearer realm="delegate", resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"`
	scopeErr := &delegate.ScopeError{Principal: "id.example.com:bob", Scope: delegate.ScopeAdmin, What: "/metrics"}
	for _, tc := range []struct {
		name, auth string
		err        error
		want       string
	}{
		{"no credentials", "", errors.New("no token: send Authorization: Bearer <token>"), prefix + `, scope="delegate:jobs delegate:sandboxes"`},
		{"revoked token", "Bearer x", errors.New(`token tok-1 of "bob" was revoked`),
			prefix + `, error="invalid_token", error_description="token tok-1 of 'bob' was revoked", scope="delegate:jobs delegate:sandboxes"`},
		{"scope", "Bearer x", scopeErr, prefix + `, error="insufficient_scope", error_description="` + scopeErr.Error() + `", scope="delegate:admin"`},
		{"issuer away", "Bearer x", fmt.Errorf("x: %w", delegate.ErrUnavailable), ""},
	} {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		challenge(w, r, tc.err)
		if got := w.Header().Get("WWW-Authenticate"); got != tc.want {
			t.Errorf("%s:\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}
