// Package oauthrs makes delegate an OAuth 2.1 resource server, as the MCP
// authorization spec (2025-06-18, 2025-11-25) asks: it accepts access
// tokens an external issuer (an OpenID provider the team already runs)
// made for this server, and publishes where to get them.
//
//   - Its Protected Resource Metadata (RFC 9728) names the issuers the
//     operator configured and the scopes delegate knows
//     (Metadata, at /.well-known/oauth-protected-resource).
//   - An access token must be a JWT (RFC 9068), signed by a key the issuer
//     publishes (found by OpenID discovery, its JWKS cached and refreshed),
//     issued by a configured issuer (iss), for this server (aud holds the
//     resource URL), unexpired (exp, nbf), with at least one of the
//     delegate:jobs, delegate:sandboxes, delegate:admin scopes. An opaque
//     token is refused: delegate does not introspect.
//   - The token is checked and dropped: it is never forwarded anywhere (no
//     token passthrough); jobs never see it.
//
// The principal a token stands for is named by a configured claim (sub by
// default), prefixed by its issuer (see PrincipalName), so that no
// issuer's user can take the name of delegate's own tokens' principals or
// of another issuer's.
package oauthrs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/delegate-dev/delegate"
	jose "github.com/go-jose/go-jose/v4"
)

// The scopes an issuer puts in a token for delegate, each standing for
// one of delegate's.
var scopeNames = map[string]delegate.Scope{
	"delegate:jobs":      delegate.ScopeJobs,
	"delegate:sandboxes": delegate.ScopeSandboxes,
	"delegate:admin":     delegate.ScopeAdmin,
}

// ScopesSupported are the scopes, as the metadata lists them.
var ScopesSupported = []string{"delegate:jobs", "delegate:sandboxes", "delegate:admin"}

// ScopeName is the OAuth scope of one of delegate's scopes.
func ScopeName(s delegate.Scope) string { return "delegate:" + string(s) }

// DefaultNameClaim is the claim that names a token's principal.
const DefaultNameClaim = "sub"

// signingAlgs are the algorithms accepted: asymmetric ones only (a
// symmetric key would be a secret the issuer shares with every resource
// server, and "none" is no signature).
var signingAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// Config is what the operator sets.
type Config struct {
	// Issuers are the issuers whose tokens are accepted, each exactly as
	// it puts itself in iss (and its discovery document at
	// ISSUER/.well-known/openid-configuration).
	Issuers []string
	// Resource is this server's resource URL: /mcp as clients reach it
	// (https://delegate.example.com/mcp). A token's aud must hold it.
	Resource string
	// NameClaim names the claim that names the principal ("" is sub).
	NameClaim string
	// HTTPClient fetches the issuers' discovery documents and keys
	// (nil: one with a 10 s timeout).
	HTTPClient *http.Client
}

// Setting names, for errors and the docs.
const (
	EnvIssuers   = "DELEGATE_OAUTH_ISSUERS"
	EnvResource  = "DELEGATE_OAUTH_RESOURCE"
	EnvNameClaim = "DELEGATE_OAUTH_NAME_CLAIM"
)

// Check says what is wrong with c, naming the setting and the rule.
func (c Config) Check() error {
	var errs []error
	if len(c.Issuers) == 0 {
		errs = append(errs, fmt.Errorf("%s: name at least one issuer URL, like https://id.example.com", EnvIssuers))
	}
	for _, iss := range c.Issuers {
		if err := checkURL(iss); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q %w", EnvIssuers, iss, err))
		}
	}
	if c.Resource == "" {
		errs = append(errs, fmt.Errorf("%s: must be set with %s: the URL clients reach this server's /mcp at, like https://delegate.example.com/mcp (tokens' aud must hold it)", EnvResource, EnvIssuers))
	} else if err := checkURL(c.Resource); err != nil {
		errs = append(errs, fmt.Errorf("%s: %q %w", EnvResource, c.Resource, err))
	} else if u, _ := url.Parse(c.Resource); u.RawQuery != "" || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("%s: %q must have no query or fragment (RFC 8707)", EnvResource, c.Resource))
	}
	if c.NameClaim != "" && (strings.TrimSpace(c.NameClaim) != c.NameClaim || strings.ContainsAny(c.NameClaim, " \t\r\n")) {
		errs = append(errs, fmt.Errorf("%s: %q must be a claim's name, without spaces, like sub or email", EnvNameClaim, c.NameClaim))
	}
	return errors.Join(errs...)
}

// checkURL: an https URL, or http on the loopback interface (an issuer
// or a server on this machine: tokens would cross the network in clear
// otherwise).
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil {
		return errors.New("must be an absolute https URL, like https://id.example.com")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); strings.EqualFold(host, "localhost") || ip != nil && ip.IsLoopback() {
			return nil
		}
		return errors.New("must be https (http only on the loopback interface: tokens would cross the network in clear)")
	}
	return errors.New("must be an absolute https URL, like https://id.example.com")
}

