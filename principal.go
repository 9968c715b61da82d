package delegate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A Principal is who a request comes from: a person or an agent, named by
// a token of delegate's own or by an issuer's access token. Every job,
// kept sandbox (and so every question, network, artifact, task and
// workspace of theirs) belongs to the principal that made it, and a
// principal without ScopeAdmin reads only its own: the stores filter by
// it in the query that reads (ReaderOf), so that a forgotten check in a
// service or an adapter cannot show another's work. Another principal's
// id answers exactly as an unknown one (ErrNotFound).
//
// The adapters turn a request's credentials into a principal once, at the
// edge, and pass it in the context (WithPrincipal). The local user the
// server runs as is LocalPrincipal with every scope: over stdio, through
// the CLI (which opens the data dir itself: its file permissions are the
// boundary) and through the one DELEGATE_HTTP_TOKEN.
type Principal struct {
	Name   string  `json:"principal"`
	Scopes []Scope `json:"scopes"`
}

// Scope is what a principal may do.
type Scope string

const (
	// ScopeJobs: submit jobs and read one's own.
	ScopeJobs Scope = "jobs"
	// ScopeSandboxes: kept sandboxes and their files.
	ScopeSandboxes Scope = "sandboxes"
	// ScopeAdmin is the operator's: it holds the others, sees every
	// principal's work, answers and widens for others, and runs the admin
	// tools.
	ScopeAdmin Scope = "admin"
)

// Scopes are every scope, in the order they are shown.
var Scopes = []Scope{ScopeJobs, ScopeSandboxes, ScopeAdmin}

// LocalPrincipal is the local user the server runs as; jobs stored before
// principals existed are theirs.
const LocalPrincipal = "local"

// Local is the local user's principal, with every scope.
func Local() *Principal {
	return &Principal{Name: LocalPrincipal, Scopes: slices.Clone(Scopes)}
}

// Has reports whether p holds scope s (ScopeAdmin holds every scope).
func (p *Principal) Has(s Scope) bool {
	return p != nil && (slices.Contains(p.Scopes, s) || slices.Contains(p.Scopes, ScopeAdmin))
}

// Admin reports whether p is an operator.
func (p *Principal) Admin() bool { return p != nil && slices.Contains(p.Scopes, ScopeAdmin) }

func (p *Principal) String() string {
	if p == nil {
		return "(none)"
	}
	return p.Name
}

// Need refuses p for what needs scope s (ErrForbidden), naming both.
func (p *Principal) Need(s Scope, what string) error {
	if p.Has(s) {
		return nil
	}
	return &ScopeError{Principal: p.String(), Scope: s, What: what}
}

// ScopeError: a principal lacks the scope a request needs. It wraps
// ErrForbidden.
type ScopeError struct {
	Principal string
	Scope     Scope
	What      string
}

func (e *ScopeError) Error() string {
	return fmt.Sprintf("%s needs the %s scope, which %s's token does not have (an operator makes one with: delegate tokens create NAME --scopes %s)",
		e.What, e.Scope, e.Principal, e.Scope)
}

// Unwrap lets errors.Is(err, ErrForbidden) match.
func (e *ScopeError) Unwrap() error { return ErrForbidden }

