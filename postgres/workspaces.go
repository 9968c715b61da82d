package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// WorkspaceStore keeps the workspaces jobs imported: a row per job, keyed
// by the job's seq. It implements delegate.WorkspaceStore on a DB.
type WorkspaceStore struct{ db *DB }

var _ delegate.WorkspaceStore = (*WorkspaceStore)(nil)

// SaveBaseline records the baseline of a job's import and where it was
// read from.
func (s *WorkspaceStore) SaveBaseline(ctx context.Context, id, source string, baseline []byte) error {
	return s.write(ctx, id, "save the workspace baseline", `INSERT INTO job_workspaces (seq, source, baseline)
		SELECT seq, $2, $3 FROM jobs WHERE id = $1
		ON CONFLICT (seq) DO UPDATE SET source = excluded.source, baseline = excluded.baseline`, id, clean(source), baseline)
}

// SaveChanges records a job's changes and their summary (the job's row is
// made if it has none: a command in a kept sandbox has the baseline of
// the job that made the sandbox).
func (s *WorkspaceStore) SaveChanges(ctx context.Context, id string, summary delegate.WorkspaceChanges, changes []byte) error {
	sum, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("save the workspace changes of job %s: %w", id, err)
	}
	return s.write(ctx, id, "save the workspace changes", `INSERT INTO job_workspaces (seq, changes, summary)
		SELECT seq, $2, $3 FROM jobs WHERE id = $1
		ON CONFLICT (seq) DO UPDATE SET changes = excluded.changes, summary = excluded.summary`, id, changes, string(sum))
}

// SaveApply records that job's changes were written into target, the
// last from chain.
func (s *WorkspaceStore) SaveApply(ctx context.Context, chain, target, job string) error {
	return s.write(ctx, job, "save the apply", `INSERT INTO workspace_applies (chain, target, job_seq, applied_at)
		SELECT $2, $3, seq, now() FROM jobs WHERE id = $1
		ON CONFLICT (chain, target) DO UPDATE SET job_seq = excluded.job_seq, applied_at = excluded.applied_at`, job, clean(chain), clean(target))
}

// LastApply is the job whose changes were written last into target from
// chain ("" when none was).
func (s *WorkspaceStore) LastApply(ctx context.Context, chain, target string) (string, error) {
	var id string
	err := s.db.pool.QueryRow(ctx, `SELECT j.id FROM workspace_applies a JOIN jobs j ON j.seq = a.job_seq
		WHERE a.chain = $1 AND a.target = $2 AND ($3 = '' OR j.principal = $3)`, clean(chain), clean(target), delegate.ReaderOf(ctx)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the last apply of %s into %s: %w", chain, target, err)
	}
	return id, nil
}

func (s *WorkspaceStore) write(ctx context.Context, id, what, sql string, args ...any) error {
	tag, err := s.db.exec(ctx, sql, args...)
	if err == nil && tag.RowsAffected() == 0 {
		err = delegate.JobNotFound(id)
	}
	if err != nil {
		return fmt.Errorf("%s of job %s: %w", what, id, err)
	}
	return nil
}

// JobWorkspace returns a job's workspace, or an error wrapping
// delegate.ErrNotFound when it has none.
func (s *WorkspaceStore) JobWorkspace(ctx context.Context, id string) (*delegate.JobWorkspace, error) {
	var (
		w       delegate.JobWorkspace
		summary *string
	)
	err := s.db.pool.QueryRow(ctx, `SELECT w.source, w.baseline, w.changes, w.summary FROM jobs j JOIN job_workspaces w ON w.seq = j.seq
		WHERE j.id = $1 AND ($2 = '' OR j.principal = $2)`, id, delegate.ReaderOf(ctx)).Scan(&w.Source, &w.Baseline, &w.Changes, &summary)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.WorkspaceNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("workspace of job %s: %w", id, err)
	}
	if summary != nil {
		w.Summary = new(delegate.WorkspaceChanges)
		if err := json.Unmarshal([]byte(*summary), w.Summary); err != nil {
			return nil, fmt.Errorf("workspace of job %s: %w", id, err)
		}
	}
	return &w, nil
}
