package postgres

import (
	"context"
	"fmt"
	"strconv"

	"github.com/delegate-dev/delegate"
)

// AuditStore keeps the audit trail, a row per action, in the order
// recorded.
type AuditStore struct{ db *DB }

var _ delegate.AuditStore = (*AuditStore)(nil)

// AddAudit appends an entry.
func (s *AuditStore) AddAudit(ctx context.Context, e *delegate.AuditEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.pool.QueryRow(ctx, `INSERT INTO audit (time, principal, action, target, detail) VALUES ($1, $2, $3, $4, $5) RETURNING seq`,
		toTS(e.Time), clean(e.Principal), string(e.Action), clean(e.Target), clean(e.Detail)).Scan(&e.Seq)
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
	query := `SELECT seq, time, principal, action, target, detail FROM audit WHERE true`
	var args []any
	where := func(cond string, arg any) {
		args = append(args, arg)
		query += " AND " + cond + " $" + strconv.Itoa(len(args))
	}
	if f.Principal != "" {
		where("principal =", f.Principal)
	}
	if r := delegate.ReaderOf(ctx); r != "" {
		where("principal =", r)
	}
	if !f.Since.IsZero() {
		where("time >=", toTS(f.Since))
	}
	if f.Before > 0 {
		where("seq <", f.Before)
	}
	args = append(args, limit)
	query += ` ORDER BY seq DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.db.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	defer rows.Close()
	out := []delegate.AuditEntry{}
	for rows.Next() {
		var e delegate.AuditEntry
		var at ts
		if err := rows.Scan(&e.Seq, &at, &e.Principal, &e.Action, &e.Target, &e.Detail); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		e.Time = at.time()
		out = append(out, e)
	}
	return out, rows.Err()
}
