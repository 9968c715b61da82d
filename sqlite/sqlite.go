// Package sqlite keeps delegate's jobs in one SQLite file (pure Go driver,
// WAL), so that a restarted server, and the CLI beside it, see every job.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/delegate-dev/delegate"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store implements delegate.JobStore.
type Store struct {
	db *sql.DB
}

var _ delegate.JobStore = (*Store)(nil)

// migrations run in order; PRAGMA user_version records how many have run.
// Never edit one that has shipped: append a new one.
var migrations = []string{
	`CREATE TABLE jobs (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		status TEXT NOT NULL,
		manifest TEXT NOT NULL,
		progress TEXT NOT NULL DEFAULT '',
		error TEXT NOT NULL DEFAULT '',
		exit_code INTEGER,
		oom_killed INTEGER NOT NULL DEFAULT 0,
		output_bytes INTEGER NOT NULL DEFAULT 0,
		output_truncated INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		started_at INTEGER NOT NULL DEFAULT 0,
		finished_at INTEGER NOT NULL DEFAULT 0,
		backend TEXT NOT NULL DEFAULT '',
		sandbox_id TEXT NOT NULL DEFAULT '',
		exec_id TEXT NOT NULL DEFAULT '',
		owner TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX jobs_status ON jobs(status, seq);
	CREATE TABLE job_output (
		job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
		offset INTEGER NOT NULL,
		data BLOB NOT NULL,
		PRIMARY KEY (job_id, offset)
	);`,
	`ALTER TABLE jobs ADD COLUMN result TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
	ALTER TABLE jobs ADD COLUMN token_hash TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN last_heartbeat INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE jobs ADD COLUMN output_read INTEGER NOT NULL DEFAULT 0;
	CREATE UNIQUE INDEX jobs_idempotency_key ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;
	CREATE INDEX jobs_sandbox ON jobs(sandbox_id) WHERE sandbox_id != '';
	CREATE INDEX jobs_token ON jobs(token_hash) WHERE token_hash != '';
	CREATE TABLE job_events (
		job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
		seq INTEGER NOT NULL,
		time INTEGER NOT NULL,
		message TEXT NOT NULL,
		PRIMARY KEY (job_id, seq)
	);
	CREATE TABLE job_artifacts (
		job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
		name TEXT NOT NULL,
		size INTEGER NOT NULL,
		sha256 TEXT NOT NULL,
		skipped TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (job_id, name)
	);`,
}

// Open opens (creating if needed) the database file at path and brings its
// schema up to date.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := ownFiles(path); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate") // writers queue on the lock instead of failing on upgrade
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection: SQLite writes are serial anyway, and this keeps a
	// read-modify-write in UpdateJob free of in-process lock contention.
	db.SetMaxOpenConns(1)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	return s, nil
}

// ownFiles makes the database file, and the WAL and shared-memory files
// an earlier run left, the server's alone (0600) whatever the umask: they
// hold every job's manifest and output. SQLite makes new WAL and
// shared-memory files with the database file's mode.
func ownFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return err
	}
	if version > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this delegate (%d): upgrade delegate", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(migrations))); err != nil {
		return err
	}
	return tx.Commit()
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const jobColumns = `id, status, manifest, progress, error, exit_code, oom_killed, output_bytes,
	output_truncated, created_at, updated_at, started_at, finished_at, backend, sandbox_id, exec_id, owner,
	result, idempotency_key, token_hash, last_heartbeat, output_read`

type scanner interface{ Scan(...any) error }

func scanJob(row scanner) (*delegate.Job, error) {
	var (
		j                                   delegate.Job
		manifest                            string
		exit                                sql.NullInt64
		created, updated, started, finished int64
		heartbeat                           int64
		idem                                sql.NullString
		oom, truncated                      bool
	)
	err := row.Scan(&j.ID, &j.Status, &manifest, &j.Progress, &j.Error, &exit, &oom, &j.OutputBytes,
		&truncated, &created, &updated, &started, &finished, &j.Backend, &j.SandboxID, &j.ExecID, &j.Owner,
		&j.Result, &idem, &j.TokenHash, &heartbeat, &j.OutputRead)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(manifest), &j.Manifest); err != nil {
		return nil, fmt.Errorf("job %s: stored manifest: %w", j.ID, err)
	}
	if exit.Valid {
		c := int(exit.Int64)
		j.ExitCode = &c
	}
	j.OOMKilled, j.OutputTruncated = oom, truncated
	j.CreatedAt, j.UpdatedAt = fromNanos(created), fromNanos(updated)
	j.StartedAt, j.FinishedAt = fromNanos(started), fromNanos(finished)
	j.LastHeartbeat, j.IdempotencyKey = fromNanos(heartbeat), idem.String
	return &j, nil
}

