package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// jobColumns are the columns of the job row after id, in the order of
// rowValues. The manifest is not among them: it is immutable and lives in
// job_manifests (its files in job_files).
var jobColumns = []string{"status", "progress", "error", "exit_code", "oom_killed", "output_bytes",
	"output_truncated", "created_at", "updated_at", "started_at", "finished_at", "backend", "sandbox_id", "exec_id", "owner",
	"result", "idempotency_key", "token_hash", "last_heartbeat", "output_read", "timeline_dropped", "sandbox",
	"idempotency_digest", "output_lost_bytes", "output_lost", "epoch", "start_token", "attempts", "principal", "cache_missed"}

// colUpdatedAt is the index of updated_at in jobColumns.
const colUpdatedAt = 8

var selectJob = `SELECT seq, id, ` + strings.Join(jobColumns, ", ") + ` FROM jobs`

// JobStore keeps the jobs: their rows, their immutable manifests and
// files, and the count of finished jobs. It implements delegate.JobStore
// on a DB.
type JobStore struct {
	db   *DB
	stmt jobStatements

	manifests manifestCache

	updMu   sync.Mutex
	updates map[uint64]*sql.Stmt // UPDATE statements by the set of columns they write
	wanted  []uint64             // sets of columns whose statement is not prepared yet
	updUses map[uint64]int       // uses of each set's statement while not prepared
}

var _ delegate.JobStore = (*JobStore)(nil)

// jobStatements are prepared once per connection (database/sql keeps them
// per connection of the pool).
type jobStatements struct {
	getJob, jobByKey, manifest, manifestByID, files, finishes                *readStmt  // readers
	wGetJob, wManifest, wInsertJob, wInsertManifest, wInsertFiles, wFinished *writeStmt // writer
}

func newJobStore(ctx context.Context, db *DB) (*JobStore, error) {
	s := &JobStore{db: db, updates: map[uint64]*sql.Stmt{}, updUses: map[uint64]int{}}
	placeholders := strings.TrimSuffix(strings.Repeat("?,", len(jobColumns)+1), ",")
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.getJob, selectJob + ` WHERE id = ?1` + mine},
		{db.rdb, &s.stmt.jobByKey, selectJob + ` WHERE idempotency_key = ?1 AND principal = ?2`},
		{db.rdb, &s.stmt.manifest, `SELECT manifest FROM job_manifests WHERE seq = ?`},
		{db.rdb, &s.stmt.files, `SELECT f.files FROM jobs j LEFT JOIN job_files f ON f.seq = j.seq WHERE j.id = ?1` + mineJ},
		{db.rdb, &s.stmt.manifestByID, `SELECT m.manifest, j.principal FROM jobs j JOIN job_manifests m ON m.seq = j.seq WHERE j.id = ?1` + mineJ},
		{db.rdb, &s.stmt.finishes, `SELECT value FROM counters WHERE name = 'finishes'`},

		{db.wdb, &s.stmt.wGetJob, selectJob + ` WHERE id = ?1` + mine},
		{db.wdb, &s.stmt.wManifest, `SELECT manifest FROM job_manifests WHERE seq = ?`},
		{db.wdb, &s.stmt.wInsertJob, `INSERT INTO jobs (id, ` + strings.Join(jobColumns, ", ") + `) VALUES (` + placeholders + `)`},
		{db.wdb, &s.stmt.wInsertManifest, `INSERT INTO job_manifests (seq, manifest) VALUES (?, ?)`},
		{db.wdb, &s.stmt.wInsertFiles, `INSERT INTO job_files (seq, files) VALUES (?, ?)`},
		{db.wdb, &s.stmt.wFinished, `UPDATE counters SET value = value + 1 WHERE name = 'finishes'`},
	})
}

// mine and mineJ (for a query that names jobs j) keep a read to the
// jobs of the principal in parameter 2, or to every job when it is ”
// (delegate.ReaderOf): the filter is in the query that reads, so that no
// caller can forget it.
const (
	mine  = ` AND (?2 = '' OR principal = ?2)`
	mineJ = ` AND (?2 = '' OR j.principal = ?2)`
)

// jobIsMine keeps a read of a job's rows (artifacts, events, questions)
// keyed by the job's id in parameter 1 to the reader in parameter 2, as
// mine does.
const jobIsMine = ` AND (?2 = '' OR EXISTS (SELECT 1 FROM jobs j WHERE j.id = ?1 AND j.principal = ?2))`

// active is the SQL list of the statuses that are not terminal.
const active = `('pending', 'provisioning', 'running')`

type scanner interface{ Scan(...any) error }

