package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// AuditStore keeps the audit trail, a row per action, in the order
// recorded. It implements delegate.AuditStore.
type AuditStore struct {
	db *DB
}

var _ delegate.AuditStore = (*AuditStore)(nil)

func newAuditStore(_ context.Context, db *DB) (*AuditStore, error) {
	return &AuditStore{db: db}, nil
}

// AddAudit appends an entry.
func (s *AuditStore) AddAudit(ctx context.Context, e *delegate.AuditEntry) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		res, err := tx.Exec(`INSERT INTO audit (time, principal, action, target, detail) VALUES (?, ?, ?, ?, ?)`,
			toNanos(e.Time), e.Principal, string(e.Action), e.Target, e.Detail)
		if err != nil {
			return err
		}
		e.Seq, err = res.LastInsertId()
		return err
	})
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// Audit lists entries newest first; a reader without the operator scope
// sees its own.
func (s *AuditStore) Audit(ctx context.Context, f delegate.AuditFilter) ([]delegate.AuditEntry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = delegate.DefaultPageSize
	}
	limit = min(limit, delegate.MaxPageSize)
	query := `SELECT seq, time, principal, action, target, detail FROM audit WHERE 1=1`
	var args []any
	if f.Principal != "" {
		query += ` AND principal = ?`
		args = append(args, f.Principal)
	}
	if r := delegate.ReaderOf(ctx); r != "" {
		query += ` AND principal = ?`
		args = append(args, r)
	}
	if !f.Since.IsZero() {
		query += ` AND time >= ?`
		args = append(args, toNanos(f.Since))
	}
	if f.Before > 0 {
		query += ` AND seq < ?`
		args = append(args, f.Before)
	}
	query += ` ORDER BY seq DESC LIMIT ?`
	rows, err := s.db.rdb.QueryContext(ctx, query, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	defer rows.Close()
	out := []delegate.AuditEntry{}
	for rows.Next() {
		var e delegate.AuditEntry
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.Principal, &e.Action, &e.Target, &e.Detail); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		e.Time = fromNanos(at)
		out = append(out, e)
	}
	return out, rows.Err()
}