// Verifier checks an issuer's access tokens. It implements
// httpauth.Authenticator.
type Verifier struct {
	resource  string
	nameClaim string
	client    *http.Client
	issuers   []*issuer
}

// New checks c and returns its Verifier. It does not reach the issuers:
// each is discovered at its first token, so that a server starts while an
// issuer is down.
func New(c Config) (*Verifier, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	v := &Verifier{resource: c.Resource, nameClaim: c.NameClaim, client: c.HTTPClient}
	if v.nameClaim == "" {
		v.nameClaim = DefaultNameClaim
	}
	if v.client == nil {
		v.client = &http.Client{Timeout: 10 * time.Second}
	}
	for _, iss := range c.Issuers {
		v.issuers = append(v.issuers, &issuer{url: iss, client: v.client, now: time.Now})
	}
	return v, nil
}

// Resource is the resource URL tokens must be for.
func (v *Verifier) Resource() string { return v.resource }

// Issuers are the configured issuers.
func (v *Verifier) Issuers() []string {
	out := make([]string, len(v.issuers))
	for i, is := range v.issuers {
		out[i] = is.url
	}
	return out
}

// TokenError is why a token was refused, with the error code of RFC 6750
// (invalid_token: 401; insufficient_scope: 403). It wraps
// delegate.ErrUnauthenticated or delegate.ErrForbidden, or
// delegate.ErrUnavailable when the issuer could not be reached.
type TokenError struct {
	// Code is invalid_token or insufficient_scope ("" when the issuer
	// could not be reached: no fault of the token).
	Code string
	// Scope, for insufficient_scope, is the scope to ask for.
	Scope  string
	Reason string
	kind   error
}

func (e *TokenError) Error() string { return e.Reason }

// Unwrap gives the sentinel the error's kind is.
func (e *TokenError) Unwrap() error { return e.kind }

func invalid(format string, args ...any) *TokenError {
	return &TokenError{Code: "invalid_token", Reason: fmt.Sprintf(format, args...), kind: delegate.ErrUnauthenticated}
}

// Authenticate checks an access token and returns the principal it
// stands for.
func (v *Verifier) Authenticate(ctx context.Context, bearer string) (*delegate.Principal, error) {
	jws, err := jose.ParseSigned(bearer, signingAlgs)
	if err != nil {
		if strings.Count(bearer, ".") != 2 {
			return nil, invalid("the access token is not a JWT: delegate accepts only JWT access tokens (RFC 9068) from %s; opaque tokens are refused", strings.Join(v.Issuers(), ", "))
		}
		return nil, invalid("the access token is not a JWT signed with one of %v: %v", signingAlgs, err)
	}
	if len(jws.Signatures) != 1 {
		return nil, invalid("the access token must have exactly one signature")
	}
	if typ, _ := jws.Signatures[0].Header.ExtraHeaders[jose.HeaderType].(string); typ != "" && !acceptedTyp(typ) {
		return nil, invalid("the access token's typ is %q: an access token is at+jwt (RFC 9068) or JWT", typ)
	}
	// The issuer named in the token picks the keys; the signature, and iss
	// again, are checked against that issuer.
	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &unverified); err != nil {
		return nil, invalid("the access token's claims are not a JSON object: %v", err)
	}
	is := v.issuer(unverified.Issuer)
	if is == nil {
		return nil, invalid("the access token was issued by %q, which this server does not accept (it accepts %s)", unverified.Issuer, strings.Join(v.Issuers(), ", "))
	}
	verifier, err := is.verifier(ctx, v.resource)
	if err != nil {
		return nil, err
	}
	tok, err := verifier.Verify(ctx, bearer)
	if err != nil {
		return nil, v.verifyError(err)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, invalid("the access token's claims: %v", err)
	}
	scopes, err := scopesOf(claims)
	if err != nil {
		return nil, err
	}
	name, err := v.name(tok.Issuer, claims)
	if err != nil {
		return nil, err
	}
	return &delegate.Principal{Name: name, Scopes: scopes}, nil
}

func acceptedTyp(typ string) bool {
	switch strings.ToLower(typ) {
	case "at+jwt", "application/at+jwt", "jwt":
		return true
	}
	return false
}

func (v *Verifier) issuer(iss string) *issuer {
	for _, is := range v.issuers {
		if is.url == iss {
			return is
		}
	}
	return nil
}