// scanJob reads a job row (without its manifest) and its rowid.
func scanJob(row scanner) (*delegate.Job, int64, error) {
	var (
		seq                                 int64
		j                                   delegate.Job
		exit                                sql.NullInt64
		created, updated, started, finished int64
		heartbeat                           int64
		idem                                sql.NullString
		oom, truncated                      bool
	)
	dest := append([]any{}, &seq, &j.ID, &j.Status, &j.Progress, &j.Error, &exit, &oom, &j.OutputBytes,
		&truncated, &created, &updated, &started, &finished, &j.Backend, &j.SandboxID, &j.ExecID, &j.Owner,
		&j.Result, &idem, &j.TokenHash, &heartbeat, &j.OutputRead, &j.TimelineDropped, &j.Sandbox, &j.IdempotencyDigest,
		&j.OutputLostBytes, &j.OutputLost, &j.Epoch, &j.StartToken, &j.Attempts, &j.Principal, &j.CacheMissed)
	if err := row.Scan(dest...); err != nil {
		return nil, 0, err
	}
	if exit.Valid {
		c := int(exit.Int64)
		j.ExitCode = &c
	}
	j.OOMKilled, j.OutputTruncated = oom, truncated
	j.CreatedAt, j.UpdatedAt = fromNanos(created), fromNanos(updated)
	j.StartedAt, j.FinishedAt = fromNanos(started), fromNanos(finished)
	j.LastHeartbeat, j.IdempotencyKey = fromNanos(heartbeat), idem.String
	return &j, seq, nil
}

// rowValues are the job's column values in jobColumns order. They are all
// comparable, so that a change is found with !=.
func rowValues(j *delegate.Job) []any {
	var exit, idem any
	if j.ExitCode != nil {
		exit = int64(*j.ExitCode)
	}
	if j.IdempotencyKey != "" {
		idem = j.IdempotencyKey
	}
	return []any{string(j.Status), j.Progress, j.Error, exit, j.OOMKilled, j.OutputBytes,
		j.OutputTruncated, toNanos(j.CreatedAt), toNanos(j.UpdatedAt), toNanos(j.StartedAt), toNanos(j.FinishedAt),
		j.Backend, j.SandboxID, j.ExecID, j.Owner, j.Result, idem, j.TokenHash, toNanos(j.LastHeartbeat), j.OutputRead,
		j.TimelineDropped, j.Sandbox, j.IdempotencyDigest, j.OutputLostBytes, j.OutputLost, j.Epoch, j.StartToken,
		int64(j.Attempts), j.Principal, j.CacheMissed}
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

// CreateJob inserts a new job, its manifest and the manifest's files.
func (s *JobStore) CreateJob(ctx context.Context, j *delegate.Job) error {
	return s.create(ctx, j, nil)
}

// create inserts j; a non-nil admit decides first, in the transaction
// (QuotaStore.CreateJobAdmitted).
func (s *JobStore) create(ctx context.Context, j *delegate.Job, admit delegate.Admit) error {
	if !j.Status.Valid() {
		return fmt.Errorf("create job %s: %w: status %q", j.ID, delegate.ErrInvalid, j.Status)
	}
	if j.Principal == "" {
		j.Principal = delegate.OwnerOf(ctx)
	}
	m := j.Manifest
	files := m.Files
	m.Files = nil
	manifest, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	var filesJSON []byte
	if len(files) > 0 {
		if filesJSON, err = json.Marshal(files); err != nil {
			return fmt.Errorf("create job %s: %w", j.ID, err)
		}
	}
	args := append([]any{j.ID}, rowValues(j)...)
	var refused error // admit's, returned as it is
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		var rerr error
		if refused, rerr = admitIn(ctx, tx, j.Principal, admit); refused != nil || rerr != nil {
			return cmp.Or(refused, rerr)
		}
		res, err := s.stmt.wInsertJob.in(tx).Exec(args...)
		if err != nil {
			return err
		}
		seq, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if _, err := s.stmt.wInsertManifest.in(tx).Exec(seq, manifest); err != nil {
			return err
		}
		if filesJSON != nil {
			if _, err := s.stmt.wInsertFiles.in(tx).Exec(seq, filesJSON); err != nil {
				return err
			}
		}
		if j.Status.Terminal() {
			if _, err := s.stmt.wFinished.in(tx).Exec(); err != nil {
				return err
			}
		}
		return nil
	})
	if refused != nil {
		return refused
	}
	if err != nil {
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	s.manifests.put(j.ID, j.Principal, m.Clone(), len(manifest))
	return nil
}

