package httpauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// An Authenticator turns a bearer token into the principal it stands for.
// The Guard tries its authenticators in order (the shared token, the
// store's tokens, then Guard.Extra: an issuer's access tokens): one that
// does not know the token returns an error wrapping ErrUnknownToken and
// the next is tried; any other error ends the request with it (an expired
// token, a wrong audience: the client is told why).
type Authenticator interface {
	Authenticate(ctx context.Context, bearer string) (*delegate.Principal, error)
}

// ErrUnknownToken: an authenticator does not know the token (the next may).
var ErrUnknownToken = fmt.Errorf("unknown token: %w", delegate.ErrUnauthenticated)

// TokenLookup finds delegate's own tokens by the hash of their secret
// (the store: delegate.TokenStore).
type TokenLookup interface {
	TokenByHash(ctx context.Context, hash string) (*delegate.Token, error)
}

// StoreTokens authenticates delegate's own tokens (delegate tokens
// create): the store keeps their hashes, so every server sharing it knows
// every token, and a revocation made by any of them.
type StoreTokens struct {
	Tokens TokenLookup
	Now    func() time.Time // nil: time.Now
}

// Authenticate looks the token's hash up.
func (s StoreTokens) Authenticate(ctx context.Context, bearer string) (*delegate.Principal, error) {
	t, err := s.Tokens.TokenByHash(ctx, delegate.HashToken(bearer))
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, ErrUnknownToken
	}
	if err != nil {
		return nil, fmt.Errorf("token lookup: %w", err)
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	switch {
	case !t.RevokedAt.IsZero():
		return nil, fmt.Errorf("token %s of %s was revoked at %s: %w", t.ID, t.Principal, t.RevokedAt.UTC().Format(time.RFC3339), delegate.ErrUnauthenticated)
	case !t.Valid(now()):
		return nil, fmt.Errorf("token %s of %s expired at %s: %w", t.ID, t.Principal, t.ExpiresAt.UTC().Format(time.RFC3339), delegate.ErrUnauthenticated)
	}
	return &delegate.Principal{Name: t.Principal, Scopes: t.Scopes}, nil
}

// Authenticate makes the shared token an Authenticator: it is the local
// operator (delegate.Local), as stdio and the CLI are.
func (t *Token) Authenticate(_ context.Context, bearer string) (*delegate.Principal, error) {
	if t != nil && t.Match(bearer) {
		return delegate.Local(), nil
	}
	return nil, ErrUnknownToken
}

// RecheckInterval is how often a Guard re-reads the credentials in use:
// a token revoked (by any server sharing the store, or the CLI) is
// refused to new requests at once, and ends the open ones within it and
// the store's read: under a second (at 1 s, a server sharing PostgreSQL
// took 1.001 s).
const RecheckInterval = 800 * time.Millisecond

// Guard admits HTTP requests by their bearer token and puts the principal
// it stands for in the request's context (delegate.WithPrincipal).
type Guard struct {
	// Shared is DELEGATE_HTTP_TOKEN, the local operator; nil: none.
	Shared *Token
	// Tokens are delegate's own (the store's); nil: none.
	Tokens TokenLookup
	// Extra are tried after them, in order (an issuer's access tokens).
	Extra []Authenticator
	// Open lets a request without an Authorization header through as the
	// local operator: a server on the loopback interface without
	// DELEGATE_HTTP_TOKEN, as before principals. A request that sends a
	// token is still checked.
	Open bool
	// Challenge writes a refused request's WWW-Authenticate header; nil:
	// the package's Challenge. An issuer's resource server names its
	// metadata there.
	Challenge func(w http.ResponseWriter, r *http.Request, err error)
	Logger    *slog.Logger

	mu   sync.Mutex
	live map[string]*credential // by the hash of the bearer
	key  []byte                 // signs session cookies without a shared token (session.go)
}

// credential is a bearer token in use: its context ends when a recheck
// finds it no longer valid, ending the requests (and the MCP sessions)
// made with it.
type credential struct {
	bearer   string
	ctx      context.Context
	cancel   context.CancelCauseFunc
	inFlight int
	lastUsed time.Time
}

// chain is the authenticators in order.
func (g *Guard) chain() []Authenticator {
	var out []Authenticator
	if g.Shared != nil {
		out = append(out, g.Shared)
	}
	if g.Tokens != nil {
		out = append(out, StoreTokens{Tokens: g.Tokens})
	}
	return append(out, g.Extra...)
}

// Authenticate is the principal bearer stands for, by the first
// authenticator that knows it.
func (g *Guard) Authenticate(ctx context.Context, bearer string) (*delegate.Principal, error) {
	if bearer == "" {
		return nil, fmt.Errorf("no token: send Authorization: Bearer <token>: %w", delegate.ErrUnauthenticated)
	}
	for _, a := range g.chain() {
		p, err := a.Authenticate(ctx, bearer)
		if errors.Is(err, ErrUnknownToken) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := delegate.CheckPrincipalName("principal", p.Name); err != nil {
			return nil, fmt.Errorf("the token names no usable principal (%v): %w", err, delegate.ErrUnauthenticated)
		}
		return p, nil
	}
	return nil, fmt.Errorf("unknown token: it is not DELEGATE_HTTP_TOKEN nor a token of delegate tokens list: %w", delegate.ErrUnauthenticated)
}

