package postgres

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// jobColumns are the columns of the job row after seq and id, in the
// order of rowValues. The manifest is not among them: it is immutable and
// lives in job_manifests (its files in job_files).
var jobColumns = []string{"status", "progress", "error", "exit_code", "oom_killed", "output_bytes",
	"output_truncated", "created_at", "updated_at", "started_at", "finished_at", "backend", "sandbox_id", "exec_id", "owner",
	"result", "idempotency_key", "token_hash", "last_heartbeat", "output_read", "timeline_dropped", "sandbox",
	"idempotency_digest", "output_lost_bytes", "output_lost", "epoch", "start_token", "attempts", "principal", "cache_missed"}

// colUpdatedAt is the index of updated_at in jobColumns.
const colUpdatedAt = 8

var selectColumns = func() string {
	cols := []string{"j.seq", "j.id"}
	for _, c := range jobColumns {
		cols = append(cols, "j."+c)
	}
	return strings.Join(cols, ", ")
}()

// JobStore keeps the jobs: their rows, their immutable manifests and
// files, and the count of finished jobs. It implements delegate.JobStore
// on a DB.
type JobStore struct {
	db        *DB
	manifests manifestCache
}

var _ delegate.JobStore = (*JobStore)(nil)

// querier is the pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// jobIsMine keeps a read of a job's rows (artifacts, events, questions)
// keyed by the job's id in $1 to the reader in $2 (” for all, see
// delegate.ReaderOf): the filter is in the query that reads, so that no
// caller can forget it.
const jobIsMine = ` AND ($2 = '' OR EXISTS (SELECT 1 FROM jobs o WHERE o.id = $1 AND o.principal = $2))`

// active is the SQL list of the statuses that are not terminal.
const active = `('pending', 'provisioning', 'running')`

// writeTimeout bounds a write once started: like the SQLite store's, a
// write is not abandoned when its caller's context ends (a caller
// cancelled mid-way must not lose a change it made), but a database that
// stopped answering does not hold it forever.
const writeTimeout = 30 * time.Second