// GetJob returns the job or an error wrapping delegate.ErrNotFound.
func (s *JobStore) GetJob(ctx context.Context, id string) (*delegate.Job, error) {
	j, seq, err := scanJob(s.stmt.getJob.QueryRowContext(ctx, id, delegate.ReaderOf(ctx)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.JobNotFound(id)
	}
	if err == nil {
		err = s.withManifest(ctx, s.stmt.manifest, j, seq)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	return j, nil
}

// withManifest sets the job's manifest, parsed once per process: it never
// changes.
func (s *JobStore) withManifest(ctx context.Context, stmt rowQuerier, j *delegate.Job, seq int64) error {
	if m, ok := s.manifests.get(j.ID, ""); ok {
		j.Manifest = m
		return nil
	}
	var text string
	if err := stmt.QueryRowContext(ctx, seq).Scan(&text); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	var m delegate.Manifest
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return fmt.Errorf("stored manifest: %w", err)
	}
	s.manifests.put(j.ID, j.Principal, m, len(text))
	j.Manifest = m.Clone()
	return nil
}

// JobManifest returns the job's manifest (without its files), from the
// cache when it was read before.
func (s *JobStore) JobManifest(ctx context.Context, id string) (delegate.Manifest, error) {
	reader := delegate.ReaderOf(ctx)
	if m, ok := s.manifests.get(id, reader); ok {
		return m, nil
	}
	var text, principal string
	err := s.stmt.manifestByID.QueryRowContext(ctx, id, reader).Scan(&text, &principal)
	if errors.Is(err, sql.ErrNoRows) {
		return delegate.Manifest{}, delegate.JobNotFound(id)
	}
	if err != nil {
		return delegate.Manifest{}, fmt.Errorf("manifest of job %s: %w", id, err)
	}
	var m delegate.Manifest
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return delegate.Manifest{}, fmt.Errorf("manifest of job %s: %w", id, err)
	}
	s.manifests.put(id, principal, m, len(text))
	return m.Clone(), nil
}

// JobFiles returns the files of the job's manifest.
func (s *JobStore) JobFiles(ctx context.Context, id string) ([]delegate.File, error) {
	// One read: no row, no such job; a NULL, a job without files.
	var text sql.NullString
	err := s.stmt.files.QueryRowContext(ctx, id, delegate.ReaderOf(ctx)).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.JobNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("files of job %s: %w", id, err)
	}
	if !text.Valid {
		return nil, nil
	}
	var files []delegate.File
	if err := json.Unmarshal([]byte(text.String), &files); err != nil {
		return nil, fmt.Errorf("files of job %s: %w", id, err)
	}
	return files, nil
}

// JobByIdempotencyKey finds the job submitted with key by the principal of
// ctx (a key is its principal's: another's use of it is no conflict).
func (s *JobStore) JobByIdempotencyKey(ctx context.Context, key string) (*delegate.Job, error) {
	j, seq, err := scanJob(s.stmt.jobByKey.QueryRowContext(ctx, key, delegate.OwnerOf(ctx)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "idempotency key", ID: key}
	}
	if err == nil {
		err = s.withManifest(ctx, s.stmt.manifest, j, seq)
	}
	if err != nil {
		return nil, fmt.Errorf("job by idempotency key: %w", err)
	}
	return j, nil
}

// ListJobs returns jobs newest first. The cursor is the opaque position
// after the last job of the previous page.
func (s *JobStore) ListJobs(ctx context.Context, f delegate.JobFilter) ([]*delegate.Job, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = delegate.DefaultPageSize
	}
	limit = min(limit, delegate.MaxPageSize)
	query, args, err := listQuery(ctx, f, limit)
	if err != nil {
		return nil, "", err
	}
	jobs, seqs, err := s.listRows(ctx, query, args)
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	next := ""
	if len(jobs) > limit {
		jobs = jobs[:limit]
		next = encodeCursor(seqs[limit-1])
	}
	if err := s.withManifests(ctx, jobs, seqs); err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	return jobs, next, nil
}

