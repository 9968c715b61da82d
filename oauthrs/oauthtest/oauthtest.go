// Package oauthtest runs a real OpenID provider for tests: zitadel's
// (github.com/zitadel/oidc/v3/pkg/op), with its discovery document, its
// JWKS and its token endpoint, on an httptest server. Its clients get
// JWT access tokens (RFC 9068) by the client credentials grant, signed
// with the provider's RS256 key, for the audience, subject, claims and
// lifetime a test gives each client. Beside zitadel's endpoints it offers
// dynamic client registration (RFC 7591, which zitadel's provider has
// not), as MCP clients expect of an issuer: a public client with the
// redirect URIs asked for.
package oauthtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Client is what the provider puts in the tokens of one client.
type Client struct {
	// Subject is the token's sub (default: the client's id).
	Subject string
	// Audience is the token's aud.
	Audience []string
	// Lifetime is how long its tokens live; negative: they were expired
	// when made (default five minutes).
	Lifetime time.Duration
	// Claims are more claims in its tokens (email, preferred_username).
	Claims map[string]any
	// ScopeClaim is the claim the scopes granted go in: scope (the
	// default: a space-separated string, RFC 9068) or another, as a list
	// (scp, as some issuers write it).
	ScopeClaim string
}

// Provider is a running OpenID provider.
type Provider struct {
	// Issuer is its URL (http://127.0.0.1:PORT), as it writes iss.
	Issuer   string
	srv      *httptest.Server
	store    *store
	mu       sync.Mutex
	requests map[string]int // by path
}

// Start runs a provider until the test ends.
func Start(t testing.TB) *Provider {
	t.Helper()
	st := &store{Storage: storage.NewStorage(storage.NewUserStore("http://localhost")), clients: map[string]*client{}, registered: map[string]op.Client{}}
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		t.Fatal(err)
	}
	provider, err := op.NewProvider(&op.Config{CryptoKey: key}, st, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	p := &Provider{Issuer: issuer, srv: srv, store: st, requests: map[string]int{}}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests[r.URL.Path]++
		p.mu.Unlock()
		switch {
		case r.URL.Path == "/register":
			p.register(w, r)
		case r.Method == http.MethodGet && (r.URL.Path == "/.well-known/openid-configuration" || r.URL.Path == "/.well-known/oauth-authorization-server"):
			p.discovery(provider, w, r)
		default:
			provider.ServeHTTP(w, r)
		}
	})
	srv.Start()
	t.Cleanup(srv.Close)
	return p
}

// KeyFetches is how many times its key set (JWKS) was fetched.
func (p *Provider) KeyFetches() int { return p.Requests("/keys") }

// Requests is how many requests it had for path.
func (p *Provider) Requests(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[path]
}

// AddClient registers a client that may use the client credentials grant.
func (p *Provider) AddClient(id, secret string, c Client) {
	if c.Subject == "" {
		c.Subject = id
	}
	if c.Lifetime == 0 {
		c.Lifetime = 5 * time.Minute
	}
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	p.store.clients[id] = &client{Client: storage.WebClient(id, secret), secret: secret, conf: c}
}

// Token gets an access token for a client from the provider's token
// endpoint, asking for scopes.
func (p *Provider) Token(t testing.TB, id, secret string, scopes ...string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {strings.Join(scopes, " ")}}
	req, err := http.NewRequest(http.MethodPost, p.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(id), url.QueryEscape(secret))
	resp, err := p.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.AccessToken == "" {
		t.Fatalf("token for %s: %s %v %s: %s", id, resp.Status, err, out.Error, out.Description)
	}
	return out.AccessToken
}

// store is the example's in-memory storage (keys, tokens) with clients of
// the test's.
type store struct {
	*storage.Storage
	mu      sync.Mutex
	clients map[string]*client
	// registered are the clients registered dynamically.
	registered map[string]op.Client
}