// ParseScopes reads a comma-separated list of scopes ("jobs,sandboxes"),
// naming field when one is not a scope. Empty is jobs alone.
func ParseScopes(field, s string) ([]Scope, error) {
	if strings.TrimSpace(s) == "" {
		return []Scope{ScopeJobs}, nil
	}
	var out []Scope
	for _, part := range strings.Split(s, ",") {
		sc := Scope(strings.TrimSpace(part))
		if !slices.Contains(Scopes, sc) {
			return nil, fieldErr(field, "must be a comma-separated list of jobs, sandboxes, admin (got %q)", part)
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	return out, nil
}

// MaxPrincipalName is the longest principal name.
const MaxPrincipalName = 200

// CheckPrincipalName refuses what cannot name a principal, naming field.
func CheckPrincipalName(field, name string) error {
	if name == "" || len(name) > MaxPrincipalName {
		return fieldErr(field, "must be 1 to %d bytes (got %d)", MaxPrincipalName, len(name))
	}
	for i, r := range name {
		if r < 0x20 || r == 0x7f || r == ' ' && (i == 0 || i == len(name)-1) {
			return fieldErr(field, "must be printable, without control characters or leading and trailing spaces (got %q)", name)
		}
	}
	return nil
}

type principalKey struct{}

// WithPrincipal is ctx carrying p: what the services do under it is p's.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalOf is the principal ctx carries, or nil: a context without one
// is the server's own work (a timer, a recovery), not a request's.
func PrincipalOf(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// OwnerOf names who owns what is made under ctx: its principal, or the
// local user for the server's own work.
func OwnerOf(ctx context.Context) string {
	if p := PrincipalOf(ctx); p != nil {
		return p.Name
	}
	return LocalPrincipal
}

// ReaderOf is the principal whose resources a read under ctx may see, for
// the stores' queries: "" for all (the server's own work, or an operator).
func ReaderOf(ctx context.Context) string {
	p := PrincipalOf(ctx)
	if p == nil || p.Admin() {
		return ""
	}
	return p.Name
}

// AsServer is ctx (its deadline and values) read as the server's own work:
// for a service's checks of the whole server (how many sandboxes are kept
// by anyone), which a request's principal must not narrow.
func AsServer(ctx context.Context) context.Context {
	return context.WithValue(ctx, principalKey{}, (*Principal)(nil))
}

// Token is a token of delegate's own, as the store keeps it: its secret
// only as a hash.
type Token struct {
	// ID names it in listings and to revoke it (tok-…); it is not secret.
	ID        string    `json:"token_id"`
	Principal string    `json:"principal"`
	Scopes    []Scope   `json:"scopes"`
	Hash      string    `json:"-"` // hex SHA-256 of the secret
	CreatedAt time.Time `json:"created_at"`
	// CreatedBy is the principal that made it.
	CreatedBy string    `json:"created_by,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"` // zero: never
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// Valid reports whether t may be used at now.
func (t *Token) Valid(now time.Time) bool {
	return t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || now.Before(t.ExpiresAt))
}

// TokenStore keeps delegate's own tokens: every server sharing the store
// sees a token made, or revoked, by any of them.
type TokenStore interface {
	// CreateToken stores t (its ID and Hash unique: ErrConflict).
	CreateToken(ctx context.Context, t *Token) error
	// TokenByHash finds the token whose secret hashes to hash, revoked
	// or not (ErrNotFound).
	TokenByHash(ctx context.Context, hash string) (*Token, error)
	// Tokens lists them all, oldest first.
	Tokens(ctx context.Context) ([]Token, error)
	// RevokeToken marks one revoked at at (by ID), and returns it; a
	// token revoked already keeps its first time.
	RevokeToken(ctx context.Context, id string, at time.Time) (*Token, error)
}

// TokenNotFound is the error for an id that names no token.
func TokenNotFound(id string) *NotFoundError {
	return &NotFoundError{Resource: "token", ID: id, There: "delegate tokens list shows them"}
}

// HashToken is how the store keeps a token's secret: hex SHA-256 (the
// secret is 256 random bits: no salt or stretching is needed).
func HashToken(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// MaxTokenTTL is the longest life of a token of delegate's own.
const MaxTokenTTL = 10 * 365 * 24 * time.Hour

// TokenRequest asks for a token of delegate's own.
type TokenRequest struct {
	Principal string
	Scopes    []Scope
	TTL       time.Duration // 0: never expires
}

// Validate names the field that is wrong.
func (r TokenRequest) Validate() error {
	if err := CheckPrincipalName("name", r.Principal); err != nil {
		return err
	}
	if r.Principal == LocalPrincipal {
		return fieldErr("name", "%q is the local operator's own name (DELEGATE_HTTP_TOKEN, stdio and the CLI are it): choose another", LocalPrincipal)
	}
	if len(r.Scopes) == 0 {
		return fieldErr("scopes", "name at least one of jobs, sandboxes, admin")
	}
	for _, s := range r.Scopes {
		if !slices.Contains(Scopes, s) {
			return fieldErr("scopes", "must be jobs, sandboxes or admin (got %q)", s)
		}
	}
	if r.TTL < 0 || r.TTL > MaxTokenTTL {
		return fieldErr("expires", "must be from 0 (never) to %s (got %s)", MaxTokenTTL, r.TTL)
	}
	return nil
}

// PrincipalService is delegate's own tokens and the audit trail: making,
// listing and revoking tokens needs the admin scope; a principal without
// it reads its own entries of the trail.
type PrincipalService interface {
	// CreateToken returns the new token's secret, shown once.
	CreateToken(ctx context.Context, req TokenRequest) (secret string, t *Token, err error)
	Tokens(ctx context.Context) ([]Token, error)
	RevokeToken(ctx context.Context, id string) (*Token, error)
	Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
}

// QuotaError: a principal asked for more than its quota leaves (a job,
// a kept sandbox, CPU or memory). It names the quota, the use, what was
// asked and the setting, and wraps ErrConflict: the same request works
// once some of the principal's own work has ended.
type QuotaError struct {
	Principal string
	Quota     string // "jobs not ended", "memory in use"
	Setting   string // the server's setting: DELEGATE_QUOTA_JOBS
	Use       string
	Asked     string
	Limit     string
	// Free says what frees some ("" : a job ending, a cancel, a release).
	Free string
}

func (e *QuotaError) Error() string {
	free := e.Free
	if free == "" {
		free = "wait for a job to end, cancel one or release a kept sandbox"
	}
	return fmt.Sprintf("over the quota of %s: %s: %s now, this asks for %s more, the quota is %s (%s on the server): "+
		"%s, or ask the operator to raise %s",
		e.Principal, e.Quota, e.Use, e.Asked, e.Limit, e.Setting, free, e.Setting)
}

// Unwrap lets errors.Is(err, ErrConflict) match.
func (e *QuotaError) Unwrap() error { return ErrConflict }
