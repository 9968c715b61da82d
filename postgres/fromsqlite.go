package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/jackc/pgx/v5"
)

// Copied is what CopyFromSQLite copied.
type Copied struct {
	Jobs, Sandboxes, Questions, Networks int64
	OutputBytes                          int64 // of the jobs' output
	Workspaces                           int64 // jobs with an imported workspace
}

// sqliteTables are the tables of the SQLite store (sqlite/sqlite.go,
// migration 12) and their columns, all of which are copied. A table or a
// column the SQLite store gains is refused until the copy learns it
// (TestCopyFromSQLiteKnowsEverything fails first): nothing is left behind
// without a word.
var sqliteTables = map[string][]string{
	"jobs": {"seq", "id", "status", "progress", "error", "exit_code", "oom_killed", "output_bytes", "output_truncated",
		"created_at", "updated_at", "started_at", "finished_at", "backend", "sandbox_id", "exec_id", "owner", "result",
		"idempotency_key", "token_hash", "last_heartbeat", "output_read", "timeline_dropped", "stderr_kept", "sandbox",
		"idempotency_digest", "output_lost_bytes", "output_lost", "epoch", "start_token", "attempts", "principal", "cache_missed"},
	"job_manifests":  {"seq", "manifest"},
	"job_files":      {"seq", "files"},
	"job_output":     {"job_id", "offset", "data", "stream", "runs"},
	"job_events":     {"job_id", "seq", "time", "message"},
	"job_artifacts":  {"job_id", "name", "size", "sha256", "skipped"},
	"counters":       {"name", "value"},
	"sandboxes":      {"seq", "id", "state", "backend", "instance", "data", "principal"},
	"job_questions":  {"job_id", "id", "origin", "message", "form", "asked_at", "expires_at", "answer"},
	"job_workspaces": {"seq", "source", "baseline", "changes", "summary"},
	"networks":       {"seq", "id", "token_hash", "token", "ended", "ca", "data"},
	"network_log":    {"network_seq", "seq", "allowed", "attempt", "data"},
	// The leases of the processes that shared the file and their terms:
	// not copied (no server runs on it while it is copied; the servers
	// on the database register their own).
	"servers":           {"id", "host", "host_id", "pid_namespace", "addr", "backend", "started_at", "renewed_at", "expires_at", "draining"},
	"terms":             {"name", "holder", "term", "expires_at"},
	"tokens":            {"seq", "id", "principal", "hash", "scopes", "created_at", "created_by", "expires_at", "revoked_at"},
	"audit":             {"seq", "time", "principal", "action", "target", "detail"},
	"workspace_applies": {"chain", "target", "job_seq", "applied_at"},
}

// NotEmptyError is CopyFromSQLite's refusal of a database that holds
// something already.
type NotEmptyError struct {
	DB                       string // without its password
	Jobs, Sandboxes, Network int64
}

func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("%s is not empty (it holds %d jobs, %d sandboxes and %d networks): store migrate copies into an empty database only, "+
		"so that no job is there twice; nothing was copied (create an empty database, or drop this one's tables if they are not wanted)",
		e.DB, e.Jobs, e.Sandboxes, e.Network)
}

