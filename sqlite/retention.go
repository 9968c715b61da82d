package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// pruneBatch is how many jobs one transaction of a prune removes: a job
// may keep 64 MiB of output, and every other write waits for the
// transaction to commit.
const pruneBatch = 50

// prunable selects, after a rowid, the finished jobs that ended before a
// time (a job finished before finished_at was recorded counts from its
// last update), with what they keep: output, workspace and the rest
// (manifest, files, timeline), in bytes. A job is kept while its kept
// sandbox exists, and a persistent job's while it was never released.
const prunable = `SELECT j.seq, j.id,
	(SELECT coalesce(sum(length(o.data)), 0) FROM job_output o WHERE o.job_id = j.id),
	(SELECT coalesce(sum(coalesce(length(w.baseline), 0) + coalesce(length(w.changes), 0) + coalesce(length(w.summary), 0)), 0)
		FROM job_workspaces w WHERE w.seq = j.seq),
	length(m.manifest)
		+ (SELECT coalesce(sum(length(f.files)), 0) FROM job_files f WHERE f.seq = j.seq)
		+ (SELECT coalesce(sum(length(e.message)), 0) FROM job_events e WHERE e.job_id = j.id)
		+ (SELECT coalesce(sum(length(q.message) + length(q.form) + coalesce(length(q.answer), 0)), 0) FROM job_questions q WHERE q.job_id = j.id)
		+ (SELECT coalesce(sum(coalesce(length(o.runs), 0)), 0) FROM job_output o WHERE o.job_id = j.id)
		+ length(j.progress) + length(j.error) + length(j.result)
FROM jobs j JOIN job_manifests m ON m.seq = j.seq
WHERE j.seq > ? AND j.status IN ('success', 'failed', 'timeout', 'cancelled')
	AND (CASE WHEN j.finished_at != 0 THEN j.finished_at ELSE j.updated_at END) < ?
	AND NOT (j.sandbox != '' AND EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = j.sandbox AND s.state NOT IN ('released', 'gone')))
	AND NOT (j.sandbox = '' AND j.sandbox_id != '' AND json_extract(m.manifest, '$.lifecycle') = 'persistent')
ORDER BY j.seq LIMIT ?`

type prunedJob struct {
	seq                      int64
	id                       string
	output, workspace, other int64
}

// Prune removes what ended before before (see delegate.RetentionStore).
func (db *DB) Prune(ctx context.Context, before time.Time, opts delegate.PruneOptions) (*delegate.Pruned, error) {
	p := &delegate.Pruned{}
	cutoff := before.UnixNano()
	digests := map[string]struct{}{} // of the artifacts of the jobs pruned
	var gone []string                // ids of the jobs pruned (or, dry, that would be)
	for after := int64(0); ; {
		var batch []prunedJob
		var err error
		if opts.DryRun {
			batch, err = db.prunable(ctx, db.rdb, after, cutoff)
		} else {
			err = db.w.do(ctx, func(tx *sql.Tx) error {
				if batch, err = db.prunable(ctx, tx, after, cutoff); err != nil {
					return err
				}
				if err := artifactDigests(ctx, tx, batch, digests); err != nil {
					return err
				}
				return deleteJobs(ctx, tx, batch)
			})
		}
		if err != nil {
			return p, fmt.Errorf("prune jobs: %w", err)
		}
		if opts.DryRun {
			if err := artifactDigests(ctx, db.rdb, batch, digests); err != nil {
				return p, fmt.Errorf("prune jobs: %w", err)
			}
		}
		for _, j := range batch {
			p.Jobs++
			p.OutputBytes += j.output
			p.WorkspaceBytes += j.workspace
			p.Bytes += j.output + j.workspace + j.other
			gone = append(gone, j.id)
			after = j.seq
		}
		if len(batch) < pruneBatch {
			break
		}
	}
	if !opts.DryRun {
		db.JobStore.manifests.forget(gone)
	}
	if err := db.pruneSandboxes(ctx, before, opts.DryRun, gone, p); err != nil {
		return p, err
	}
	// The artifact contents none of the jobs left names.
	for sum := range digests {
		var n int
		err := db.rdb.QueryRowContext(ctx, `SELECT count(*) FROM job_artifacts WHERE sha256 = ? AND job_id NOT IN (SELECT value FROM json_each(?))`,
			sum, idList(opts.DryRun, gone)).Scan(&n)
		if err != nil {
			return p, fmt.Errorf("prune artifacts: %w", err)
		}
		if n == 0 {
			p.Artifacts = append(p.Artifacts, sum)
		}
	}
	return p, nil
}