// verifyError words go-oidc's refusal for the client.
func (v *Verifier) verifyError(err error) error {
	var expired *oidc.TokenExpiredError
	var te *TokenError
	switch {
	case errors.As(err, &expired):
		if expired.Expiry.IsZero() {
			return invalid("the access token has no exp claim: an access token must expire (RFC 9068)")
		}
		return invalid("the access token expired at %s: get a new one from the issuer", expired.Expiry.UTC().Format(time.RFC3339))
	case errors.As(err, &te):
		return te
	case strings.Contains(err.Error(), "expected audience"):
		return invalid("the access token is not for this server: its aud must hold %s (ask the issuer for a token with resource=%s); %v", v.resource, v.resource, err)
	case strings.Contains(err.Error(), "verify signature"):
		return invalid("the access token's signature does not verify with the issuer's published keys: %v", err)
	}
	return invalid("the access token was refused: %v", err)
}

// scopesOf reads delegate's scopes from scope (space-separated, RFC 9068)
// or scp (a list or a string, as some issuers write it); other scopes are
// ignored. None of delegate's is insufficient_scope.
func scopesOf(claims map[string]any) ([]delegate.Scope, error) {
	var names []string
	for _, c := range []string{"scope", "scp"} {
		switch s := claims[c].(type) {
		case string:
			names = append(names, strings.Fields(s)...)
		case []any:
			for _, e := range s {
				if str, ok := e.(string); ok {
					names = append(names, str)
				}
			}
		}
	}
	var out []delegate.Scope
	for _, n := range names {
		if s, ok := scopeNames[n]; ok && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, &TokenError{Code: "insufficient_scope", Scope: ScopeName(delegate.ScopeJobs), kind: delegate.ErrForbidden,
			Reason: fmt.Sprintf("the access token has none of delegate's scopes (%s; it has %q): ask the issuer for delegate:jobs at least",
				strings.Join(ScopesSupported, ", "), strings.Join(names, " "))}
	}
	slices.SortFunc(out, func(a, b delegate.Scope) int {
		return slices.Index(delegate.Scopes, a) - slices.Index(delegate.Scopes, b)
	})
	return out, nil
}

// PrincipalName is the principal an issuer's token names: the issuer,
// without its scheme, then ':' and the claim's value
// ("id.example.com:alice", "login.example.com/realms/team:0b7c…"). Token
// names of delegate's own do not look like this when they have no ':'
// before a host, and two issuers' users never share a name.
func PrincipalName(issuer, value string) string {
	label := strings.TrimSuffix(issuer, "/")
	if u, err := url.Parse(label); err == nil && u.Host != "" {
		label = u.Host + u.Path
	}
	return label + ":" + value
}

// name is the token's principal's name, from the name claim.
func (v *Verifier) name(iss string, claims map[string]any) (string, error) {
	raw, ok := claims[v.nameClaim]
	if !ok {
		return "", invalid("the access token has no %s claim, which names its principal here (%s)", v.nameClaim, EnvNameClaim)
	}
	value, ok := raw.(string)
	if !ok || value == "" {
		return "", invalid("the access token's %s claim must be a non-empty string, which names its principal (got %v)", v.nameClaim, raw)
	}
	name := PrincipalName(iss, value)
	if err := delegate.CheckPrincipalName("the access token's "+v.nameClaim+" claim", name); err != nil {
		return "", invalid("%v", err)
	}
	return name, nil
}

// issuer is one configured issuer, discovered at its first token.
type issuer struct {
	url    string
	client *http.Client
	now    func() time.Time

	mu       sync.Mutex
	verify   *oidc.IDTokenVerifier
	failedAt time.Time // the last failed discovery
	failure  error
}

// retryDiscovery is how long a failed discovery is answered from memory
// before it is tried again: a server whose issuer is down does not send
// it a request for every token.
const retryDiscovery = 5 * time.Second

// verifier discovers the issuer (its keys' URL) once.
func (is *issuer) verifier(ctx context.Context, resource string) (*oidc.IDTokenVerifier, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.verify != nil {
		return is.verify, nil
	}
	if is.failure != nil && is.now().Sub(is.failedAt) < retryDiscovery {
		return nil, is.failure
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, is.client), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, is.url)
	var meta struct {
		JWKS string `json:"jwks_uri"`
	}
	if err == nil {
		err = p.Claims(&meta)
	}
	if err == nil && meta.JWKS == "" {
		err = errors.New("its discovery document has no jwks_uri")
	}
	if err != nil {
		is.failedAt, is.failure = is.now(), &TokenError{kind: delegate.ErrUnavailable,
			Reason: fmt.Sprintf("the issuer %s could not be reached to check the token (OpenID discovery at %s/.well-known/openid-configuration): %v; try again later",
				is.url, strings.TrimSuffix(is.url, "/"), err)}
		return nil, is.failure
	}
	keys := &keySet{url: meta.JWKS, client: is.client, now: is.now}
	is.verify = oidc.NewVerifier(is.url, keys, &oidc.Config{
		ClientID:             resource,
		SupportedSigningAlgs: algNames(),
		Now:                  is.now,
	})
	is.failure = nil
	return is.verify, nil
}

func algNames() []string {
	out := make([]string, len(signingAlgs))
	for i, a := range signingAlgs {
		out[i] = string(a)
	}
	return out
}
