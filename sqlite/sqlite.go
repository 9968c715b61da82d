// Package sqlite keeps delegate's jobs in one SQLite file (pure Go driver,
// WAL), so that a restarted server, and the CLI beside it, see every job.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"

	"github.com/delegate-dev/delegate"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// DB is one SQLite database file: the write connection with its
// group-commit writer, a small pool of readers, and the schema. Its stores,
// one per resource, share them; through them a DB is a delegate.Store.
//
// Writes go through the one write connection, committed in groups (see
// writer); reads use the pool, so that in WAL mode they never wait behind
// a write. Every statement on the hot paths is prepared once, by the store
// that runs it: the SQL parser was a third of the cost of each call.
type DB struct {
	*JobStore
	*ProgressStore
	*OutputStore
	*ArtifactStore
	*SandboxStore
	*QuestionStore
	*WorkspaceStore
	*NetworkStore
	*ServerStore
	*TokenStore
	*AuditStore
	*QuotaStore

	w   writer
	wdb *sql.DB // the write connection (one)
	rdb *sql.DB // readers
}

var _ delegate.Store = (*DB)(nil)

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
	// The manifest leaves the job row: SQLite rewrites a whole row on any
	// update, and a manifest may carry 64 MiB of files (and large task and
	// env values), so every progress line rewrote them all. The manifest
	// (immutable) and its files now live in tables of their own, keyed by
	// the job's rowid (no index to maintain); the job row holds only what
	// changes, and loses AUTOINCREMENT (one page less per insert: jobs are
	// never deleted, so rowids are not reused). The timeline counts what
	// it dropped, and a counter of finished jobs lets a process notice
	// that another one finished a job without reading every job.
	// (Run with foreign keys off: see migrate.)
	`CREATE TABLE jobs_v3 (
		seq INTEGER PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		status TEXT NOT NULL,
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
		owner TEXT NOT NULL DEFAULT '',
		result TEXT NOT NULL DEFAULT '',
		idempotency_key TEXT,
		token_hash TEXT NOT NULL DEFAULT '',
		last_heartbeat INTEGER NOT NULL DEFAULT 0,
		output_read INTEGER NOT NULL DEFAULT 0,
		timeline_dropped INTEGER NOT NULL DEFAULT 0
	);
	INSERT INTO jobs_v3 (seq, id, status, progress, error, exit_code, oom_killed, output_bytes, output_truncated,
		created_at, updated_at, started_at, finished_at, backend, sandbox_id, exec_id, owner, result,
		idempotency_key, token_hash, last_heartbeat, output_read)
	SELECT seq, id, status, progress, error, exit_code, oom_killed, output_bytes, output_truncated,
		created_at, updated_at, started_at, finished_at, backend, sandbox_id, exec_id, owner, result,
		idempotency_key, token_hash, last_heartbeat, output_read FROM jobs;
	CREATE TABLE job_manifests (
		seq INTEGER PRIMARY KEY REFERENCES jobs(seq) ON DELETE CASCADE,
		manifest TEXT NOT NULL
	);
	INSERT INTO job_manifests (seq, manifest) SELECT seq, json_remove(manifest, '$.files') FROM jobs;
	CREATE TABLE job_files (
		seq INTEGER PRIMARY KEY REFERENCES jobs(seq) ON DELETE CASCADE,
		files TEXT NOT NULL
	);
	INSERT INTO job_files (seq, files) SELECT seq, json_extract(manifest, '$.files') FROM jobs
		WHERE json_type(manifest, '$.files') = 'array';
	DROP TABLE jobs;
	ALTER TABLE jobs_v3 RENAME TO jobs;
	DELETE FROM sqlite_sequence WHERE name = 'jobs';
	CREATE INDEX jobs_status ON jobs(status, seq);
	CREATE UNIQUE INDEX jobs_idempotency_key ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;
	CREATE INDEX jobs_sandbox ON jobs(sandbox_id) WHERE sandbox_id != '';
	CREATE INDEX jobs_token ON jobs(token_hash) WHERE token_hash != '';
	CREATE TABLE counters (
		name TEXT PRIMARY KEY NOT NULL,
		value INTEGER NOT NULL
	);
	INSERT INTO counters (name, value)
		SELECT 'finishes', count(*) FROM jobs WHERE status IN ('success', 'failed', 'timeout', 'cancelled');`,
	// A job's output keeps its stdout and stderr apart, in the order
	// written. A row is still one append, its bytes in order; stream says
	// which stream they are from: 0 both together, not told apart (every
	// row from before), 1 stdout, 2 stderr, 3 both (runs says which bytes
	// are which, see streams.go). The tail of stderr is read through an
	// index of the rows that have some (most output is stdout), and a job
	// counts the stderr bytes it keeps. Existing rows are not rewritten.
	`ALTER TABLE job_output ADD COLUMN stream INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE job_output ADD COLUMN runs BLOB;
	CREATE INDEX job_output_stderr ON job_output(job_id, offset) WHERE stream >= 2;
	ALTER TABLE jobs ADD COLUMN stderr_kept INTEGER NOT NULL DEFAULT 0;`,
	// Kept sandboxes (issue 17): a row each, whole as JSON beside the
	// columns they are selected by; a job names the kept sandbox it ran
	// in or made.
	`CREATE TABLE sandboxes (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		state TEXT NOT NULL,
		backend TEXT NOT NULL,
		instance TEXT NOT NULL,
		data TEXT NOT NULL
	);
	CREATE INDEX sandboxes_live ON sandboxes(state, seq);
	CREATE INDEX sandboxes_instance ON sandboxes(backend, instance);
	ALTER TABLE jobs ADD COLUMN sandbox TEXT NOT NULL DEFAULT '';`,
	// The questions jobs ask (question.go), in the order asked (rowid).
	// form is the requestedSchema as JSON; answer is the answer as JSON,
	// NULL while there is none.
	`CREATE TABLE job_questions (
		job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
		id TEXT NOT NULL,
		origin TEXT NOT NULL,
		message TEXT NOT NULL,
		form TEXT NOT NULL,
		asked_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL DEFAULT 0,
		answer TEXT,
		UNIQUE (job_id, id)
	);`,
	// An idempotency key keeps the digest of the manifest it was first
	// sent with, so that the key sent again with another manifest is
	// refused rather than answered with the first job. Jobs from before
	// have none ('') and match any manifest, as they did.
	`ALTER TABLE jobs ADD COLUMN idempotency_digest TEXT NOT NULL DEFAULT '';`,
	// Imported workspaces (issue 18): per job, the baseline of its import
	// and, once it has ended, its changes and their summary, in a table of
	// their own (they may be megabytes; the job row is rewritten on every
	// update).
	`CREATE TABLE job_workspaces (
		seq INTEGER PRIMARY KEY REFERENCES jobs(seq) ON DELETE CASCADE,
		source TEXT NOT NULL DEFAULT '',
		baseline BLOB,
		changes BLOB,
		summary TEXT
	);`,
	// Networks the egress proxy serves (issue 23): a job's or a kept
	// sandbox's, found by id or by its token's hash; each with its log.
	`CREATE TABLE networks (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		token_hash TEXT NOT NULL UNIQUE,
		token TEXT NOT NULL DEFAULT '',
		ended INTEGER NOT NULL DEFAULT 0,
		ca BLOB,
		data TEXT NOT NULL
	);
	CREATE INDEX networks_live ON networks(ended, seq);
	CREATE TABLE network_log (
		network_seq INTEGER NOT NULL REFERENCES networks(seq) ON DELETE CASCADE,
		seq INTEGER NOT NULL,
		allowed INTEGER NOT NULL,
		attempt INTEGER NOT NULL,
		data TEXT NOT NULL,
		PRIMARY KEY (network_seq, seq)
	) WITHOUT ROWID;`,
	// A kept sandbox's activity (the commands submitted to it, those not
	// ended, the last end) is read from its jobs (sandboxes.go) instead
	// of being counted in its row by two more writes per command: this
	// index finds them, and the ones not ended (finished_at 0) first.
	`CREATE INDEX jobs_kept ON jobs(sandbox, finished_at) WHERE sandbox != '';`,
	// Output that could not be stored is counted, with why (issue 35);
	// retention finds the artifact files no kept job names through an
	// index of their digests.
	`ALTER TABLE jobs ADD COLUMN output_lost_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE jobs ADD COLUMN output_lost TEXT NOT NULL DEFAULT '';
	CREATE INDEX job_artifacts_sha256 ON job_artifacts(sha256) WHERE sha256 != '';`,
	// Several processes share the file (delegate.ServerStore): each holds
	// a lease in servers; a job's owner writes it at its epoch; terms are
	// the duties one process at a time holds. Times are the host's clock
	// (every process sharing a SQLite file is on one host), in ns.
	`ALTER TABLE jobs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE jobs ADD COLUMN start_token TEXT NOT NULL DEFAULT '';
	ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX jobs_owned ON jobs(owner) WHERE status IN ('pending', 'provisioning', 'running');
	CREATE TABLE servers (
		id TEXT PRIMARY KEY,
		host TEXT NOT NULL DEFAULT '',
		host_id TEXT NOT NULL DEFAULT '',
		pid_namespace TEXT NOT NULL DEFAULT '',
		addr TEXT NOT NULL DEFAULT '',
		backend TEXT NOT NULL DEFAULT '',
		started_at INTEGER NOT NULL,
		renewed_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		draining INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE terms (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		term INTEGER NOT NULL,
		expires_at INTEGER NOT NULL
	);
	INSERT INTO counters (name, value) VALUES ('terms', 0);`,
	// Principals (issue 36): a job and a kept sandbox belong to the
	// principal that made it (all before are the local user's), and the
	// reads filter by it (jobs_principal serves a principal's listing); an
	// idempotency key is its principal's; delegate's own tokens (their
	// hashes only) and the audit trail.
	`ALTER TABLE jobs ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
	ALTER TABLE sandboxes ADD COLUMN principal TEXT NOT NULL DEFAULT 'local';
	CREATE INDEX jobs_principal ON jobs(principal, seq);
	DROP INDEX jobs_idempotency_key;
	CREATE UNIQUE INDEX jobs_idempotency_key ON jobs(principal, idempotency_key) WHERE idempotency_key IS NOT NULL;
	CREATE TABLE tokens (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		principal TEXT NOT NULL,
		hash TEXT NOT NULL UNIQUE,
		scopes TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL DEFAULT '',
		expires_at INTEGER NOT NULL DEFAULT 0,
		revoked_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE audit (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		time INTEGER NOT NULL,
		principal TEXT NOT NULL,
		action TEXT NOT NULL,
		target TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX audit_principal ON audit(principal, seq);`,
	// Where a workspace's changes were applied last (issue 40): per chain
	// (a kept sandbox's id, or a job's own) and target directory, the job
	// whose changes were written, so that the next apply there starts
	// from them. A row goes with its job.
	`CREATE TABLE workspace_applies (
		chain TEXT NOT NULL,
		target TEXT NOT NULL,
		job_seq INTEGER NOT NULL REFERENCES jobs(seq) ON DELETE CASCADE,
		applied_at INTEGER NOT NULL,
		PRIMARY KEY (chain, target)
	) WITHOUT ROWID;
	CREATE INDEX workspace_applies_job ON workspace_applies(job_seq);`,
	// The caches a job had an empty one of, and why (issue 34, item 5):
	// its result says so, not only its timeline.
	`ALTER TABLE jobs ADD COLUMN cache_missed TEXT NOT NULL DEFAULT '';`,
}

