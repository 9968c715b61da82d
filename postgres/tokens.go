package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// TokenStore keeps delegate's own tokens, as the SQLite store does: a row
// each with the hash of its secret, never the secret.
type TokenStore struct{ db *DB }

var _ delegate.TokenStore = (*TokenStore)(nil)

const tokenColumns = `id, principal, hash, scopes, created_at, created_by, expires_at, revoked_at`

func scanToken(row pgx.Row) (*delegate.Token, error) {
	var (
		t                         delegate.Token
		scopes                    string
		created, expires, revoked ts
	)
	if err := row.Scan(&t.ID, &t.Principal, &t.Hash, &scopes, &created, &t.CreatedBy, &expires, &revoked); err != nil {
		return nil, err
	}
	for _, sc := range strings.Split(scopes, ",") {
		if sc != "" {
			t.Scopes = append(t.Scopes, delegate.Scope(sc))
		}
	}
	t.CreatedAt, t.ExpiresAt, t.RevokedAt = created.time(), expires.time(), revoked.time()
	return &t, nil
}

func joinScopes(scopes []delegate.Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ",")
}

// CreateToken stores a new token.
func (s *TokenStore) CreateToken(ctx context.Context, t *delegate.Token) error {
	_, err := s.db.exec(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		t.ID, clean(t.Principal), t.Hash, joinScopes(t.Scopes), toTS(t.CreatedAt), clean(t.CreatedBy), toTS(t.ExpiresAt), toTS(t.RevokedAt))
	if isUnique(err) {
		return fmt.Errorf("create token %s: its id or hash is taken: %w", t.ID, delegate.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, err)
	}
	return nil
}

// TokenByHash finds a token by the hash of its secret.
func (s *TokenStore) TokenByHash(ctx context.Context, hash string) (*delegate.Token, error) {
	t, err := scanToken(s.db.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "token", ID: "(by its hash)"}
	}
	if err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	return t, nil
}

// Tokens lists every token, oldest first.
func (s *TokenStore) Tokens(ctx context.Context) ([]delegate.Token, error) {
	rows, err := s.db.pool.Query(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	out := []delegate.Token{}
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		out = append(out, *t)
	}
	return out, rows.Err()
}

// RevokeToken marks a token revoked (the first time counts).
func (s *TokenStore) RevokeToken(ctx context.Context, id string, at time.Time) (*delegate.Token, error) {
	var out *delegate.Token
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		t, err := scanToken(tx.QueryRow(ctx, `UPDATE tokens SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1
			RETURNING `+tokenColumns, id, toTS(at)))
		if errors.Is(err, pgx.ErrNoRows) {
			return delegate.TokenNotFound(id)
		}
		out = t
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("revoke token: %w", err)
	}
	return out, nil
}