// BearerOf is r's bearer token, or "".
func BearerOf(r *http.Request) string {
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(cred)
}

// Principal authenticates r: the principal, and a context that ends
// when its credential stops being valid (nil for an open request), with
// a release to call when the request is over. Without credentials an
// open guard answers delegate.Local.
func (g *Guard) Principal(r *http.Request) (*delegate.Principal, context.Context, func(), error) {
	bearer := BearerOf(r)
	if bearer == "" && r.Header.Get("Authorization") == "" && g.Open {
		return delegate.Local(), nil, func() {}, nil
	}
	p, err := g.Authenticate(r.Context(), bearer)
	if err != nil {
		return nil, nil, nil, err
	}
	cred := g.use(bearer)
	return p, cred.ctx, func() { g.done(cred) }, nil
}

func (g *Guard) use(bearer string) *credential {
	key := delegate.HashToken(bearer)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live == nil {
		g.live = map[string]*credential{}
	}
	c := g.live[key]
	if c == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		c = &credential{bearer: bearer, ctx: ctx, cancel: cancel}
		g.live[key] = c
	}
	c.inFlight++
	c.lastUsed = time.Now()
	return c
}

func (g *Guard) done(c *credential) {
	g.mu.Lock()
	c.inFlight--
	c.lastUsed = time.Now()
	g.mu.Unlock()
}

// Require admits only authenticated requests (API clients: /mcp,
// /metrics), with their principal in the context, ending each when its
// credential is revoked; the others get 401 (or 403 for a principal the
// authenticator refuses) with WWW-Authenticate.
func (g *Guard) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, cred, release, err := g.Principal(r)
		if err != nil {
			g.refuse(w, r, err)
			return
		}
		defer release()
		ctx := delegate.WithPrincipal(r.Context(), p)
		if cred != nil {
			ctx = WithCredential(ctx, cred)
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			stop := context.AfterFunc(cred, cancel)
			defer stop()
			defer cancel()
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// refuse answers a request that was not admitted.
func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := http.StatusUnauthorized, "unauthorized: "+err.Error()
	switch delegate.ErrorKind(err) {
	case delegate.KindUnauthenticated:
	case delegate.KindForbidden:
		code, msg = http.StatusForbidden, "forbidden: "+err.Error()
	default:
		g.logger().Error("authenticating a request", "err", err)
		code, msg = http.StatusServiceUnavailable, "the server cannot check tokens now; try again later"
	}
	if g.Challenge != nil {
		g.Challenge(w, r, err)
	} else if code == http.StatusUnauthorized {
		Challenge(w, r)
	}
	http.Error(w, msg, code)
}

func (g *Guard) logger() *slog.Logger {
	if g.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Logger
}

type credentialKey struct{}

// WithCredential is ctx carrying the context of the credential a request
// came with, which ends when it is revoked: what outlives the request (an
// MCP session) ends with it too (CredentialOf).
func WithCredential(ctx context.Context, cred context.Context) context.Context {
	return context.WithValue(ctx, credentialKey{}, cred)
}

// CredentialOf is the context of ctx's credential, or nil.
func CredentialOf(ctx context.Context) context.Context {
	c, _ := ctx.Value(credentialKey{}).(context.Context)
	return c
}

// Recheck re-authenticates every credential in use every interval
// (RecheckInterval when 0) until ctx ends: one revoked or expired ends
// its requests and sessions; one unused for idle (and with no request in
// flight) is forgotten. Run it beside the HTTP server.
func (g *Guard) Recheck(ctx context.Context, interval, idle time.Duration) error {
	if interval <= 0 {
		interval = RecheckInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			g.recheck(ctx, idle)
		}
	}
}

func (g *Guard) recheck(ctx context.Context, idle time.Duration) {
	g.mu.Lock()
	creds := make(map[string]*credential, len(g.live))
	for k, c := range g.live {
		if idle > 0 && c.inFlight == 0 && time.Since(c.lastUsed) > idle {
			delete(g.live, k) // its sessions have timed out too
			continue
		}
		creds[k] = c
	}
	g.mu.Unlock()
	for k, c := range creds {
		_, err := g.Authenticate(ctx, c.bearer)
		if err == nil || delegate.ErrorKind(err) != delegate.KindUnauthenticated {
			continue // valid, or the store is unreachable: keep it for now
		}
		g.logger().Info("a token in use is no longer valid: its requests and sessions end", "err", err)
		c.cancel(err)
		g.mu.Lock()
		if g.live[k] == c {
			delete(g.live, k)
		}
		g.mu.Unlock()
	}
}

// RequireScope is Require for what needs scope s (/metrics: admin): a
// principal without it gets 403 naming the scope.
func (g *Guard) RequireScope(s delegate.Scope, what string, next http.Handler) http.Handler {
	return g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := delegate.PrincipalOf(r.Context()).Need(s, what); err != nil {
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	}))
}