// idList is, for a dry run, the ids that would have gone (as JSON, for
// json_each): they still name their artifacts and sandboxes. After a real
// prune they are gone already, and the list is empty.
func idList(dry bool, ids []string) string {
	if !dry || len(ids) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (db *DB) prunable(ctx context.Context, q querier, after, cutoff int64) ([]prunedJob, error) {
	rows, err := q.QueryContext(ctx, prunable, after, cutoff, pruneBatch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []prunedJob
	for rows.Next() {
		var j prunedJob
		if err := rows.Scan(&j.seq, &j.id, &j.output, &j.workspace, &j.other); err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

func artifactDigests(ctx context.Context, q querier, batch []prunedJob, into map[string]struct{}) error {
	for _, j := range batch {
		rows, err := q.QueryContext(ctx, `SELECT sha256 FROM job_artifacts WHERE job_id = ? AND sha256 != ''`, j.id)
		if err != nil {
			return err
		}
		for rows.Next() {
			var sum string
			if err := rows.Scan(&sum); err != nil {
				rows.Close()
				return err
			}
			into[sum] = struct{}{}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// deleteJobs removes jobs; what they keep goes with them (ON DELETE
// CASCADE).
func deleteJobs(ctx context.Context, tx *sql.Tx, batch []prunedJob) error {
	if len(batch) == 0 {
		return nil
	}
	seqs := make([]string, len(batch))
	for i, j := range batch {
		seqs[i] = fmt.Sprint(j.seq)
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM jobs WHERE seq IN (`+strings.Join(seqs, ",")+`)`)
	return err
}

// pruneSandboxes removes the kept sandboxes that ended before before and
// that no job left names, then the ended networks that no job or sandbox
// left names.
func (db *DB) pruneSandboxes(ctx context.Context, before time.Time, dry bool, goneJobs []string, p *delegate.Pruned) error {
	ids := idList(dry, goneJobs)
	rows, err := db.rdb.QueryContext(ctx, `SELECT s.id, s.data FROM sandboxes s WHERE s.state IN ('released', 'gone')
		AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.sandbox = s.id AND j.sandbox != '' AND j.id NOT IN (SELECT value FROM json_each(?)))`, ids)
	if err != nil {
		return fmt.Errorf("prune sandboxes: %w", err)
	}
	var old []string
	for rows.Next() {
		var (
			id   string
			data []byte
			sb   sandboxRow
		)
		if err := rows.Scan(&id, &data); err != nil {
			rows.Close()
			return fmt.Errorf("prune sandboxes: %w", err)
		}
		if err := json.Unmarshal(data, &sb); err != nil {
			rows.Close()
			return fmt.Errorf("prune sandboxes: sandbox %s: %w", id, err)
		}
		if !sb.EndedAt.IsZero() && sb.EndedAt.Before(before) {
			old = append(old, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("prune sandboxes: %w", err)
	}
	p.Sandboxes = len(old)
	gone := idList(true, old)
	// A network is a job's (its id) or a kept sandbox's (the id of the job
	// that made it, else its own).
	const orphanNetworks = `FROM networks WHERE ended != 0
		AND (id NOT IN (SELECT id FROM jobs) OR id IN (SELECT value FROM json_each(?1)))
		AND (id NOT IN (SELECT id FROM sandboxes) OR id IN (SELECT value FROM json_each(?2)))`
	if dry {
		err := db.rdb.QueryRowContext(ctx, `SELECT count(*) `+orphanNetworks, ids, gone).Scan(&p.Networks)
		if err != nil {
			return fmt.Errorf("prune networks: %w", err)
		}
		return nil
	}
	return db.w.do(ctx, func(tx *sql.Tx) error {
		if len(old) > 0 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id IN (SELECT value FROM json_each(?))`, gone); err != nil {
				return fmt.Errorf("prune sandboxes: %w", err)
			}
		}
		res, err := tx.ExecContext(ctx, `DELETE `+orphanNetworks, "[]", "[]")
		if err != nil {
			return fmt.Errorf("prune networks: %w", err)
		}
		n, _ := res.RowsAffected()
		p.Networks = int(n)
		return nil
	})
}
