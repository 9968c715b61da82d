package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// pruneBatch is how many jobs one transaction of a prune removes: a job
// may keep 64 MiB of output.
const pruneBatch = 50

// prunable selects, after a seq, the finished jobs that ended before a
// time (one finished before finished_at was recorded counts from its last
// update), with what they keep: output, workspace and the rest (manifest,
// files, timeline, questions), in bytes. A job is kept while its kept
// sandbox exists, and a persistent job's while it was never released (the
// SQLite store's rules). The rows are locked for the delete; one another
// transaction holds is skipped (SKIP LOCKED), for the next prune.
const prunable = `SELECT j.seq, j.id,
	(SELECT coalesce(sum(octet_length(o.data)), 0) FROM job_output o WHERE o.job_id = j.id),
	(SELECT coalesce(sum(coalesce(octet_length(w.baseline), 0) + coalesce(octet_length(w.changes), 0) + coalesce(octet_length(w.summary), 0)), 0)
		FROM job_workspaces w WHERE w.seq = j.seq),
	octet_length(m.manifest)
		+ (SELECT coalesce(sum(octet_length(f.files)), 0) FROM job_files f WHERE f.seq = j.seq)
		+ (SELECT coalesce(sum(octet_length(e.message)), 0) FROM job_events e WHERE e.job_id = j.id)
		+ (SELECT coalesce(sum(octet_length(q.message) + octet_length(q.form) + coalesce(octet_length(q.answer), 0)), 0)
			FROM job_questions q WHERE q.job_id = j.id)
		+ (SELECT coalesce(sum(coalesce(octet_length(o.runs), 0)), 0) FROM job_output o WHERE o.job_id = j.id)
		+ octet_length(j.progress) + octet_length(j.error) + octet_length(j.result)
FROM jobs j JOIN job_manifests m ON m.seq = j.seq
WHERE j.seq > $1 AND j.status NOT IN ` + active + `
	AND coalesce(j.finished_at, j.updated_at) < $2
	AND NOT (j.sandbox <> '' AND EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = j.sandbox AND s.state NOT IN ('released', 'gone')))
	AND NOT (j.sandbox = '' AND j.sandbox_id <> '' AND m.manifest::json->>'lifecycle' = 'persistent')
ORDER BY j.seq LIMIT $3`

type prunedJob struct {
	seq                      int64
	id                       string
	output, workspace, other int64
}

// Prune removes what ended before before (see delegate.RetentionStore),
// a batch of jobs per transaction.
func (db *DB) Prune(ctx context.Context, before time.Time, opts delegate.PruneOptions) (*delegate.Pruned, error) {
	p := &delegate.Pruned{}
	cutoff := toTS(before)
	digests := map[string]bool{} // of the artifacts of the jobs pruned
	var gone []string            // ids of the jobs pruned (or, dry, that would be)
	for after := int64(0); ; {
		var batch []prunedJob
		var err error
		if opts.DryRun {
			batch, err = prunableJobs(ctx, db.pool, after, cutoff, "")
			if err == nil {
				err = artifactDigests(ctx, db.pool, batch, digests)
			}
		} else {
			err = db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if batch, err = prunableJobs(ctx, tx, after, cutoff, ` FOR UPDATE OF j SKIP LOCKED`); err != nil {
					return err
				}
				if err := artifactDigests(ctx, tx, batch, digests); err != nil {
					return err
				}
				seqs := make([]int64, len(batch))
				for i, j := range batch {
					seqs[i] = j.seq
				}
				// What they keep goes with them (ON DELETE CASCADE).
				_, err := tx.Exec(ctx, `DELETE FROM jobs WHERE seq = ANY($1)`, seqs)
				return err
			})
		}
		if err != nil {
			return p, fmt.Errorf("prune jobs: %w", err)
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
	// After a real prune the jobs are gone already; a dry run's still
	// name their artifacts and sandboxes.
	stillThere := []string{}
	if opts.DryRun {
		stillThere = gone
	}
	if err := db.pruneSandboxes(ctx, before, opts.DryRun, stillThere, p); err != nil {
		return p, err
	}
	// The artifact contents none of the jobs left names.
	sums := make([]string, 0, len(digests))
	for s := range digests {
		sums = append(sums, s)
	}
	rows, err := db.pool.Query(ctx, `SELECT s FROM unnest($1::text[]) s
		WHERE NOT EXISTS (SELECT 1 FROM job_artifacts a WHERE a.sha256 = s AND NOT (a.job_id = ANY($2))) ORDER BY s`, sums, stillThere)
	if err != nil {
		return p, fmt.Errorf("prune artifacts: %w", err)
	}
	p.Artifacts, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return p, fmt.Errorf("prune artifacts: %w", err)
	}
	return p, nil
}

func prunableJobs(ctx context.Context, q querier, after int64, cutoff ts, lock string) ([]prunedJob, error) {
	rows, err := q.Query(ctx, prunable+lock, after, cutoff, pruneBatch)
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

func artifactDigests(ctx context.Context, q querier, batch []prunedJob, into map[string]bool) error {
	if len(batch) == 0 {
		return nil
	}
	ids := make([]string, len(batch))
	for i, j := range batch {
		ids[i] = j.id
	}
	rows, err := q.Query(ctx, `SELECT DISTINCT sha256 FROM job_artifacts WHERE job_id = ANY($1) AND sha256 <> ''`, ids)
	if err != nil {
		return err
	}
	sums, err := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, s := range sums {
		into[s] = true
	}
	return err
}

// pruneSandboxes removes the kept sandboxes that ended before before and
// that no job left names (but those of jobs), then the ended networks
// that no job or sandbox left names.
func (db *DB) pruneSandboxes(ctx context.Context, before time.Time, dry bool, jobs []string, p *delegate.Pruned) error {
	rows, err := db.pool.Query(ctx, `SELECT s.id, s.data FROM sandboxes s WHERE s.state IN ('released', 'gone')
		AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.sandbox = s.id AND j.sandbox <> '' AND NOT (j.id = ANY($1)))`, jobs)
	if err != nil {
		return fmt.Errorf("prune sandboxes: %w", err)
	}
	old := []string{}
	for rows.Next() {
		var (
			id, data string
			sb       sandboxRow
		)
		if err := rows.Scan(&id, &data); err != nil {
			rows.Close()
			return fmt.Errorf("prune sandboxes: %w", err)
		}
		if err := json.Unmarshal([]byte(data), &sb); err != nil {
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
	// A network is a job's (its id) or a kept sandbox's (the id of the job
	// that made it, else its own).
	const orphanNetworks = `FROM networks n WHERE n.ended
		AND (NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = n.id) OR n.id = ANY($1))
		AND (NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = n.id) OR n.id = ANY($2))`
	if dry {
		var n int64
		if err := db.pool.QueryRow(ctx, `SELECT count(*) `+orphanNetworks, jobs, old).Scan(&n); err != nil {
			return fmt.Errorf("prune networks: %w", err)
		}
		p.Networks = int(n)
		return nil
	}
	return db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM sandboxes WHERE id = ANY($1)`, old); err != nil {
			return fmt.Errorf("prune sandboxes: %w", err)
		}
		tag, err := tx.Exec(ctx, `DELETE `+orphanNetworks, []string{}, []string{})
		if err != nil {
			return fmt.Errorf("prune networks: %w", err)
		}
		p.Networks = int(tag.RowsAffected())
		return nil
	})
}