// Open opens (creating if needed) the database file at path and brings its
// schema up to date.
func Open(ctx context.Context, path string) (*DB, error) {
	if err := ownFiles(path); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	common := func() url.Values {
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		return q
	}
	wq := common()
	wq.Add("_pragma", "journal_mode(WAL)")
	wq.Add("_pragma", "foreign_keys(1)")
	// NORMAL in WAL mode: a commit is in the WAL (the kernel's page cache)
	// when it returns, so it survives the process being killed; only a
	// power cut can lose the last commits before a checkpoint.
	wq.Add("_pragma", "synchronous(NORMAL)")
	wq.Set("_txlock", "immediate") // writers queue on the lock instead of failing on upgrade
	wdb, err := sql.Open("sqlite", "file:"+path+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One write connection: SQLite writes are serial anyway, and the
	// writer groups them.
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	db := &DB{wdb: wdb}
	db.w = writer{db: wdb}
	if err := db.migrate(ctx); err != nil {
		wdb.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	rq := common()
	rq.Add("_pragma", "query_only(1)")
	rdb, err := sql.Open("sqlite", "file:"+path+"?"+rq.Encode())
	if err != nil {
		wdb.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(readers)
	rdb.SetMaxIdleConns(readers)
	db.rdb = rdb
	if err := db.openStores(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// openStores makes the stores and prepares their statements, and the
// writer's.
func (db *DB) openStores(ctx context.Context) error {
	var err error
	if db.JobStore, err = newJobStore(ctx, db); err != nil {
		return err
	}
	// The UPDATE statements a write needed are prepared between groups
	// (the one write connection is busy until then).
	db.w.between = db.JobStore.prepareWanted
	if db.ProgressStore, err = newProgressStore(ctx, db); err != nil {
		return err
	}
	if db.OutputStore, err = newOutputStore(ctx, db); err != nil {
		return err
	}
	if db.ArtifactStore, err = newArtifactStore(ctx, db); err != nil {
		return err
	}
	if db.SandboxStore, err = newSandboxStore(ctx, db); err != nil {
		return err
	}
	if db.QuestionStore, err = newQuestionStore(ctx, db); err != nil {
		return err
	}
	if db.WorkspaceStore, err = newWorkspaceStore(ctx, db); err != nil {
		return err
	}
	if db.NetworkStore, err = newNetworkStore(ctx, db); err != nil {
		return err
	}
	db.ServerStore = &ServerStore{db: db}
	if db.TokenStore, err = newTokenStore(ctx, db); err != nil {
		return err
	}
	if db.AuditStore, err = newAuditStore(ctx, db); err != nil {
		return err
	}
	db.QuotaStore = &QuotaStore{db: db}
	return db.prepare(ctx, []statement{
		{db.wdb, &db.w.savepoint, `SAVEPOINT w`},
		{db.wdb, &db.w.rollbackTo, `ROLLBACK TO w`},
		{db.wdb, &db.w.release, `RELEASE w`},
	})
}

// statement is one statement to prepare on one of the connections, when
// first needed rather than when the store opens: SQLite's parsing of the
// ~60 statements at open was a tenth of a CLI command's CPU (`delegate
// run --script true`, `delegate exec`), which uses a few of them (issue
// 41, item 2). dst is a **readStmt (the read pool's), or a **writeStmt of
// the write connection, which the writer prepares once it has been used
// twice, between transactions (preparePending): prepared inside one, it
// would wait for ever on the one write connection the transaction holds.
type statement struct {
	db   *sql.DB
	dst  any
	text string
}

func (db *DB) prepare(ctx context.Context, stmts []statement) error {
	for _, p := range stmts {
		switch dst := p.dst.(type) {
		case **readStmt:
			*dst = &readStmt{db: p.db, text: p.text}
		case **writeStmt:
			if p.db != db.wdb {
				return fmt.Errorf("prepare %q: a *writeStmt of the read pool (a read statement is a *readStmt)", p.text)
			}
			*dst = &writeStmt{w: &db.w, text: p.text}
		default:
			return fmt.Errorf("prepare %q: a destination of type %T", p.text, p.dst)
		}
	}
	return nil
}

// readStmt is a statement of the read pool, prepared when first used
// rather than when the store opens: SQLite's parsing of every statement
// at open was a tenth of a CLI command's CPU (`delegate run --script
// true`, `delegate exec`), which use a few (issue 41, item 2).
type readStmt struct {
	db   *sql.DB
	text string
	st   atomic.Pointer[sql.Stmt]
	mu   sync.Mutex // held while preparing
}

// stmt is the prepared statement, prepared now if it is not yet.
func (r *readStmt) stmt(ctx context.Context) (*sql.Stmt, error) {
	if st := r.st.Load(); st != nil {
		return st, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.st.Load(); st != nil {
		return st, nil
	}
	st, err := r.db.PrepareContext(ctx, r.text)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", r.text, err)
	}
	r.st.Store(st)
	return st, nil
}

// rowQuerier is a statement that reads one row: a readStmt, or a
// *sql.Stmt of a transaction.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

// QueryContext is sql.Stmt's.
func (r *readStmt) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	st, err := r.stmt(ctx)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext is sql.Stmt's. Where the statement cannot be prepared,
// the row is the query's unprepared, which carries the same error (a
// *sql.Row's error is database/sql's to set).
func (r *readStmt) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	st, err := r.stmt(ctx)
	if err != nil {
		return r.db.QueryRowContext(ctx, r.text, args...)
	}
	return st.QueryRowContext(ctx, args...)
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

// readers is the size of the read pool: more than the cores of a small
// server gains nothing.
const readers = 4

func (db *DB) migrate(ctx context.Context) error {
	// A migration that rebuilds a table must not cascade its drop to the
	// tables that refer to it: foreign keys are off while migrations run
	// (a pragma that does nothing inside a transaction), and checked before
	// the commit.
	conn, err := db.wdb.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA foreign_keys = ON`)
	tx, err := conn.BeginTx(ctx, nil)
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
	if version == len(migrations) {
		return nil
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	rows, err := tx.QueryContext(ctx, `PRAGMA foreign_key_check`)
	if err != nil {
		return err
	}
	broken := rows.Next()
	rows.Close()
	if broken {
		return fmt.Errorf("migration %d left rows without the job they refer to", len(migrations))
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(migrations))); err != nil {
		return err
	}
	return tx.Commit()
}

// Close closes the database.
func (db *DB) Close() error {
	var err error
	if db.rdb != nil {
		err = db.rdb.Close()
	}
	if werr := db.wdb.Close(); err == nil {
		err = werr
	}
	return err
}

// WriteStats are counts of this database's writes since it was opened.
type WriteStats struct {
	Commits int64 // transactions committed
	Writes  int64 // writes (CreateJob, UpdateJob, SaveProgress...) in them
}

// WriteStats counts the writes committed so far: a test or a benchmark
// sees how many transactions a piece of work cost.
func (db *DB) WriteStats() WriteStats {
	return WriteStats{Commits: db.w.commits.Load(), Writes: db.w.writes.Load()}
}