// write runs fn in a transaction, committed when fn returns nil.
func (db *DB) write(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

// exec runs one statement as a write (see write).
func (db *DB) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := ctx.Err(); err != nil {
		return pgconn.CommandTag{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return db.pool.Exec(ctx, sql, args...)
}

// scanJob reads a job row (selectColumns) and its seq, and the manifest's
// text when the query selected it (manifest not nil).
func scanJob(row pgx.Row, manifest *string) (*delegate.Job, int64, error) {
	var (
		seq                                 int64
		j                                   delegate.Job
		exit                                *int32
		created, updated, started, finished ts
		heartbeat                           ts
		idem                                *string
		attempts                            int32
	)
	dest := []any{&seq, &j.ID, &j.Status, &j.Progress, &j.Error, &exit, &j.OOMKilled, &j.OutputBytes,
		&j.OutputTruncated, &created, &updated, &started, &finished, &j.Backend, &j.SandboxID, &j.ExecID, &j.Owner,
		&j.Result, &idem, &j.TokenHash, &heartbeat, &j.OutputRead, &j.TimelineDropped, &j.Sandbox, &j.IdempotencyDigest,
		&j.OutputLostBytes, &j.OutputLost, &j.Epoch, &j.StartToken, &attempts, &j.Principal, &j.CacheMissed}
	if manifest != nil {
		dest = append(dest, manifest)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, 0, err
	}
	if exit != nil {
		c := int(*exit)
		j.ExitCode = &c
	}
	if idem != nil {
		j.IdempotencyKey = *idem
	}
	j.Attempts = int(attempts)
	j.CreatedAt, j.UpdatedAt = created.time(), updated.time()
	j.StartedAt, j.FinishedAt = started.time(), finished.time()
	j.LastHeartbeat = heartbeat.time()
	return &j, seq, nil
}

// rowValues are the job's column values in jobColumns order, as the
// database keeps them (times to the microsecond, text without NUL). They are all
// comparable, so that a change is found with !=.
func rowValues(j *delegate.Job) []any {
	var exit, idem any
	if j.ExitCode != nil {
		exit = int32(*j.ExitCode)
	}
	if j.IdempotencyKey != "" {
		idem = j.IdempotencyKey
	}
	return []any{string(j.Status), clean(j.Progress), clean(j.Error), exit, j.OOMKilled, j.OutputBytes,
		j.OutputTruncated, toTS(j.CreatedAt), toTS(j.UpdatedAt), toTS(j.StartedAt), toTS(j.FinishedAt),
		j.Backend, j.SandboxID, j.ExecID, j.Owner, clean(j.Result), idem, j.TokenHash, toTS(j.LastHeartbeat), j.OutputRead,
		j.TimelineDropped, j.Sandbox, j.IdempotencyDigest, j.OutputLostBytes, clean(j.OutputLost), j.Epoch, j.StartToken,
		int32(j.Attempts), j.Principal, clean(j.CacheMissed)}
}

var insertJob = func() string {
	ph := make([]string, len(jobColumns)+1)
	for i := range ph {
		ph[i] = "$" + strconv.Itoa(i+1)
	}
	return `INSERT INTO jobs (id, ` + strings.Join(jobColumns, ", ") + `) VALUES (` + strings.Join(ph, ", ") + `) RETURNING seq`
}()

// CreateJob inserts a new job, its manifest and the manifest's files, in
// one round trip (the statements are sent together).
func (s *JobStore) CreateJob(ctx context.Context, j *delegate.Job) error {
	return s.create(ctx, j, nil, nil)
}

// create inserts j, and the audit entry e if not nil, in one statement; a
// non-nil admit decides first, in the transaction
// (QuotaStore.CreateJobAdmitted).
func (s *JobStore) create(ctx context.Context, j *delegate.Job, admit delegate.Admit, e *delegate.AuditEntry) error {
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
	// One statement: the job, then its manifest and files keyed by the
	// seq it was given.
	q := `WITH j AS (` + insertJob + `),
		m AS (INSERT INTO job_manifests (seq, manifest) SELECT seq, $` + strconv.Itoa(len(args)+1) + ` FROM j)`
	args = append(args, string(manifest))
	if filesJSON != nil {
		q += `, f AS (INSERT INTO job_files (seq, files) SELECT seq, $` + strconv.Itoa(len(args)+1) + ` FROM j)`
		args = append(args, string(filesJSON))
	}
	if e == nil {
		q += ` SELECT seq FROM j`
	} else {
		n := len(args)
		q += fmt.Sprintf(`, a AS (INSERT INTO audit (time, principal, action, target, detail) VALUES ($%d, $%d, $%d, $%d, $%d) RETURNING seq)
			SELECT a.seq FROM j, a`, n+1, n+2, n+3, n+4, n+5)
		args = append(args, toTS(e.Time), clean(e.Principal), string(e.Action), clean(e.Target), clean(e.Detail))
	}
	insert := statement{sql: q, args: args}
	if e != nil {
		insert.scan = []any{&e.Seq}
	}
	refused, err := s.db.admitted(ctx, j.Principal, admit, insert)
	if refused != nil {
		return refused
	}
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("create job %s: the id or the idempotency key is taken: %w", j.ID, delegate.ErrConflict)
		}
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	s.manifests.put(j.ID, j.Principal, m.Clone(), len(manifest))
	return nil
}

// getJob reads one job where column col is arg (locking its row with
// forUpdate), with its manifest: from the cache when id is known and in
// it, otherwise joined in the same query.
func (s *JobStore) getJob(ctx context.Context, q querier, col string, arg any, id string, forUpdate bool) (*delegate.Job, int64, error) {
	cached, haveCached := delegate.Manifest{}, false
	if id != "" {
		cached, haveCached = s.manifests.get(id, "")
	}
	sql := `SELECT ` + selectColumns
	if !haveCached {
		sql += `, m.manifest FROM jobs j JOIN job_manifests m ON m.seq = j.seq`
	} else {
		sql += ` FROM jobs j`
	}
	sql += ` WHERE j.` + col + ` = $1`
	args := []any{arg}
	// The reader's jobs only (delegate.ReaderOf), in the query that
	// reads; a key is its principal's (delegate.OwnerOf).
	if col == "idempotency_key" {
		sql += ` AND j.principal = $2`
		args = append(args, delegate.OwnerOf(ctx))
	} else if r := delegate.ReaderOf(ctx); r != "" {
		sql += ` AND j.principal = $2`
		args = append(args, r)
	}
	if forUpdate {
		sql += ` FOR NO KEY UPDATE OF j`
	}
	var text string
	var mp *string
	if !haveCached {
		mp = &text
	}
	j, seq, err := scanJob(q.QueryRow(ctx, sql, args...), mp)
	if err != nil {
		return nil, 0, err
	}
	if haveCached {
		j.Manifest = cached
		return j, seq, nil
	}
	var m delegate.Manifest
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return nil, 0, fmt.Errorf("stored manifest: %w", err)
	}
	s.manifests.put(j.ID, j.Principal, m, len(text))
	j.Manifest = m.Clone()
	return j, seq, nil
}

