package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// QuotaStore stores a principal's new jobs and sandboxes as its quotas
// admit them (delegate.QuotaStore): the decision is made in the write
// transaction that inserts, on the one write connection, which every
// write of this file goes through (and, across processes, after
// BEGIN IMMEDIATE has taken the database's write lock): a creation sees
// every one committed, or grouped, before it.
type QuotaStore struct{ db *DB }

var _ delegate.QuotaStore = (*QuotaStore)(nil)

// Holdings reads what principal holds now.
func (s *QuotaStore) Holdings(ctx context.Context, principal string) (delegate.Holdings, error) {
	return holdings(ctx, s.db.rdb, principal)
}

// CreateJobAdmitted inserts job if admit admits it.
func (s *QuotaStore) CreateJobAdmitted(ctx context.Context, job *delegate.Job, admit delegate.Admit) error {
	return s.db.JobStore.create(ctx, job, admit)
}

// CreateSandboxAdmitted inserts sb if admit admits it.
func (s *QuotaStore) CreateSandboxAdmitted(ctx context.Context, sb *delegate.Sandbox, admit delegate.Admit) error {
	return s.db.SandboxStore.create(ctx, sb, admit)
}

// UpdateSandboxAdmitted changes sandbox id if admit admits it.
func (s *QuotaStore) UpdateSandboxAdmitted(ctx context.Context, id string, fn func(*delegate.Sandbox) error, admit delegate.Admit) (*delegate.Sandbox, error) {
	return s.db.SandboxStore.update(ctx, id, fn, admit)
}

// admitIn gives admit (if any) what principal holds, read in tx:
// admit's refusal, or the error of the read.
func admitIn(ctx context.Context, tx *sql.Tx, principal string, admit delegate.Admit) (refused, err error) {
	if admit == nil {
		return nil, nil
	}
	h, err := holdings(ctx, tx, principal)
	if err != nil {
		return nil, fmt.Errorf("what %s holds: %w", principal, err)
	}
	return admit(h), nil
}

// holdings adds up principal's jobs not ended and live kept sandboxes.
// The jobs are found through jobs_status (the jobs not ended, of every
// principal, are few; a principal's ended ones may be many): "+principal"
// keeps the planner off jobs_principal.
func holdings(ctx context.Context, q querier, principal string) (delegate.Holdings, error) {
	var h delegate.Holdings
	rows, err := q.QueryContext(ctx, `SELECT j.sandbox, m.manifest FROM jobs j JOIN job_manifests m ON m.seq = j.seq
		WHERE j.status IN ('pending', 'provisioning', 'running') AND +j.principal = ?`, principal)
	if err != nil {
		return h, err
	}
	defer rows.Close()
	for rows.Next() {
		var sandbox, text string
		if err := rows.Scan(&sandbox, &text); err != nil {
			return h, err
		}
		var m delegate.Manifest
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return h, fmt.Errorf("stored manifest: %w", err)
		}
		h.AddJob(sandbox, &m)
	}
	if err := rows.Err(); err != nil {
		return h, err
	}
	rows, err = q.QueryContext(ctx, `SELECT data FROM sandboxes WHERE state NOT IN ('released', 'gone') AND principal = ?`, principal)
	if err != nil {
		return h, err
	}
	defer rows.Close()
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return h, err
		}
		var r sandboxRow
		if err := json.Unmarshal(data, &r); err != nil {
			return h, fmt.Errorf("decode a sandbox: %w", err)
		}
		h.AddSandbox(r.Resources, r.Checkpoints)
	}
	return h, rows.Err()
}