func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func jobArgs(j *delegate.Job) ([]any, error) {
	manifest, err := json.Marshal(j.Manifest)
	if err != nil {
		return nil, err
	}
	var exit, idem any
	if j.ExitCode != nil {
		exit = *j.ExitCode
	}
	if j.IdempotencyKey != "" {
		idem = j.IdempotencyKey
	}
	return []any{j.ID, string(j.Status), string(manifest), j.Progress, j.Error, exit, j.OOMKilled, j.OutputBytes,
		j.OutputTruncated, toNanos(j.CreatedAt), toNanos(j.UpdatedAt), toNanos(j.StartedAt), toNanos(j.FinishedAt),
		j.Backend, j.SandboxID, j.ExecID, j.Owner, j.Result, idem, j.TokenHash, toNanos(j.LastHeartbeat), j.OutputRead}, nil
}

// CreateJob inserts a new job.
func (s *Store) CreateJob(ctx context.Context, j *delegate.Job) error {
	if !j.Status.Valid() {
		return fmt.Errorf("create job %s: %w: status %q", j.ID, delegate.ErrInvalid, j.Status)
	}
	args, err := jobArgs(j)
	if err != nil {
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO jobs (`+jobColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, args...)
	if err != nil {
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	return nil
}

// GetJob returns the job or an error wrapping delegate.ErrNotFound.
func (s *Store) GetJob(ctx context.Context, id string) (*delegate.Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("job %q: %w", id, delegate.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	return j, nil
}

// ListJobs returns jobs newest first. The cursor is the opaque position
// after the last job of the previous page.
func (s *Store) ListJobs(ctx context.Context, f delegate.JobFilter) ([]*delegate.Job, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = delegate.DefaultPageSize
	}
	limit = min(limit, delegate.MaxPageSize)
	query := `SELECT seq, ` + jobColumns + ` FROM jobs WHERE 1=1`
	var args []any
	if f.Cursor != "" {
		seq, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		query += ` AND seq < ?`
		args = append(args, seq)
	}
	if f.Status != "" {
		query += ` AND status = ?`
		args = append(args, string(f.Status))
	}
	if f.Active {
		query += ` AND status IN ('pending', 'provisioning', 'running')`
	}
	if f.Owner != "" {
		query += ` AND owner = ?`
		args = append(args, f.Owner)
	}
	if f.TokenHash != "" {
		query += ` AND token_hash = ?`
		args = append(args, f.TokenHash)
	}
	if f.SandboxID != "" {
		query += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	query += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	var (
		jobs []*delegate.Job
		seqs []int64
	)
	for rows.Next() {
		var seq int64
		j, err := scanJob(seqScanner{rows, &seq})
		if err != nil {
			return nil, "", fmt.Errorf("list jobs: %w", err)
		}
		jobs, seqs = append(jobs, j), append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	next := ""
	if len(jobs) > limit {
		jobs = jobs[:limit]
		next = encodeCursor(seqs[limit-1])
	}
	return jobs, next, nil
}

// seqScanner reads the leading seq column before the job's columns.
type seqScanner struct {
	rows *sql.Rows
	seq  *int64
}

func (s seqScanner) Scan(dest ...any) error {
	return s.rows.Scan(append([]any{s.seq}, dest...)...)
}

func encodeCursor(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("seq:" + strconv.FormatInt(seq, 10)))
}

func decodeCursor(c string) (int64, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		if n, ok := cutSeq(string(raw)); ok {
			return n, nil
		}
	}
	return 0, &delegate.FieldError{Field: "cursor", Rule: "must be a cursor returned by a previous list_jobs call"}
}

func cutSeq(s string) (int64, bool) {
	if len(s) < 5 || s[:4] != "seq:" {
		return 0, false
	}
	n, err := strconv.ParseInt(s[4:], 10, 64)
	return n, err == nil && n > 0
}

// UpdateJob is a transactional read-modify-write; see delegate.JobStore.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	defer tx.Rollback()
	j, err := scanJob(tx.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("job %q: %w", id, delegate.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	before := j.Status
	if err := fn(j); err != nil {
		return nil, err
	}
	if j.Status != before {
		if err := delegate.Transition(before, j.Status); err != nil {
			return nil, fmt.Errorf("job %s: %w", id, err)
		}
	}
	j.ID = id
	j.UpdatedAt = time.Now().UTC()
	args, err := jobArgs(j)
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE jobs SET status=?2, manifest=?3, progress=?4, error=?5, exit_code=?6,
		oom_killed=?7, output_bytes=?8, output_truncated=?9, created_at=?10, updated_at=?11, started_at=?12,
		finished_at=?13, backend=?14, sandbox_id=?15, exec_id=?16, owner=?17, result=?18, idempotency_key=?19,
		token_hash=?20, last_heartbeat=?21, output_read=?22 WHERE id=?1`, args...)
	if err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("update job %s: %w", id, err)
	}
	return j, nil
}