// CopyFromSQLite copies everything the SQLite store at path keeps (jobs
// with their manifests, files, output, timelines, artifacts' records,
// questions and workspaces; kept sandboxes; networks and their logs) into
// db, which must hold none of it (a *NotEmptyError otherwise). It is one
// transaction: a copy that fails leaves db as it was. The SQLite store is
// brought to its newest schema first, as a server starting on it would;
// no server should be running on it meanwhile. Artifacts' contents are
// files beside it (the data dir's artifacts/), not copied.
func (db *DB) CopyFromSQLite(ctx context.Context, path string) (*Copied, error) {
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no SQLite store at %s: %w", path, err)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory: name its jobs.db", path)
	}
	// The SQLite store's own code brings its schema up to date and reads
	// workspaces, which it keeps in a form of its own (compressed).
	src, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	raw, err := sql.Open("sqlite", "file:"+path+"?mode=ro&"+url.Values{"_pragma": {"busy_timeout(10000)"}}.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer raw.Close()
	rtx, err := raw.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer rtx.Rollback()
	if err := knowsEverything(ctx, rtx); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c := &Copied{}
	err = db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// No server writes meanwhile (one that starts waits for the copy).
		if _, err := tx.Exec(ctx, `LOCK TABLE jobs, sandboxes, networks IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		var ne NotEmptyError
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM sandboxes), (SELECT count(*) FROM networks)`).
			Scan(&ne.Jobs, &ne.Sandboxes, &ne.Network); err != nil {
			return err
		}
		if ne.Jobs+ne.Sandboxes+ne.Network > 0 {
			ne.DB = db.name
			return &ne
		}
		return copyTables(ctx, rtx, tx, src, c)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// knowsEverything refuses a SQLite store with a table or a column the
// copy does not know.
func knowsEverything(ctx context.Context, rtx *sql.Tx) error {
	rows, err := rtx.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		return err
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		tables = append(tables, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range tables {
		known, ok := sqliteTables[t]
		if !ok {
			return fmt.Errorf("the SQLite store has a table this delegate cannot copy (%s): nothing was copied; use a delegate as new as the one that wrote it", t)
		}
		cols, err := rtx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, t)
		if err != nil {
			return err
		}
		for cols.Next() {
			var c string
			if err := cols.Scan(&c); err != nil {
				cols.Close()
				return err
			}
			if !slices.Contains(known, c) {
				cols.Close()
				return fmt.Errorf("the SQLite store's table %s has a column this delegate cannot copy (%s): nothing was copied; use a delegate as new as the one that wrote it", t, c)
			}
		}
		cols.Close()
		if err := cols.Err(); err != nil {
			return err
		}
	}
	return nil
}

// copyOne streams the rows of a SQLite query into a table by COPY,
// through conv (a row of the query's values, as scanned into dest, to the
// table's columns).
func copyOne(ctx context.Context, rtx *sql.Tx, tx pgx.Tx, table string, cols []string, query string, dest []any, conv func() []any) (int64, error) {
	rows, err := rtx.QueryContext(ctx, query)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", table, err)
	}
	defer rows.Close()
	n, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromFunc(func() ([]any, error) {
		if !rows.Next() {
			return nil, rows.Err()
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		return conv(), nil
	}))
	if err != nil {
		return 0, fmt.Errorf("copy %s: %w", table, err)
	}
	return n, nil
}

func nanosTS(n int64) ts { return ts(n / 1000) }

