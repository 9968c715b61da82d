package httpauth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// Dashboard sessions of principals: a browser signs in once with a token
// (the shared one, or one of delegate's own) and then carries a cookie
// naming the credential, never the token itself: "v2.<expiry>.<cred>.<MAC>",
// cred "local" for the shared token or the hash of a store token. Each
// request re-reads a store token by its hash, so a revoked token signs
// its browsers out at once. An issuer's access tokens cannot sign in
// here (the cookie could not be checked again without the token).

// localCred names the shared token in a session cookie.
const localCred = "local"

// sessionKey is the key that signs the cookies: the shared token's, so
// that servers sharing it accept each other's sessions; without one, a
// key of this process's.
func (g *Guard) sessionKey() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.Shared != nil {
		return g.Shared.key
	}
	if g.key == nil {
		g.key = make([]byte, 32)
		rand.Read(g.key)
	}
	return g.key
}

func (g *Guard) sessionAge() time.Duration {
	if g.Shared != nil {
		return g.Shared.SessionAge
	}
	return DefaultSessionAge
}

func (g *Guard) sessionMAC(expiry int64, cred string) []byte {
	m := hmac.New(sha256.New, g.sessionKey())
	m.Write([]byte("v2." + strconv.FormatInt(expiry, 10) + "." + cred))
	return m.Sum(nil)
}

// SignIn checks a token sent through a sign-in form and, if it names a
// principal that may sign in, starts the browser's session (the cookie
// as Token.StartSession sets it).
func (g *Guard) SignIn(w http.ResponseWriter, r *http.Request, token string) (*delegate.Principal, error) {
	token = strings.TrimSpace(token)
	var cred string
	switch {
	case token == "":
		return nil, fmt.Errorf("no token given: %w", delegate.ErrUnauthenticated)
	case g.Shared != nil && g.Shared.Match(token):
		cred = localCred
	case g.Tokens != nil:
		cred = delegate.HashToken(token)
	default:
		return nil, fmt.Errorf("unknown token: %w", delegate.ErrUnauthenticated)
	}
	var p *delegate.Principal
	var err error
	if cred == localCred {
		p = delegate.Local()
	} else if p, err = (StoreTokens{Tokens: g.Tokens}).Authenticate(r.Context(), token); errors.Is(err, ErrUnknownToken) {
		return nil, fmt.Errorf("unknown token: it is not DELEGATE_HTTP_TOKEN nor one of 'delegate tokens list' (an issuer's access token cannot sign in here): %w", delegate.ErrUnauthenticated)
	}
	if err != nil {
		return nil, err
	}
	age := g.sessionAge()
	expires := time.Now().Add(age)
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    "v2." + strconv.FormatInt(expires.Unix(), 10) + "." + cred + "." + base64.RawURLEncoding.EncodeToString(g.sessionMAC(expires.Unix(), cred)),
		Path:     "/",
		Expires:  expires,
		MaxAge:   int(age.Seconds()),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return p, nil
}

// SessionPrincipal is the principal of r's session cookie, or an error
// (ErrUnauthenticated without a valid one, or with one whose token has
// been revoked or has expired). A session of the shared token's first
// form (v1) is the local operator's.
func (g *Guard) SessionPrincipal(ctx context.Context, r *http.Request) (*delegate.Principal, error) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil, fmt.Errorf("not signed in: %w", delegate.ErrUnauthenticated)
	}
	if strings.HasPrefix(c.Value, "v1.") {
		if g.Shared != nil && g.Shared.validSession(c.Value) {
			return delegate.Local(), nil
		}
		return nil, fmt.Errorf("the session has ended: %w", delegate.ErrUnauthenticated)
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 4 || parts[0] != "v2" {
		return nil, fmt.Errorf("not a session of this server: %w", delegate.ErrUnauthenticated)
	}
	expiry, err := strconv.ParseInt(parts[1], 10, 64)
	sum, derr := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil || derr != nil || !hmac.Equal(sum, g.sessionMAC(expiry, parts[2])) {
		return nil, fmt.Errorf("not a session of this server: %w", delegate.ErrUnauthenticated)
	}
	now := time.Now()
	if now.Unix() >= expiry || time.Unix(expiry, 0).Sub(now) > g.sessionAge() {
		return nil, fmt.Errorf("the session has ended: sign in again: %w", delegate.ErrUnauthenticated)
	}
	if parts[2] == localCred {
		if g.Shared == nil {
			return nil, fmt.Errorf("the session has ended: %w", delegate.ErrUnauthenticated)
		}
		return delegate.Local(), nil
	}
	if g.Tokens == nil {
		return nil, fmt.Errorf("the session has ended: %w", delegate.ErrUnauthenticated)
	}
	t, err := g.Tokens.TokenByHash(ctx, parts[2])
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, fmt.Errorf("the session's token is gone: %w", delegate.ErrUnauthenticated)
	}
	if err != nil {
		return nil, fmt.Errorf("token lookup: %w", err)
	}
	if !t.Valid(now) {
		return nil, fmt.Errorf("the session's token %s was revoked or has expired: %w", t.ID, delegate.ErrUnauthenticated)
	}
	return &delegate.Principal{Name: t.Principal, Scopes: t.Scopes}, nil
}
