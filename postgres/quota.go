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

// holdings reads what principal holds, through q (the pool, or a
// transaction that holds its quota lock).
func holdings(ctx context.Context, q querier, principal string) (delegate.Holdings, error) {
	var h delegate.Holdings
	rows, err := q.Query(ctx, heldJobs, principal)
	if err != nil {
		return h, err
	}
	if err := addHeldJobs(rows, &h); err != nil {
		return h, err
	}
	rows, err = q.Query(ctx, heldSandboxes, principal)
	if err != nil {
		return h, err
	}
	return h, addHeldSandboxes(rows, &h)
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
	if _, err := tx.Exec(ctx, quotaLockSQL, quotaLockSpace+principal); err != nil {
		return fmt.Errorf("quota lock of %s: %w", principal, err)
	}
	return nil
}

// quotaLockSQL takes the quota lock of the principal $1 names (in
// quotaLockSpace).
const quotaLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`

// quotaLockSpace sets the principals' quota locks apart from other
// advisory locks (migrationLock).
const quotaLockSpace = "delegate quota of "

// statement is one SQL statement and its arguments; scan, when not
// empty, is where the one row it returns goes.
type statement struct {
	sql  string
	args []any
	scan []any
}

func (st statement) run(ctx context.Context, q querier) error {
	if len(st.scan) == 0 {
		_, err := q.Exec(ctx, st.sql, st.args...)
		return err
	}
	return q.QueryRow(ctx, st.sql, st.args...).Scan(st.scan...)
}

func (st statement) queue(b *pgx.Batch) {
	qq := b.Queue(st.sql, st.args...)
	if len(st.scan) > 0 {
		qq.QueryRow(func(row pgx.Row) error { return row.Scan(st.scan...) })
	}
}

// admitted runs insert as a write: alone when admit is nil; otherwise in
// a transaction that holds principal's quota lock and gives admit what
// the principal holds first. It returns admit's refusal (nothing
// inserted), or the error of the write.
//
// The transaction takes two round trips to the database, not one a
// statement (six, before): BEGIN, the lock and the two reads of what the
// principal holds are sent together, then, if admit admits, the insert
// and COMMIT. The server runs a pipeline's statements one after the
// other, each when the one before has ended, so the reads still begin
// once the lock is granted and see every creation committed before it;
// an error skips the rest of its pipeline, and the transaction left
// open is rolled back before its connection is given back.
func (db *DB) admitted(ctx context.Context, principal string, admit delegate.Admit, insert statement) (refused, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if admit == nil {
		return nil, insert.run(ctx, db.pool)
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			// Not idle after this either (the connection broken): the
			// pool drops the connection on Release.
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
		conn.Release()
	}()
	var h delegate.Holdings
	decide := &pgx.Batch{}
	decide.Queue("BEGIN")
	decide.Queue(quotaLockSQL, quotaLockSpace+principal)
	decide.Queue(heldJobs, principal).Query(func(rows pgx.Rows) error { return addHeldJobs(rows, &h) })
	decide.Queue(heldSandboxes, principal).Query(func(rows pgx.Rows) error { return addHeldSandboxes(rows, &h) })
	if err := conn.SendBatch(ctx, decide).Close(); err != nil {
		return nil, fmt.Errorf("the quota lock of %s and what it holds: %w", principal, err)
	}
	if refused = admit(h); refused != nil {
		return refused, nil
	}
	write := &pgx.Batch{}
	insert.queue(write)
	write.Queue("COMMIT")
	return nil, conn.SendBatch(ctx, write).Close()
}

// heldJobs and heldSandboxes read what principal ($1) holds: its jobs
// not ended, and its live kept sandboxes.
const (
	heldJobs = `SELECT j.sandbox, m.manifest FROM jobs j JOIN job_manifests m ON m.seq = j.seq
		WHERE j.status IN ` + active + ` AND j.principal = $1`
	heldSandboxes = `SELECT data FROM sandboxes WHERE state NOT IN ('released', 'gone') AND principal = $1`
)

// addHeldJobs adds the jobs of heldJobs' rows to h, and closes rows.
func addHeldJobs(rows pgx.Rows, h *delegate.Holdings) error {
	defer rows.Close()
	for rows.Next() {
		var sandbox, text string
		if err := rows.Scan(&sandbox, &text); err != nil {
			return err
		}
		var m delegate.Manifest
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return fmt.Errorf("stored manifest: %w", err)
		}
		h.AddJob(sandbox, &m)
	}
	return rows.Err()
}

// addHeldSandboxes adds the sandboxes of heldSandboxes' rows to h, and
// closes rows.
func addHeldSandboxes(rows pgx.Rows, h *delegate.Holdings) error {
	defer rows.Close()
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return err
		}
		var r sandboxRow
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return fmt.Errorf("decode a sandbox: %w", err)
		}
		h.AddSandbox(r.Resources, r.Checkpoints)
	}
	return rows.Err()
}
