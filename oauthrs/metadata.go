package oauthrs

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
)

// MetadataPath is where the Protected Resource Metadata is served (RFC
// 9728, section 3), and where a client that has only the server's origin
// looks. The same document is served at MetadataPath followed by the
// resource's path (/.well-known/oauth-protected-resource/mcp), where a
// client that has the resource URL looks first (MCP 2025-11-25).
const MetadataPath = "/.well-known/oauth-protected-resource"

// Metadata is the Protected Resource Metadata document.
type Metadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name"`
}

// Metadata is this server's document.
func (v *Verifier) Metadata() Metadata {
	return Metadata{
		Resource:               v.resource,
		AuthorizationServers:   v.Issuers(),
		ScopesSupported:        ScopesSupported,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "delegate",
	}
}

// MetadataURL is the document's URL as the WWW-Authenticate challenge
// names it: the path-suffixed form of the resource URL.
func (v *Verifier) MetadataURL() string {
	u, _ := url.Parse(v.resource) // checked by New
	path := strings.TrimSuffix(u.EscapedPath(), "/")
	return u.Scheme + "://" + u.Host + MetadataPath + path
}

// MetadataPaths are the paths the document is served at on this server:
// MetadataPath, and it followed by the resource's path.
func (v *Verifier) MetadataPaths() []string {
	u, _ := url.Parse(v.resource)
	paths := []string{MetadataPath}
	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		paths = append(paths, MetadataPath+p)
	}
	return paths
}

// MetadataHandler serves the document (GET, with CORS open to every
// origin: it is public, and browser-based clients read it).
func (v *Verifier) MetadataHandler() http.Handler {
	body, _ := json.MarshalIndent(v.Metadata(), "", "  ")
	body = append(body, '\n')
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodOptions:
			w.Header().Set("Access-Control-Allow-Methods", "GET")
			w.WriteHeader(http.StatusNoContent)
			return
		default:
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: GET the protected resource metadata", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "public, max-age=3600")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
}

// Challenge is the WWW-Authenticate value of a refusal (RFC 6750 section
// 3, RFC 9728 section 5.1): the metadata's URL always, so that a client
// finds the issuer; when a token was sent and refused (err), the error
// code (an issuer's TokenError says which; another refusal, such as a
// revoked token of delegate's own, is invalid_token, or
// insufficient_scope when it wraps delegate.ErrForbidden) and its
// description; and the scope to ask for.
func (v *Verifier) Challenge(realm string, err error) string {
	var b strings.Builder
	b.WriteString("Bearer")
	param := func(name, value string) {
		if b.Len() > len("Bearer") {
			b.WriteByte(',')
		}
		b.WriteString(" " + name + "=" + quote(value))
	}
	if realm != "" {
		param("realm", realm)
	}
	param("resource_metadata", v.MetadataURL())
	scope := DefaultScope
	if err != nil {
		code := "invalid_token"
		var te *TokenError
		if errors.As(err, &te) && te.Code != "" {
			code = te.Code
			if te.Scope != "" {
				scope = te.Scope
			}
		} else if errors.Is(err, delegate.ErrForbidden) {
			code = "insufficient_scope"
			var se *delegate.ScopeError
			if errors.As(err, &se) {
				scope = ScopeName(se.Scope)
			}
		}
		param("error", code)
		param("error_description", err.Error())
	}
	param("scope", scope)
	return b.String()
}

// ChallengeFunc sets a refused request's WWW-Authenticate header (for
// httpauth.Guard.Challenge): without an error code when the request sent
// no credentials (RFC 6750 section 3.1), and none at all when the refusal
// is the server's trouble (an issuer out of reach: 503).
func (v *Verifier) ChallengeFunc(realm string) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if Status(err) == http.StatusServiceUnavailable {
			return
		}
		if r.Header.Get("Authorization") == "" {
			err = nil
		}
		w.Header().Set("WWW-Authenticate", v.Challenge(realm, err))
	}
}

// DefaultScope is what a challenge tells a client to ask for: a user's
// scopes (an operator asks for delegate:admin besides).
const DefaultScope = "delegate:jobs delegate:sandboxes"

// Status is the HTTP status of a refusal: 403 for too little scope, 503
// when the issuer could not be reached, 401 otherwise.
func Status(err error) int {
	switch delegate.ErrorKind(err) {
	case delegate.KindForbidden:
		return http.StatusForbidden
	case delegate.KindUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusUnauthorized
}

// quote makes s a quoted-string (RFC 9110) that RFC 6750 allows in
// error_description: printable ASCII without '"' and '\', so that those
// become ' and / and the rest '?'.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteByte('\'')
		case r == '\\':
			b.WriteByte('/')
		case r < 0x20 || r > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
