package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// TokenStore keeps delegate's own tokens: a row each, with the hash of
// its secret (never the secret). It implements delegate.TokenStore.
type TokenStore struct {
	db   *DB
	stmt struct {
		byHash, list *readStmt // readers
	}
}

var _ delegate.TokenStore = (*TokenStore)(nil)

const tokenColumns = `id, principal, hash, scopes, created_at, created_by, expires_at, revoked_at`

func newTokenStore(ctx context.Context, db *DB) (*TokenStore, error) {
	s := &TokenStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.byHash, `SELECT ` + tokenColumns + ` FROM tokens WHERE hash = ?`},
		{db.rdb, &s.stmt.list, `SELECT ` + tokenColumns + ` FROM tokens ORDER BY seq`},
	})
}

func scanToken(row scanner) (*delegate.Token, error) {
	var (
		t                         delegate.Token
		scopes                    string
		created, expires, revoked int64
	)
	if err := row.Scan(&t.ID, &t.Principal, &t.Hash, &scopes, &created, &t.CreatedBy, &expires, &revoked); err != nil {
		return nil, err
	}
	for _, sc := range strings.Split(scopes, ",") {
		if sc != "" {
			t.Scopes = append(t.Scopes, delegate.Scope(sc))
		}
	}
	t.CreatedAt, t.ExpiresAt, t.RevokedAt = fromNanos(created), fromNanos(expires), fromNanos(revoked)
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
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO tokens (`+tokenColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			t.ID, t.Principal, t.Hash, joinScopes(t.Scopes), toNanos(t.CreatedAt), t.CreatedBy, toNanos(t.ExpiresAt), toNanos(t.RevokedAt))
		return err
	})
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return fmt.Errorf("create token %s: its id or hash is taken: %w", t.ID, delegate.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, err)
	}
	return nil
}

// TokenByHash finds a token by the hash of its secret.
func (s *TokenStore) TokenByHash(ctx context.Context, hash string) (*delegate.Token, error) {
	t, err := scanToken(s.stmt.byHash.QueryRowContext(ctx, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "token", ID: "(by its hash)"}
	}
	if err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	return t, nil
}

// Tokens lists every token, oldest first.
func (s *TokenStore) Tokens(ctx context.Context) ([]delegate.Token, error) {
	rows, err := s.stmt.list.QueryContext(ctx)
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
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		if _, err := tx.Exec(`UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at = 0`, toNanos(at), id); err != nil {
			return err
		}
		t, err := scanToken(tx.QueryRow(`SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
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