type client struct {
	*storage.Client
	secret string
	conf   Client
}

// The clients' tokens are JWTs, and they may use the client credentials
// grant.
func (c *client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials}
}
func (c *client) IsScopeAllowed(string) bool { return true }
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

func (s *store) client(id string) (*client, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	return c, ok
}

func (s *store) ClientCredentials(_ context.Context, id, secret string) (op.Client, error) {
	c, ok := s.client(id)
	if !ok || c.secret != secret {
		return nil, errors.New("wrong client id or secret")
	}
	return c, nil
}

func (s *store) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	if c, ok := s.client(id); ok {
		return c, nil
	}
	s.mu.Lock()
	c, ok := s.registered[id]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	return s.Storage.GetClientByClientID(ctx, id)
}

func (s *store) ClientCredentialsTokenRequest(_ context.Context, id string, scopes []string) (op.TokenRequest, error) {
	c, ok := s.client(id)
	if !ok {
		return nil, errors.New("wrong client id")
	}
	return &request{JWTTokenRequest: oidc.JWTTokenRequest{Subject: c.conf.Subject, Audience: c.conf.Audience, Scopes: scopes}, client: id}, nil
}

// request is a client credentials request that remembers its client, for
// CreateAccessToken and GetPrivateClaimsFromRequest.
type request struct {
	oidc.JWTTokenRequest
	client string
}

func (s *store) CreateAccessToken(ctx context.Context, r op.TokenRequest) (string, time.Time, error) {
	id, _, err := s.Storage.CreateAccessToken(ctx, r)
	if err != nil {
		return "", time.Time{}, err
	}
	lifetime := 5 * time.Minute
	if req, ok := r.(*request); ok {
		if c, ok := s.client(req.client); ok {
			lifetime = c.conf.Lifetime
		}
	}
	return id, time.Now().Add(lifetime), nil
}

// GetPrivateClaimsFromScopes adds the scopes granted (zitadel's provider
// leaves them to introspection; RFC 9068 puts them in scope), and the
// client's claims.
func (s *store) GetPrivateClaimsFromScopes(_ context.Context, _, clientID string, scopes []string) (map[string]any, error) {
	claims := map[string]any{}
	c, ok := s.client(clientID)
	if !ok {
		return claims, nil
	}
	if len(scopes) > 0 {
		switch c.conf.ScopeClaim {
		case "", "scope":
			claims["scope"] = strings.Join(scopes, " ")
		default:
			claims[c.conf.ScopeClaim] = scopes
		}
	}
	for k, v := range c.conf.Claims {
		claims[k] = v
	}
	return claims, nil
}

// discovery is the provider's metadata with the registration endpoint
// added.
func (p *Provider) discovery(provider http.Handler, w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	provider.ServeHTTP(rec, r)
	var doc map[string]any
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &doc) != nil {
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		return
	}
	doc["registration_endpoint"] = p.Issuer + "/register"
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(doc)
}

// register is dynamic client registration (RFC 7591): a public client
// using the authorization code grant with PKCE, at the redirect URIs
// asked for.
func (p *Provider) register(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RedirectURIs []string `json:"redirect_uris"`
		ClientName   string   `json:"client_name"`
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil || len(req.RedirectURIs) == 0 {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client_metadata", "error_description": "POST a JSON object with redirect_uris"})
		return
	}
	var b [8]byte
	rand.Read(b[:])
	id := "dyn-" + hex.EncodeToString(b[:])
	p.store.mu.Lock()
	p.store.registered[id] = storage.NativeClient(id, req.RedirectURIs...)
	p.store.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{
		"client_id": id, "client_id_issued_at": time.Now().Unix(), "client_name": req.ClientName,
		"redirect_uris": req.RedirectURIs, "grant_types": []string{"authorization_code", "refresh_token"},
		"response_types": []string{"code"}, "token_endpoint_auth_method": "none",
	})
}
