package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// Principals is delegate's own tokens and the audit trail over the store
// (delegate.PrincipalService): an operator makes and revokes tokens, and
// reads the trail (a principal without the admin scope reads its own
// entries).
type Principals struct {
	store interface {
		delegate.TokenStore
		delegate.AuditStore
	}
	audit auditor
	now   func() time.Time
}

var _ delegate.PrincipalService = (*Principals)(nil)

// NewPrincipals is the service over store.
func NewPrincipals(store interface {
	delegate.TokenStore
	delegate.AuditStore
}, log *slog.Logger) *Principals {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Principals{store: store, audit: auditor{store: store, log: log}, now: time.Now}
}

// TokenPrefix begins every secret of delegate's own tokens, so that one
// pasted where it should not be is recognised (secret scanners, logs).
const TokenPrefix = "dlg_"

// CreateToken makes a token for req.Principal and returns its secret,
// which is shown this once: the store keeps its hash.
func (p *Principals) CreateToken(ctx context.Context, req delegate.TokenRequest) (string, *delegate.Token, error) {
	if err := needAdmin(ctx, "making a token"); err != nil {
		return "", nil, err
	}
	if err := req.Validate(); err != nil {
		return "", nil, err
	}
	var secret [32]byte
	rand.Read(secret[:])
	var id [6]byte
	rand.Read(id[:])
	s := TokenPrefix + base64.RawURLEncoding.EncodeToString(secret[:])
	now := p.now().UTC()
	t := &delegate.Token{ID: "tok-" + hex.EncodeToString(id[:]), Principal: req.Principal, Scopes: req.Scopes,
		Hash: delegate.HashToken(s), CreatedAt: now, CreatedBy: delegate.OwnerOf(ctx)}
	if req.TTL > 0 {
		t.ExpiresAt = now.Add(req.TTL)
	}
	if err := p.store.CreateToken(ctx, t); err != nil {
		return "", nil, err
	}
	detail := fmt.Sprintf("for %s, scopes %s", t.Principal, joinScopes(t.Scopes))
	if !t.ExpiresAt.IsZero() {
		detail += ", expires " + t.ExpiresAt.Format(time.RFC3339)
	}
	p.audit.Record(ctx, delegate.AuditTokenCreated, t.ID, detail)
	return s, t, nil
}

// Tokens lists every token (never a secret).
func (p *Principals) Tokens(ctx context.Context) ([]delegate.Token, error) {
	if err := needAdmin(ctx, "listing tokens"); err != nil {
		return nil, err
	}
	return p.store.Tokens(ctx)
}

// RevokeToken revokes a token by its id: every server sharing the store
// refuses it within a second (httpauth.Guard.Recheck).
func (p *Principals) RevokeToken(ctx context.Context, id string) (*delegate.Token, error) {
	if err := needAdmin(ctx, "revoking a token"); err != nil {
		return nil, err
	}
	t, err := p.store.RevokeToken(ctx, id, p.now().UTC())
	if err != nil {
		return nil, err
	}
	p.audit.Record(ctx, delegate.AuditTokenRevoked, t.ID, "of "+t.Principal)
	return t, nil
}

// Audit reads the trail, newest first.
func (p *Principals) Audit(ctx context.Context, f delegate.AuditFilter) ([]delegate.AuditEntry, error) {
	return p.store.Audit(ctx, f)
}

// needAdmin refuses a request's principal without the admin scope; the
// server's own work (no principal) may.
func needAdmin(ctx context.Context, what string) error {
	if pr := delegate.PrincipalOf(ctx); pr != nil {
		return pr.Need(delegate.ScopeAdmin, what)
	}
	return nil
}

func joinScopes(scopes []delegate.Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ",")
}
