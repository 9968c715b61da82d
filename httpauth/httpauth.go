// Package httpauth guards delegate's HTTP server with one shared token
// (DELEGATE_HTTP_TOKEN): API clients send it as a bearer token; a browser
// signs in once with it and then carries a session cookie that is derived
// from it, never the token itself.
package httpauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// MinTokenLength is the shortest token accepted: the token is the only
// thing between the network and every job's output, so it must not be
// guessable (openssl rand -hex 32 makes a good one).
const MinTokenLength = 16

// CookieName is the dashboard's session cookie.
const CookieName = "delegate_session"

// DefaultSessionAge is how long a browser stays signed in.
const DefaultSessionAge = 12 * time.Hour

// Realm names the protected space in WWW-Authenticate.
const Realm = "delegate"

// Token checks requests against the shared token. A nil *Token guards
// nothing: every request is let through (a server on the loopback
// interface without DELEGATE_HTTP_TOKEN).
type Token struct {
	// digest is the SHA-256 of the token: comparing digests in constant
	// time does not reveal the token's length either.
	digest [sha256.Size]byte
	// key signs session cookies. It is derived from the token, so that
	// changing the token signs every browser out, and servers that share
	// a token accept each other's sessions.
	key []byte
	// SessionAge is how long a session cookie is valid.
	SessionAge time.Duration
	// now is the clock (tests move it).
	now func() time.Time
}

// New checks a token and returns its guard.
func New(token string) (*Token, error) {
	if len(token) < MinTokenLength {
		return nil, fmt.Errorf("must be at least %d characters (make one with: openssl rand -hex 32)", MinTokenLength)
	}
	if strings.IndexFunc(token, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return nil, errors.New("must not contain spaces or control characters (it is sent in an HTTP header)")
	}
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("delegate dashboard session key v1"))
	return &Token{digest: sha256.Sum256([]byte(token)), key: mac.Sum(nil), SessionAge: DefaultSessionAge, now: time.Now}, nil
}

// Match reports whether s is the token, in constant time.
func (t *Token) Match(s string) bool {
	d := sha256.Sum256([]byte(s))
	return subtle.ConstantTimeCompare(d[:], t.digest[:]) == 1
}

// Bearer reports whether r carries the token as Authorization: Bearer.
func (t *Token) Bearer(r *http.Request) bool {
	if t == nil {
		return true
	}
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && t.Match(strings.TrimSpace(cred))
}

// Allowed reports whether r may use the server: it carries the token, or
// a valid session cookie.
func (t *Token) Allowed(r *http.Request) bool {
	return t == nil || t.Bearer(r) || t.Session(r)
}

// Require lets through only requests that carry the token as a bearer
// token (API clients: /mcp, /metrics); the others get 401 with
// WWW-Authenticate.
func (t *Token) Require(next http.Handler) http.Handler {
	if t == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !t.Bearer(r) {
			Challenge(w, r)
			http.Error(w, "unauthorized: send Authorization: Bearer <DELEGATE_HTTP_TOKEN>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Challenge sets the WWW-Authenticate header of a 401 answer (RFC 6750):
// with error="invalid_token" when the request sent a wrong one.
func Challenge(w http.ResponseWriter, r *http.Request) {
	v := `Bearer realm="` + Realm + `"`
	if r.Header.Get("Authorization") != "" {
		v += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", v)
}

// Session reports whether r carries a valid, unexpired session cookie.
func (t *Token) Session(r *http.Request) bool {
	if t == nil {
		return true
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return false
	}
	return t.validSession(c.Value)
}

// StartSession signs the browser in: it sets the session cookie,
// HttpOnly (no script reads it), SameSite=Strict (no other site's page
// sends it) and Secure when the request came over TLS.
func (t *Token) StartSession(w http.ResponseWriter, r *http.Request) {
	expires := t.now().Add(t.SessionAge)
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    t.sessionValue(expires.Unix()),
		Path:     "/",
		Expires:  expires,
		MaxAge:   int(t.SessionAge.Seconds()),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
}

// EndSession signs the browser out (deletes the cookie).
func EndSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    "",
		Path:     "/",
		MaxAge:   -1,
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
}

// A session value is "v1.<expiry unix seconds>.<MAC>": the MAC, keyed by
// the token, proves the server issued it; the expiry bounds its life.
func (t *Token) sessionValue(expiry int64) string {
	return "v1." + strconv.FormatInt(expiry, 10) + "." + base64.RawURLEncoding.EncodeToString(t.mac(expiry))
}

func (t *Token) mac(expiry int64) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte("v1." + strconv.FormatInt(expiry, 10)))
	return m.Sum(nil)
}

func (t *Token) validSession(v string) bool {
	parts := strings.Split(v, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		return false
	}
	expiry, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return false
	}
	sum, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sum, t.mac(expiry)) {
		return false
	}
	now := t.now()
	// An expiry further away than a session lives was not issued by this
	// configuration (the age was shortened): refuse it too.
	return now.Unix() < expiry && time.Unix(expiry, 0).Sub(now) <= t.SessionAge
}
