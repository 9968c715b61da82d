package sqlite

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/delegate-dev/delegate"
)

// WorkspaceStore keeps the workspaces jobs imported: a row per job, keyed
// by the job's rowid. It implements delegate.WorkspaceStore on a DB.
type WorkspaceStore struct {
	db   *DB
	stmt struct {
		get      *readStmt  // reader
		wBase    *writeStmt // writer
		wChanges *writeStmt
		wApply   *writeStmt
		getApply *readStmt // reader
	}
}

var _ delegate.WorkspaceStore = (*WorkspaceStore)(nil)

func newWorkspaceStore(ctx context.Context, db *DB) (*WorkspaceStore, error) {
	s := &WorkspaceStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.get, `SELECT w.source, w.baseline, w.changes, w.summary FROM jobs j JOIN job_workspaces w ON w.seq = j.seq WHERE j.id = ?1` + mineJ},
		{db.wdb, &s.stmt.wBase, `INSERT INTO job_workspaces (seq, source, baseline) SELECT seq, ?, ? FROM jobs WHERE id = ?
			ON CONFLICT (seq) DO UPDATE SET source = excluded.source, baseline = excluded.baseline`},
		{db.wdb, &s.stmt.wChanges, `INSERT INTO job_workspaces (seq, changes, summary) SELECT seq, ?, ? FROM jobs WHERE id = ?
			ON CONFLICT (seq) DO UPDATE SET changes = excluded.changes, summary = excluded.summary`},
		{db.wdb, &s.stmt.wApply, `INSERT INTO workspace_applies (chain, target, job_seq, applied_at) SELECT ?, ?, seq, ? FROM jobs WHERE id = ?
			ON CONFLICT (chain, target) DO UPDATE SET job_seq = excluded.job_seq, applied_at = excluded.applied_at`},
		{db.rdb, &s.stmt.getApply, `SELECT j.id FROM workspace_applies a JOIN jobs j ON j.seq = a.job_seq WHERE a.chain = ?1 AND a.target = ?3` + mineJ},
	})
}

// SaveBaseline records the baseline of a job's import and where it was
// read from.
func (s *WorkspaceStore) SaveBaseline(ctx context.Context, id, source string, baseline []byte) error {
	z, err := compress(baseline)
	if err != nil {
		return fmt.Errorf("save the workspace baseline of job %s: %w", id, err)
	}
	return s.write(ctx, id, "save the workspace baseline", s.stmt.wBase, source, z, id)
}

// SaveChanges records a job's changes and their summary (the job's row is
// made if it has none: a command in a kept sandbox has the baseline of
// the job that made the sandbox).
func (s *WorkspaceStore) SaveChanges(ctx context.Context, id string, summary delegate.WorkspaceChanges, changes []byte) error {
	sum, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("save the workspace changes of job %s: %w", id, err)
	}
	z, err := compress(changes)
	if err != nil {
		return fmt.Errorf("save the workspace changes of job %s: %w", id, err)
	}
	return s.write(ctx, id, "save the workspace changes", s.stmt.wChanges, z, string(sum), id)
}

// SaveApply records that job's changes were written into target, the
// last from chain.
func (s *WorkspaceStore) SaveApply(ctx context.Context, chain, target, job string) error {
	return s.write(ctx, job, "save the apply", s.stmt.wApply, chain, target, time.Now().UnixNano(), job)
}

// LastApply is the job whose changes were written last into target from
// chain ("" when none was).
func (s *WorkspaceStore) LastApply(ctx context.Context, chain, target string) (string, error) {
	var id string
	err := s.stmt.getApply.QueryRowContext(ctx, chain, delegate.ReaderOf(ctx), target).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the last apply of %s into %s: %w", chain, target, err)
	}
	return id, nil
}

func (s *WorkspaceStore) write(ctx context.Context, id, what string, st *writeStmt, args ...any) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		res, err := st.in(tx).Exec(args...)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return delegate.JobNotFound(id)
		}
		return nil
	})
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
		summary sql.NullString
	)
	err := s.stmt.get.QueryRowContext(ctx, id, delegate.ReaderOf(ctx)).Scan(&w.Source, &w.Baseline, &w.Changes, &summary)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.WorkspaceNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("workspace of job %s: %w", id, err)
	}
	if w.Baseline, err = decompress(w.Baseline); err != nil {
		return nil, fmt.Errorf("workspace baseline of job %s: %w", id, err)
	}
	if w.Changes, err = decompress(w.Changes); err != nil {
		return nil, fmt.Errorf("workspace changes of job %s: %w", id, err)
	}
	if summary.Valid {
		w.Summary = new(delegate.WorkspaceChanges)
		if err := json.Unmarshal([]byte(summary.String), w.Summary); err != nil {
			return nil, fmt.Errorf("workspace of job %s: %w", id, err)
		}
	}
	return &w, nil
}

// A baseline lists every file of an import (path, mode, size, time,
// sha256), as JSON: 787,000 tiny files made a 136 MB one. Paths, modes
// and times repeat, and the digests of equal contents too: stored
// compressed it is a sixth of that (see BenchmarkBaselineSize). Values
// are stored gzipped when over compressMin, or when they start like gzip
// (so that reading back never mistakes one stored as given); a value
// stored before (plain JSON) reads as it was. Gzip's fastest level: the
// baseline is stored before a job starts, and level 6 took 28 ms of a
// 10,000-file import for 7 % less (508 against 548 KB; issue 41, item 3).
const compressMin = 512

var gzipMagic = []byte{0x1f, 0x8b}

func compress(b []byte) ([]byte, error) {
	if b == nil || len(b) <= compressMin && !bytes.HasPrefix(b, gzipMagic) {
		return b, nil
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decompress(b []byte) ([]byte, error) {
	if !bytes.HasPrefix(b, gzipMagic) {
		return b, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}