// GetJob returns the job or an error wrapping delegate.ErrNotFound.
func (s *JobStore) GetJob(ctx context.Context, id string) (*delegate.Job, error) {
	j, _, err := s.getJob(ctx, s.db.pool, "id", id, id, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.JobNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	return j, nil
}

// JobManifest returns the job's manifest (without its files), from the
// cache when it was read before.
func (s *JobStore) JobManifest(ctx context.Context, id string) (delegate.Manifest, error) {
	reader := delegate.ReaderOf(ctx)
	if m, ok := s.manifests.get(id, reader); ok {
		return m, nil
	}
	var text, principal string
	err := s.db.pool.QueryRow(ctx, `SELECT m.manifest, j.principal FROM jobs j JOIN job_manifests m ON m.seq = j.seq
		WHERE j.id = $1 AND ($2 = '' OR j.principal = $2)`, id, reader).Scan(&text, &principal)
	if errors.Is(err, pgx.ErrNoRows) {
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
	var text *string
	err := s.db.pool.QueryRow(ctx, `SELECT f.files FROM jobs j LEFT JOIN job_files f ON f.seq = j.seq
		WHERE j.id = $1 AND ($2 = '' OR j.principal = $2)`, id, delegate.ReaderOf(ctx)).Scan(&text)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.JobNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("files of job %s: %w", id, err)
	}
	if text == nil {
		return nil, nil
	}
	var files []delegate.File
	if err := json.Unmarshal([]byte(*text), &files); err != nil {
		return nil, fmt.Errorf("files of job %s: %w", id, err)
	}
	return files, nil
}

// JobByIdempotencyKey finds the job submitted with key.
func (s *JobStore) JobByIdempotencyKey(ctx context.Context, key string) (*delegate.Job, error) {
	j, _, err := s.getJob(ctx, s.db.pool, "idempotency_key", key, "", false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "idempotency key", ID: key}
	}
	if err != nil {
		return nil, fmt.Errorf("job by idempotency key: %w", err)
	}
	return j, nil
}

// ListJobs returns jobs newest first. The cursor is the opaque position
// after the last job of the previous page (the SQLite store's form).
func (s *JobStore) ListJobs(ctx context.Context, f delegate.JobFilter) ([]*delegate.Job, string, error) {
	query, args, limit, err := listJobsQuery(ctx, f)
	if err != nil {
		return nil, "", err
	}
	jobs, seqs, err := s.listRows(ctx, query, args)
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	next := ""
	if len(jobs) > limit {
		jobs, seqs = jobs[:limit], seqs[:limit]
		next = encodeCursor(seqs[limit-1])
	}
	if err := s.withManifests(ctx, jobs, seqs); err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	return jobs, next, nil
}

