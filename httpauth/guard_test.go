package httpauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

// openTokens is a real SQLite store holding a token of alice's (jobs),
// a revoked one of bob's and an expired one of carol's; it returns the
// store and alice's secret.
func openTokens(t *testing.T) (*sqlite.DB, string) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	now := time.Now()
	for _, tok := range []delegate.Token{
		{ID: "tok-a", Principal: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs}, Hash: delegate.HashToken("alice-secret-0123456789"), CreatedAt: now},
		{ID: "tok-b", Principal: "bob", Scopes: []delegate.Scope{delegate.ScopeJobs}, Hash: delegate.HashToken("bob-secret-0123456789"), CreatedAt: now, RevokedAt: now},
		{ID: "tok-c", Principal: "carol", Scopes: []delegate.Scope{delegate.ScopeJobs}, Hash: delegate.HashToken("carol-secret-0123456789"), CreatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute)},
	} {
		if err := db.CreateToken(ctx, &tok); err != nil {
			t.Fatal(err)
		}
	}
	return db, "alice-secret-0123456789"
}

// issuer stands for an Extra authenticator: it knows "jwt-…" tokens.
type issuer struct{ calls int }

func (i *issuer) Authenticate(_ context.Context, bearer string) (*delegate.Principal, error) {
	i.calls++
	switch {
	case bearer == "jwt-expired":
		return nil, fmt.Errorf("the access token expired: %w", delegate.ErrUnauthenticated)
	case strings.HasPrefix(bearer, "jwt-"):
		return &delegate.Principal{Name: strings.TrimPrefix(bearer, "jwt-"), Scopes: []delegate.Scope{delegate.ScopeJobs}}, nil
	}
	return nil, ErrUnknownToken
}

func TestGuardPrincipals(t *testing.T) {
	db, alice := openTokens(t)
	iss := &issuer{}
	g := &Guard{Shared: mustNew(t, secret), Tokens: db, Extra: []Authenticator{iss}}
	var seen *delegate.Principal
	h := g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = delegate.PrincipalOf(r.Context())
		if CredentialOf(r.Context()) == nil {
			t.Error("an authenticated request carries no credential context")
		}
	}))
	for _, tc := range []struct {
		header, principal string
		admin             bool
		code              int
		body              string
	}{
		{"Bearer " + secret, delegate.LocalPrincipal, true, 200, ""},
		{"Bearer " + alice, "alice", false, 200, ""},
		{"Bearer jwt-dave", "dave", false, 200, ""},
		{"Bearer bob-secret-0123456789", "", false, 401, "tok-b of bob was revoked"},
		{"Bearer carol-secret-0123456789", "", false, 401, "tok-c of carol expired"},
		{"Bearer jwt-expired", "", false, 401, "access token expired"},
		{"Bearer nobody-knows-this-one", "", false, 401, "unknown token"},
		{"", "", false, 401, "no token"},
	} {
		seen = nil
		r := httptest.NewRequest("POST", "/mcp", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.body) {
			t.Errorf("%q: %d %q, want %d with %q", tc.header, w.Code, w.Body, tc.code, tc.body)
		}
		if tc.code == 401 && !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("%q: 401 without WWW-Authenticate", tc.header)
		}
		if tc.code == 200 && (seen == nil || seen.Name != tc.principal || seen.Admin() != tc.admin) {
			t.Errorf("%q: principal %+v, want %s (admin %v)", tc.header, seen, tc.principal, tc.admin)
		}
	}
	// The shared token and the store's come first: the issuer was asked
	// only of the tokens neither knows.
	if iss.calls != 3 {
		t.Errorf("the extra authenticator was asked %d times, want 3 (jwt-dave, jwt-expired, the unknown one)", iss.calls)
	}
}

func TestGuardOpen(t *testing.T) {
	db, _ := openTokens(t)
	g := &Guard{Tokens: db, Open: true}
	var seen *delegate.Principal
	h := g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = delegate.PrincipalOf(r.Context()) }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/mcp", nil))
	if w.Code != 200 || seen.Name != delegate.LocalPrincipal || !seen.Admin() {
		t.Errorf("open, no credentials: %d %+v, want the local operator", w.Code, seen)
	}
	// A token sent to an open server is still checked.
	r := httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Set("Authorization", "Bearer bob-secret-0123456789")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 401 {
		t.Errorf("open, a revoked token: %d, want 401", w.Code)
	}
}