// listQuery is ListJobs's query, of at most limit+1 jobs. A filter on a
// column whose index is partial (only rows where it is not empty) says
// that the column is not empty too:
// SQLite uses such an index only where the query implies its condition,
// which "col = ?" does not (the value is not known when the statement is
// planned); without, a sandbox's or a token's job was found by reading
// every job (the engine's sweep does that for every live sandbox at each
// start, a CLI command's too: issue 41, item 2).
func listQuery(ctx context.Context, f delegate.JobFilter, limit int) (string, []any, error) {
	query := selectJob + ` WHERE 1=1`
	var args []any
	if f.Cursor != "" {
		seq, err := decodeCursor(f.Cursor)
		if err != nil {
			return "", nil, err
		}
		query += ` AND seq < ?`
		args = append(args, seq)
	}
	if f.Status != "" {
		query += ` AND status = ?`
		args = append(args, string(f.Status))
	}
	if f.Active {
		query += ` AND status IN ` + active
	}
	if f.Owner != "" {
		query += ` AND owner = ?`
		args = append(args, f.Owner)
	}
	if f.Principal != "" {
		query += ` AND principal = ?`
		args = append(args, f.Principal)
	}
	if r := delegate.ReaderOf(ctx); r != "" {
		query += ` AND principal = ?`
		args = append(args, r)
	}
	if f.TokenHash != "" {
		query += ` AND token_hash = ? AND token_hash != ''` // the latter lets the index jobs_token serve it
		args = append(args, f.TokenHash)
	}
	if f.SandboxID != "" {
		query += ` AND sandbox_id = ? AND sandbox_id != ''` // and jobs_sandbox this one
		args = append(args, f.SandboxID)
	}
	if f.Sandbox != "" {
		query += ` AND sandbox = ? AND sandbox != ''` // the latter lets the index jobs_kept serve it
		args = append(args, f.Sandbox)
	}
	query += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, limit+1)
	return query, args, nil
}

func (s *JobStore) listRows(ctx context.Context, query string, args []any) ([]*delegate.Job, []int64, error) {
	rows, err := s.db.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var (
		jobs []*delegate.Job
		seqs []int64
	)
	for rows.Next() {
		j, seq, err := scanJob(rows)
		if err != nil {
			return nil, nil, err
		}
		jobs, seqs = append(jobs, j), append(seqs, seq)
	}
	return jobs, seqs, rows.Err()
}

// withManifests sets the manifests of a page of jobs, reading those not
// parsed yet in one query.
func (s *JobStore) withManifests(ctx context.Context, jobs []*delegate.Job, seqs []int64) error {
	var missing []any
	bySeq := map[int64]*delegate.Job{}
	for i, j := range jobs {
		if m, ok := s.manifests.get(j.ID, ""); ok {
			j.Manifest = m
			continue
		}
		missing = append(missing, seqs[i])
		bySeq[seqs[i]] = j
	}
	if len(missing) == 0 {
		return nil
	}
	rows, err := s.db.rdb.QueryContext(ctx, `SELECT seq, manifest FROM job_manifests WHERE seq IN (`+
		strings.TrimSuffix(strings.Repeat("?,", len(missing)), ",")+`)`, missing...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			seq  int64
			text string
		)
		if err := rows.Scan(&seq, &text); err != nil {
			return err
		}
		j := bySeq[seq]
		if j == nil {
			continue
		}
		var m delegate.Manifest
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return fmt.Errorf("job %s: stored manifest: %w", j.ID, err)
		}
		s.manifests.put(j.ID, j.Principal, m, len(text))
		j.Manifest = m.Clone()
		delete(bySeq, seq)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, j := range bySeq {
		return fmt.Errorf("job %s: no stored manifest", j.ID)
	}
	return nil
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

