package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// QuotaStore stores a principal's new jobs and sandboxes as its quotas
// admit them (delegate.QuotaStore). Each such creation takes a lock of
// its principal's (a transaction-scoped advisory lock, keyed by a hash of
// the name) before it reads what the principal holds: the creations of
// one principal, on every server sharing the database, decide one after
// the other, and each (read committed: a statement sees what committed
// before it began) sees the ones before it. Other principals' are not
// held up.
type QuotaStore struct{ db *DB }

var _ delegate.QuotaStore = (*QuotaStore)(nil)

// Holdings reads what principal holds now.
func (s *QuotaStore) Holdings(ctx context.Context, principal string) (delegate.Holdings, error) {
	return holdings(ctx, s.db.pool, principal)
}

// CreateJobAdmitted inserts job if admit admits it.
func (s *QuotaStore) CreateJobAdmitted(ctx context.Context, job *delegate.Job, admit delegate.Admit) error {
	return s.db.JobStore.create(ctx, job, admit, nil)
}

// CreateJobAudited inserts job if admit admits it, and e with it, in its
// one statement (delegate.AuditedJobStore).
func (s *QuotaStore) CreateJobAudited(ctx context.Context, job *delegate.Job, admit delegate.Admit, e *delegate.AuditEntry) error {
	return s.db.JobStore.create(ctx, job, admit, e)
}

// CreateSandboxAdmitted inserts sb if admit admits it.
func (s *QuotaStore) CreateSandboxAdmitted(ctx context.Context, sb *delegate.Sandbox, admit delegate.Admit) error {
	return s.db.SandboxStore.create(ctx, sb, admit)
}

// UpdateSandboxAdmitted changes sandbox id if admit admits it, under its
// principal's quota lock (taken before the sandbox's row lock, in the
// order every admitted write takes them).
func (s *QuotaStore) UpdateSandboxAdmitted(ctx context.Context, id string, fn func(*delegate.Sandbox) error, admit delegate.Admit) (*delegate.Sandbox, error) {
	return s.db.SandboxStore.update(ctx, id, fn, admit)
}

// quotaLock takes principal's quota lock for the rest of tx.
func quotaLock(ctx context.Context, tx pgx.Tx, principal string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, quotaLockSpace+principal); err != nil {
		return fmt.Errorf("quota lock of %s: %w", principal, err)
	}
	return nil
}

// quotaLockSpace sets the principals' quota locks apart from other
// advisory locks (migrationLock).
const quotaLockSpace = "delegate quota of "

// admitted runs insert as a write: alone when admit is nil; otherwise in
// a transaction that holds principal's quota lock and gives admit what
// the principal holds first. It returns admit's refusal (nothing
// inserted), or the error of the write.
func (db *DB) admitted(ctx context.Context, principal string, admit delegate.Admit, insert func(ctx context.Context, q querier) error) (refused, err error) {
	if admit == nil {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		return nil, insert(ctx, db.pool)
	}
	err = db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := quotaLock(ctx, tx, principal); err != nil {
			return err
		}
		h, err := holdings(ctx, tx, principal)
		if err != nil {
			return fmt.Errorf("what %s holds: %w", principal, err)
		}
		if refused = admit(h); refused != nil {
			return refused
		}
		return insert(ctx, tx)
	})
	if refused != nil {
		return refused, nil
	}
	return nil, err
}

// holdings adds up principal's jobs not ended and live kept sandboxes.
func holdings(ctx context.Context, q querier, principal string) (delegate.Holdings, error) {
	var h delegate.Holdings
	rows, err := q.Query(ctx, `SELECT j.sandbox, m.manifest FROM jobs j JOIN job_manifests m ON m.seq = j.seq
		WHERE j.status IN `+active+` AND j.principal = $1`, principal)
	if err != nil {
		return h, err
	}
	for rows.Next() {
		var sandbox, text string
		if err := rows.Scan(&sandbox, &text); err != nil {
			rows.Close()
			return h, err
		}
		var m delegate.Manifest
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			rows.Close()
			return h, fmt.Errorf("stored manifest: %w", err)
		}
		h.AddJob(sandbox, &m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return h, err
	}
	rows, err = q.Query(ctx, `SELECT data FROM sandboxes WHERE state NOT IN ('released', 'gone') AND principal = $1`, principal)
	if err != nil {
		return h, err
	}
	defer rows.Close()
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return h, err
		}
		var r sandboxRow
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return h, fmt.Errorf("decode a sandbox: %w", err)
		}
		h.AddSandbox(r.Resources, r.Checkpoints)
	}
	return h, rows.Err()
}