// TestGuardRevocationEndsOpenRequests: a request in flight (an MCP event
// stream) with a token revoked meanwhile, by anyone sharing the store,
// ends at the next recheck; the token is refused from then on.
func TestGuardRevocationEndsOpenRequests(t *testing.T) {
	db, alice := openTokens(t)
	g := &Guard{Tokens: db}
	started, ended := make(chan struct{}), make(chan error, 1)
	h := g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		ended <- context.Cause(CredentialOf(r.Context()))
	}))
	r := httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Set("Authorization", "Bearer "+alice)
	go h.ServeHTTP(httptest.NewRecorder(), r)
	<-started
	g.recheck(context.Background(), time.Hour)
	select {
	case err := <-ended:
		t.Fatalf("a valid token's request ended at a recheck: %v", err)
	default:
	}
	if _, err := db.RevokeToken(context.Background(), "tok-a", time.Now()); err != nil {
		t.Fatal(err)
	}
	g.recheck(context.Background(), time.Hour)
	if err := <-ended; !errors.Is(err, delegate.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the open request ended with %v, want the revocation", err)
	}
	w := httptest.NewRecorder()
	r = httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Set("Authorization", "Bearer "+alice)
	g.Require(http.NotFoundHandler()).ServeHTTP(w, r)
	if w.Code != 401 || !strings.Contains(w.Body.String(), "revoked") {
		t.Errorf("a new request with the revoked token: %d %q", w.Code, w.Body)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.live) != 0 {
		t.Errorf("the revoked credential is still kept: %d", len(g.live))
	}
}

func TestGuardForgetsIdleCredentials(t *testing.T) {
	db, alice := openTokens(t)
	g := &Guard{Tokens: db}
	r := httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Set("Authorization", "Bearer "+alice)
	g.Require(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), r)
	g.recheck(context.Background(), time.Hour)
	if len(g.live) != 1 {
		t.Fatalf("live credentials %d, want 1", len(g.live))
	}
	g.recheck(context.Background(), time.Nanosecond)
	if len(g.live) != 0 {
		t.Errorf("an idle credential is kept: %d", len(g.live))
	}
}

func TestRequireScope(t *testing.T) {
	db, alice := openTokens(t)
	g := &Guard{Shared: mustNew(t, secret), Tokens: db}
	h := g.RequireScope(delegate.ScopeAdmin, "/metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for bearer, code := range map[string]int{secret: 200, alice: 403} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Header.Set("Authorization", "Bearer "+bearer)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != code {
			t.Errorf("%s: %d, want %d (%s)", bearer, w.Code, code, w.Body)
		}
	}
}

// TestGuardSessions: a browser signed in with a store token carries a
// cookie naming its hash; each request reads the token again, so a
// revoked one ends the session. A forged or shared-token v1 cookie is
// judged as it should be.
func TestGuardSessions(t *testing.T) {
	db, alice := openTokens(t)
	g := &Guard{Shared: mustNew(t, secret), Tokens: db}
	cookieOf := func(token string) (*http.Cookie, error) {
		w := httptest.NewRecorder()
		if _, err := g.SignIn(w, httptest.NewRequest("POST", "/login", nil), token); err != nil {
			return nil, err
		}
		return w.Result().Cookies()[0], nil
	}
	principal := func(c *http.Cookie) (*delegate.Principal, error) {
		r := httptest.NewRequest("GET", "/", nil)
		r.AddCookie(c)
		return g.SessionPrincipal(context.Background(), r)
	}
	c, err := cookieOf(alice)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(c.Value, alice) || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie %+v", c)
	}
	if p, err := principal(c); err != nil || p.Name != "alice" || p.Admin() {
		t.Errorf("alice's session: %+v %v", p, err)
	}
	op, err := cookieOf(secret)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := principal(op); err != nil || !p.Admin() {
		t.Errorf("the operator's session: %+v %v", p, err)
	}
	for _, bad := range []string{"bob-secret-0123456789", "nobody-knows-this-one", ""} {
		if _, err := cookieOf(bad); !errors.Is(err, delegate.ErrUnauthenticated) {
			t.Errorf("sign-in with %q: %v", bad, err)
		}
	}
	forged := *c
	forged.Value = strings.Replace(c.Value, ".", ".9", 1) // another expiry, the same MAC
	if _, err := principal(&forged); !errors.Is(err, delegate.ErrUnauthenticated) {
		t.Errorf("a forged cookie: %v", err)
	}
	w := httptest.NewRecorder()
	g.Shared.StartSession(w, httptest.NewRequest("POST", "/login", nil))
	if p, err := principal(w.Result().Cookies()[0]); err != nil || !p.Admin() {
		t.Errorf("a v1 session of the shared token: %+v %v", p, err)
	}
	if _, err := db.RevokeToken(context.Background(), "tok-a", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := principal(c); !errors.Is(err, delegate.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("alice's session after her token was revoked: %v", err)
	}
}