// listJobsQuery is ListJobs's statement, its arguments and the page's
// size.
func listJobsQuery(ctx context.Context, f delegate.JobFilter) (string, []any, int, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = delegate.DefaultPageSize
	}
	limit = min(limit, delegate.MaxPageSize)
	var (
		conds []string
		args  []any
	)
	where := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if f.Cursor != "" {
		seq, err := decodeCursor(f.Cursor)
		if err != nil {
			return "", nil, 0, err
		}
		where("j.seq < ?", seq)
	}
	if f.Status != "" {
		where("j.status = ?", string(f.Status))
	}
	if f.Active {
		conds = append(conds, "j.status IN "+active)
	}
	if f.Owner != "" {
		where("j.owner = ?", f.Owner)
	}
	if f.Principal != "" {
		where("j.principal = ?", f.Principal)
	}
	if r := delegate.ReaderOf(ctx); r != "" {
		where("j.principal = ?", r)
	}
	// The indexes on these are partial (WHERE col <> ''): a prepared
	// statement's generic plan, which PostgreSQL may take from its sixth
	// run on, knows nothing of $n and uses such an index only where the
	// query says the same (TestListJobsGenericPlanUsesIndexes).
	if f.TokenHash != "" {
		where("j.token_hash = ? AND j.token_hash <> ''", f.TokenHash)
	}
	if f.SandboxID != "" {
		where("j.sandbox_id = ? AND j.sandbox_id <> ''", f.SandboxID)
	}
	if f.Sandbox != "" {
		where("j.sandbox = ? AND j.sandbox <> ''", f.Sandbox) // the latter lets the index jobs_kept serve it
	}
	query := `SELECT ` + selectColumns + ` FROM jobs j`
	if len(conds) > 0 {
		query += ` WHERE ` + strings.Join(conds, " AND ")
	}
	args = append(args, limit+1)
	query += ` ORDER BY j.seq DESC LIMIT $` + strconv.Itoa(len(args))
	return query, args, limit, nil
}

func (s *JobStore) listRows(ctx context.Context, query string, args []any) ([]*delegate.Job, []int64, error) {
	rows, err := s.db.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var (
		jobs []*delegate.Job
		seqs []int64
	)
	for rows.Next() {
		j, seq, err := scanJob(rows, nil)
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
	var missing []int64
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
	rows, err := s.db.pool.Query(ctx, `SELECT seq, manifest FROM job_manifests WHERE seq = ANY($1)`, missing)
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
		if rest, ok := strings.CutPrefix(string(raw), "seq:"); ok {
			if n, err := strconv.ParseInt(rest, 10, 64); err == nil && n > 0 {
				return n, nil
			}
		}
	}
	return 0, &delegate.FieldError{Field: "cursor", Rule: "must be a cursor returned by a previous list_jobs call"}
}

// UpdateJob is a transactional read-modify-write that writes only the
// columns fn changed; see delegate.JobStore. The job's row is locked
// (FOR UPDATE) from the read to the commit: racing updates of one job
// run one after the other, each seeing what the one before wrote, so
// the state machine is checked against the status as stored.
func (s *JobStore) UpdateJob(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	var out *delegate.Job
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		j, seq, err := s.getJob(ctx, tx, "id", id, id, true)
		if errors.Is(err, pgx.ErrNoRows) {
			return delegate.JobNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("update job %s: %w", id, err)
		}
		// A write of the job's owner: only at the epoch it holds.
		f, fenced := delegate.FenceOf(ctx)
		if fenced {
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
		var (
			sets []string
			args []any
		)
		for i := range after {
			if after[i] != before[i] {
				args = append(args, after[i])
				sets = append(sets, jobColumns[i]+" = $"+strconv.Itoa(len(args)))
			}
		}
		args = append(args, seq, epoch)
		tag, err := tx.Exec(ctx, `UPDATE jobs SET `+strings.Join(sets, ", ")+` WHERE seq = $`+strconv.Itoa(len(args)-1)+
			` AND epoch = $`+strconv.Itoa(len(args)), args...)
		if err != nil {
			return fmt.Errorf("update job %s: %w", id, err)
		}
		if tag.RowsAffected() == 0 { // the row is locked: never, but say so if it were
			return s.db.refusal(ctx, tx, id, f)
		}
		out = j
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Finishes counts the jobs that reached a terminal status, in every
// process sharing the database (a trigger counts them as they finish).
func (s *JobStore) Finishes(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.pool.QueryRow(ctx, `SELECT value FROM counters WHERE name = 'finishes'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("finished jobs: %w", err)
	}
	return n, nil
}

// CountJobs counts the stored jobs in each status, for metrics. Every
// status is in the map, zero or not.
func (s *JobStore) CountJobs(ctx context.Context) (map[delegate.Status]int, error) {
	counts := make(map[delegate.Status]int, len(delegate.Statuses))
	for _, st := range delegate.Statuses {
		counts[st] = 0
	}
	rows, err := s.db.pool.Query(ctx, `SELECT status, count(*) FROM jobs GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			st string
			n  int64
		)
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("count jobs: %w", err)
		}
		counts[delegate.Status(st)] = int(n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	return counts, nil
}