func copyTables(ctx context.Context, rtx *sql.Tx, tx pgx.Tx, src *sqlite.DB, c *Copied) error {
	var err error
	// Jobs, with the end of their output (a column here).
	{
		var (
			seq, outputBytes, outputRead, dropped, stderrKept, lostBytes, outputKept int64
			epoch, attempts                                                          int64
			startToken                                                               string
			created, updated, started, finished, heartbeat                           int64
			id, status, progress, errText, backend, sandboxID, execID, owner, result string
			tokenHash, sandbox, digest, lost, principal, cacheMissed                 string
			exit                                                                     sql.NullInt64
			idem                                                                     sql.NullString
			oom, truncated                                                           bool
		)
		dest := []any{&seq, &id, &status, &progress, &errText, &exit, &oom, &outputBytes, &truncated, &created, &updated, &started,
			&finished, &backend, &sandboxID, &execID, &owner, &result, &idem, &tokenHash, &heartbeat, &outputRead, &dropped,
			&sandbox, &digest, &lostBytes, &lost, &epoch, &startToken, &attempts, &principal, &cacheMissed, &stderrKept, &outputKept}
		cols := append([]string{"seq", "id"}, jobColumns...)
		cols = append(cols, "stderr_kept", "output_kept")
		c.Jobs, err = copyOne(ctx, rtx, tx, "jobs", cols, `SELECT seq, id, status, progress, error, exit_code, oom_killed, output_bytes,
			output_truncated, created_at, updated_at, started_at, finished_at, backend, sandbox_id, exec_id, owner, result,
			idempotency_key, token_hash, last_heartbeat, output_read, timeline_dropped, sandbox, idempotency_digest,
			output_lost_bytes, output_lost, epoch, start_token, attempts, principal, cache_missed, stderr_kept,
			(SELECT coalesce(max(o.offset + length(o.data)), 0) FROM job_output o WHERE o.job_id = jobs.id)
			FROM jobs ORDER BY seq`, dest, func() []any {
			var e, k any
			if exit.Valid {
				e = int32(exit.Int64)
			}
			if idem.Valid {
				k = idem.String
			}
			return []any{seq, id, status, clean(progress), clean(errText), e, oom, outputBytes, truncated, nanosTS(created),
				nanosTS(updated), nanosTS(started), nanosTS(finished), backend, sandboxID, execID, owner, clean(result), k, tokenHash,
				nanosTS(heartbeat), outputRead, dropped, sandbox, digest, lostBytes, clean(lost), epoch, startToken, int32(attempts),
				clean(principal), clean(cacheMissed), stderrKept, outputKept}
		})
		if err != nil {
			return err
		}
	}
	{
		var (
			seq  int64
			text string
		)
		for _, t := range []struct{ table, col string }{{"job_manifests", "manifest"}, {"job_files", "files"}} {
			if _, err := copyOne(ctx, rtx, tx, t.table, []string{"seq", t.col}, `SELECT seq, `+t.col+` FROM `+t.table, []any{&seq, &text},
				func() []any { return []any{seq, text} }); err != nil {
				return err
			}
		}
	}
	{
		var (
			jobID      string
			offset     int64
			data, runs []byte
			stream     int64
			row        = func() []any {
				c.OutputBytes += int64(len(data))
				if data == nil {
					data = []byte{}
				}
				return []any{jobID, offset, data, int16(stream), runs}
			}
		)
		if _, err := copyOne(ctx, rtx, tx, "job_output", []string{"job_id", "offset", "data", "stream", "runs"},
			`SELECT job_id, offset, data, stream, runs FROM job_output`, []any{&jobID, &offset, &data, &stream, &runs}, row); err != nil {
			return err
		}
	}
	{
		var (
			jobID, msg string
			seq, at    int64
		)
		if _, err := copyOne(ctx, rtx, tx, "job_events", []string{"job_id", "seq", "time", "message"},
			`SELECT job_id, seq, time, message FROM job_events`, []any{&jobID, &seq, &at, &msg},
			func() []any { return []any{jobID, seq, nanosTS(at), clean(msg)} }); err != nil {
			return err
		}
	}
	{
		var (
			jobID, name, sum, skipped string
			size                      int64
		)
		if _, err := copyOne(ctx, rtx, tx, "job_artifacts", []string{"job_id", "name", "size", "sha256", "skipped"},
			`SELECT job_id, name, size, sha256, skipped FROM job_artifacts`, []any{&jobID, &name, &size, &sum, &skipped},
			func() []any { return []any{jobID, clean(name), size, sum, clean(skipped)} }); err != nil {
			return err
		}
	}
	{
		var (
			seq                                           int64
			id, state, backend, instance, data, principal string
		)
		c.Sandboxes, err = copyOne(ctx, rtx, tx, "sandboxes", []string{"seq", "id", "state", "backend", "instance", "data", "principal"},
			`SELECT seq, id, state, backend, instance, data, principal FROM sandboxes`,
			[]any{&seq, &id, &state, &backend, &instance, &data, &principal},
			func() []any { return []any{seq, id, state, backend, instance, data, clean(principal)} })
		if err != nil {
			return err
		}
	}
	{
		var (
			seq, asked, expires              int64
			jobID, id, origin, message, form string
			answer                           sql.NullString
		)
		c.Questions, err = copyOne(ctx, rtx, tx, "job_questions",
			[]string{"seq", "job_id", "id", "origin", "message", "form", "asked_at", "expires_at", "answer"},
			`SELECT rowid, job_id, id, origin, message, form, asked_at, expires_at, answer FROM job_questions ORDER BY rowid`,
			[]any{&seq, &jobID, &id, &origin, &message, &form, &asked, &expires, &answer},
			func() []any {
				var a any
				if answer.Valid {
					a = answer.String
				}
				return []any{seq, jobID, id, clean(origin), clean(message), form, nanosTS(asked), nanosTS(expires), a}
			})
		if err != nil {
			return err
		}
	}
	{
		var (
			seq, ended            int64
			id, hash, token, data string
			ca                    []byte
		)
		c.Networks, err = copyOne(ctx, rtx, tx, "networks", []string{"seq", "id", "token_hash", "token", "ended", "ca", "data"},
			`SELECT seq, id, token_hash, token, ended, ca, data FROM networks`, []any{&seq, &id, &hash, &token, &ended, &ca, &data},
			func() []any { return []any{seq, id, hash, token, ended != 0, ca, data} })
		if err != nil {
			return err
		}
		var (
			netSeq           int64
			allowed, attempt bool
		)
		if _, err := copyOne(ctx, rtx, tx, "network_log", []string{"network_seq", "seq", "allowed", "attempt", "data"},
			`SELECT network_seq, seq, allowed, attempt, data FROM network_log`, []any{&netSeq, &seq, &allowed, &attempt, &data},
			func() []any { return []any{netSeq, seq, allowed, attempt, data} }); err != nil {
			return err
		}
	}
	if err := copyPrincipals(ctx, rtx, tx); err != nil {
		return err
	}
	// Workspaces through the SQLite store, which reads its own form.
	if err := copyWorkspaces(ctx, rtx, tx, src, c); err != nil {
		return err
	}
	// The next seqs follow the copied ones; the count of finishes goes on
	// from the SQLite store's (it counts pruned jobs too).
	for _, t := range []string{"jobs", "sandboxes", "networks", "job_questions", "tokens", "audit"} {
		if _, err := tx.Exec(ctx, `SELECT setval(pg_get_serial_sequence('`+t+`', 'seq'), coalesce(max(seq), 0) + 1, false) FROM `+t); err != nil {
			return fmt.Errorf("sequence of %s: %w", t, err)
		}
	}
	var finishes int64
	if err := rtx.QueryRowContext(ctx, `SELECT coalesce((SELECT value FROM counters WHERE name = 'finishes'), 0)`).Scan(&finishes); err != nil {
		return fmt.Errorf("read counters: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE counters SET value = greatest(value, $1) WHERE name = 'finishes'`, finishes); err != nil {
		return fmt.Errorf("counters: %w", err)
	}
	return nil
}

// copyPrincipals copies delegate's own tokens (their hashes) and the
// audit trail.
func copyPrincipals(ctx context.Context, rtx *sql.Tx, tx pgx.Tx) error {
	var (
		seq, created, expires, revoked                  int64
		id, principal, hash, scopes, by, action, target string
	)
	if _, err := copyOne(ctx, rtx, tx, "tokens", sqliteTables["tokens"], `SELECT `+strings.Join(sqliteTables["tokens"], ", ")+` FROM tokens`,
		[]any{&seq, &id, &principal, &hash, &scopes, &created, &by, &expires, &revoked},
		func() []any {
			return []any{seq, id, clean(principal), hash, scopes, nanosTS(created), clean(by), nanosTS(expires), nanosTS(revoked)}
		}); err != nil {
		return err
	}
	_, err := copyOne(ctx, rtx, tx, "audit", sqliteTables["audit"], `SELECT `+strings.Join(sqliteTables["audit"], ", ")+` FROM audit`,
		[]any{&seq, &created, &principal, &action, &target, &by},
		func() []any { return []any{seq, nanosTS(created), clean(principal), action, clean(target), clean(by)} })
	return err
}

func copyWorkspaces(ctx context.Context, rtx *sql.Tx, tx pgx.Tx, src *sqlite.DB, c *Copied) error {
	rows, err := rtx.QueryContext(ctx, `SELECT j.seq, j.id FROM job_workspaces w JOIN jobs j ON j.seq = w.seq ORDER BY j.seq`)
	if err != nil {
		return fmt.Errorf("read job_workspaces: %w", err)
	}
	type job struct {
		seq int64
		id  string
	}
	var jobs []job
	for rows.Next() {
		var j job
		if err := rows.Scan(&j.seq, &j.id); err != nil {
			rows.Close()
			return err
		}
		jobs = append(jobs, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, j := range jobs {
		w, err := src.JobWorkspace(ctx, j.id)
		if errors.Is(err, delegate.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("workspace of job %s: %w", j.id, err)
		}
		var summary any
		if w.Summary != nil {
			b, err := json.Marshal(w.Summary)
			if err != nil {
				return err
			}
			summary = string(b)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO job_workspaces (seq, source, baseline, changes, summary) VALUES ($1, $2, $3, $4, $5)`,
			j.seq, clean(w.Source), w.Baseline, w.Changes, summary); err != nil {
			return fmt.Errorf("workspace of job %s: %w", j.id, err)
		}
		c.Workspaces++
	}
	var (
		chain, target string
		seq, at       int64
	)
	if _, err := copyOne(ctx, rtx, tx, "workspace_applies", []string{"chain", "target", "job_seq", "applied_at"},
		`SELECT chain, target, job_seq, applied_at FROM workspace_applies`, []any{&chain, &target, &seq, &at},
		func() []any { return []any{clean(chain), clean(target), seq, nanosTS(at)} }); err != nil {
		return err
	}
	return nil
}

// SQLitePath reads the --from of `delegate store migrate`: sqlite:PATH,
// PATH a jobs.db or the data dir that holds one.
func SQLitePath(from string) (string, error) {
	path, ok := strings.CutPrefix(from, "sqlite:")
	if !ok || path == "" {
		return "", fmt.Errorf("must be sqlite:PATH, PATH the data dir or its jobs.db (got %q)", from)
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, "jobs.db")
	}
	return path, nil
}