// UpdateJob is a transactional read-modify-write that writes only the
// columns fn changed; see delegate.JobStore.
func (s *JobStore) UpdateJob(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	var out *delegate.Job
	reader := delegate.ReaderOf(ctx)
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		j, seq, err := scanJob(s.stmt.wGetJob.in(tx).QueryRow(id, reader))
		if errors.Is(err, sql.ErrNoRows) {
			return delegate.JobNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("update job %s: %w", id, err)
		}
		if err := s.withManifest(context.Background(), s.stmt.wManifest.in(tx), j, seq); err != nil {
			return fmt.Errorf("update job %s: %w", id, err)
		}
		// A write of the job's owner: only at the epoch it holds.
		if f, fenced := delegate.FenceOf(ctx); fenced {
			if err := f.Check(id, j.Owner, j.Epoch); err != nil {
				return err
			}
		}
		epoch := j.Epoch
		before := rowValues(j)
		status := j.Status
		if err := fn(j); err != nil {
			return err
		}
		if j.Epoch < epoch {
			return fmt.Errorf("job %s: epoch %d -> %d: an epoch never goes down: %w", id, epoch, j.Epoch, delegate.ErrFenced)
		}
		if j.Status != status {
			if err := delegate.Transition(status, j.Status); err != nil {
				return fmt.Errorf("job %s: %w", id, err)
			}
		}
		j.ID = id
		after := rowValues(j)
		changed := false
		for i := range after {
			changed = changed || (i != colUpdatedAt && after[i] != before[i])
		}
		if !changed && after[colUpdatedAt] == before[colUpdatedAt] {
			out = j
			return nil
		}
		if after[colUpdatedAt] == before[colUpdatedAt] {
			j.UpdatedAt = time.Now().UTC()
			after = rowValues(j)
		}
		var mask uint64
		var args []any
		for i := range after {
			if after[i] != before[i] {
				mask |= 1 << i
				args = append(args, after[i])
			}
		}
		if err := s.execUpdate(tx, mask, append(args, id)); err != nil {
			return fmt.Errorf("update job %s: %w", id, err)
		}
		if !status.Terminal() && j.Status.Terminal() {
			if _, err := s.stmt.wFinished.in(tx).Exec(); err != nil {
				return fmt.Errorf("update job %s: %w", id, err)
			}
		}
		out = j
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// execUpdate runs the UPDATE that writes the columns in mask (bit i is
// jobColumns[i]). Its statement is prepared once, after the transaction
// that needed it a second time (the one write connection is busy until
// then): as a writeStmt, one used once (a CLI command's) is parsed once.
func (s *JobStore) execUpdate(tx *sql.Tx, mask uint64, args []any) error {
	s.updMu.Lock()
	st := s.updates[mask]
	if st == nil {
		if s.updUses[mask]++; s.updUses[mask] == 2 {
			s.wanted = append(s.wanted, mask)
		}
	}
	s.updMu.Unlock()
	if st != nil {
		_, err := tx.Stmt(st).Exec(args...)
		return err
	}
	_, err := tx.Exec(updateSQL(mask), args...)
	return err
}

func updateSQL(mask uint64) string {
	var sets []string
	for i, c := range jobColumns {
		if mask&(1<<i) != 0 {
			sets = append(sets, c+" = ?")
		}
	}
	return `UPDATE jobs SET ` + strings.Join(sets, ", ") + ` WHERE id = ?`
}

// prepareWanted prepares the UPDATE statements that writes needed; the
// writer calls it between transactions.
func (s *JobStore) prepareWanted() {
	s.updMu.Lock()
	defer s.updMu.Unlock()
	for _, mask := range s.wanted {
		if s.updates[mask] != nil {
			continue
		}
		if st, err := s.db.wdb.Prepare(updateSQL(mask)); err == nil {
			s.updates[mask] = st
		}
	}
	s.wanted = nil
}

// The manifest cache holds at most manifestCacheBytes of manifests (as
// stored, in JSON), none over manifestCacheMax: a task may be 256 KiB and
// its env 32 MiB, and those are rarely read again.
const (
	manifestCacheBytes = 16 << 20
	manifestCacheMax   = 64 << 10
)

// manifestCache keeps parsed manifests (without files) by job id. A
// manifest never changes once stored, so nothing is ever invalidated; when
// full, an arbitrary part is forgotten.
type manifestCache struct {
	mu    sync.Mutex
	m     map[string]cachedManifest
	bytes int
}

type cachedManifest struct {
	m         delegate.Manifest
	principal string // the job's
	size      int
}

// get returns job id's manifest if it is cached and reader ("" for all,
// see delegate.ReaderOf) may read it.
func (c *manifestCache) get(id, reader string) (delegate.Manifest, bool) {
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if !ok || reader != "" && e.principal != reader {
		return delegate.Manifest{}, false
	}
	return e.m.Clone(), true
}

// put keeps m, of a job of principal, whose stored JSON is size bytes.
func (c *manifestCache) put(id, principal string, m delegate.Manifest, size int) {
	if size > manifestCacheMax {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedManifest)
	}
	if old, ok := c.m[id]; ok {
		c.bytes -= old.size
	}
	for k, e := range c.m { // map order: an arbitrary victim
		if c.bytes+size <= manifestCacheBytes {
			break
		}
		delete(c.m, k)
		c.bytes -= e.size
	}
	c.m[id] = cachedManifest{m: m, principal: principal, size: size}
	c.bytes += size
}

// Finishes counts the jobs that reached a terminal status, in every
// process sharing the database.
func (s *JobStore) Finishes(ctx context.Context) (int64, error) {
	var n int64
	if err := s.stmt.finishes.QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, fmt.Errorf("finished jobs: %w", err)
	}
	return n, nil
}

// forget drops the manifests of jobs that no longer exist (pruned).
func (c *manifestCache) forget(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if e, ok := c.m[id]; ok {
			c.bytes -= e.size
			delete(c.m, id)
		}
	}
}