// AppendOutput adds a chunk after the output kept so far.
func (s *Store) AppendOutput(ctx context.Context, id string, chunk []byte) error {
	if len(chunk) == 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO job_output (job_id, offset, data)
		VALUES (?1, (SELECT COALESCE(MAX(offset + length(data)), 0) FROM job_output WHERE job_id = ?1), ?2)`, id, chunk)
	if err != nil {
		return fmt.Errorf("append output of job %s: %w", id, err)
	}
	return nil
}

// ReadOutput returns up to max kept bytes of output from offset.
func (s *Store) ReadOutput(ctx context.Context, id string, offset int64, max int) ([]byte, error) {
	if offset < 0 || max < 0 {
		return nil, fmt.Errorf("read output of job %s: %w: negative offset or size", id, delegate.ErrInvalid)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT offset, data FROM job_output
		WHERE job_id = ? AND offset + length(data) > ? ORDER BY offset`, id, offset)
	if err != nil {
		return nil, fmt.Errorf("read output of job %s: %w", id, err)
	}
	defer rows.Close()
	var out []byte
	for rows.Next() && len(out) < max {
		var (
			at   int64
			data []byte
		)
		if err := rows.Scan(&at, &data); err != nil {
			return nil, fmt.Errorf("read output of job %s: %w", id, err)
		}
		if at < offset {
			data = data[offset-at:]
		}
		out = append(out, data[:min(len(data), max-len(out))]...)
	}
	return out, rows.Err()
}

// OutputSize is how many bytes of output are kept for the job.
func (s *Store) OutputSize(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(offset + length(data)), 0) FROM job_output WHERE job_id = ?`, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("output size of job %s: %w", id, err)
	}
	return n, nil
}

// JobByIdempotencyKey finds the job submitted with key.
func (s *Store) JobByIdempotencyKey(ctx context.Context, key string) (*delegate.Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE idempotency_key = ?`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("idempotency key %q: %w", key, delegate.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("job by idempotency key: %w", err)
	}
	return j, nil
}

// AddEvent appends to the job's timeline and drops the oldest entries
// beyond max.
func (s *Store) AddEvent(ctx context.Context, id string, ev delegate.Event, max int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	defer tx.Rollback()
	var seq int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM job_events WHERE job_id = ?`, id).Scan(&seq); err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO job_events (job_id, seq, time, message) VALUES (?, ?, ?, ?)`,
		id, seq, toNanos(ev.Time), ev.Message); err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM job_events WHERE job_id = ? AND seq <= ?`, id, seq-int64(max)); err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	return tx.Commit()
}

// Events returns the job's timeline, oldest first.
func (s *Store) Events(ctx context.Context, id string) ([]delegate.Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT time, message FROM job_events WHERE job_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("events of job %s: %w", id, err)
	}
	defer rows.Close()
	var evs []delegate.Event
	for rows.Next() {
		var (
			at  int64
			msg string
		)
		if err := rows.Scan(&at, &msg); err != nil {
			return nil, fmt.Errorf("events of job %s: %w", id, err)
		}
		evs = append(evs, delegate.Event{Time: fromNanos(at), Message: msg})
	}
	return evs, rows.Err()
}

// AddArtifact records (or replaces) a collected artifact.
func (s *Store) AddArtifact(ctx context.Context, id string, a delegate.Artifact) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO job_artifacts (job_id, name, size, sha256, skipped) VALUES (?, ?, ?, ?, ?)`,
		id, a.Name, a.Size, a.SHA256, a.Skipped)
	if err != nil {
		return fmt.Errorf("add artifact to job %s: %w", id, err)
	}
	return nil
}

// Artifacts lists the job's artifacts by name.
func (s *Store) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, size, sha256, skipped FROM job_artifacts WHERE job_id = ? ORDER BY name`, id)
	if err != nil {
		return nil, fmt.Errorf("artifacts of job %s: %w", id, err)
	}
	defer rows.Close()
	arts := []delegate.Artifact{}
	for rows.Next() {
		var a delegate.Artifact
		if err := rows.Scan(&a.Name, &a.Size, &a.SHA256, &a.Skipped); err != nil {
			return nil, fmt.Errorf("artifacts of job %s: %w", id, err)
		}
		arts = append(arts, a)
	}
	return arts, rows.Err()
}
