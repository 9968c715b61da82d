package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// Artifacts' contents are kept in the database (delegate.BlobStore), by
// sha256, once whatever the jobs that keep the same file: every server
// sharing the store reads what another collected, with no file system
// shared between them, and a record and its content live and are backed
// up together. A content is 16 MiB at most and a job's 64 MiB (the
// engine's caps, DELEGATE_ARTIFACT_MAX_FILE and _TOTAL); TOAST keeps it
// out of the table's pages, compressed where it compresses.

var _ delegate.BlobStore = (*DB)(nil)

// PutBlob keeps data under sum, once: a content kept already is only
// marked as used now (a prune spares it a while: no job may name it yet).
func (db *DB) PutBlob(ctx context.Context, sum string, data []byte) error {
	return db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// Not sent again when it is there: it may be megabytes.
		tag, err := tx.Exec(ctx, `UPDATE artifact_blobs SET used_at = now() WHERE sha256 = $1`, sum)
		if err != nil || tag.RowsAffected() > 0 {
			return wrapBlob(sum, err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO artifact_blobs (sha256, size, data) VALUES ($1, $2, $3)
			ON CONFLICT (sha256) DO UPDATE SET used_at = now()`, sum, len(data), data)
		return wrapBlob(sum, err)
	})
}

func wrapBlob(sum string, err error) error {
	if err != nil {
		return fmt.Errorf("keep artifact content %s: %w", sum, err)
	}
	return nil
}

// Blob returns the content kept under sum; ErrNotFound where there is
// none (an artifact collected into a server's directory before).
func (db *DB) Blob(ctx context.Context, sum string) ([]byte, error) {
	var data []byte
	err := db.pool.QueryRow(ctx, `SELECT data FROM artifact_blobs WHERE sha256 = $1`, sum).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("artifact content %s: %w", sum, delegate.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("artifact content %s: %w", sum, err)
	}
	return data, nil
}

// DropBlobs removes the contents of sums that no job names and that were
// last kept longer than grace ago (by the database's clock); dry, it
// counts them.
func (db *DB) DropBlobs(ctx context.Context, sums []string, grace time.Duration, dry bool) (n int, bytes int64, err error) {
	const orphans = ` FROM artifact_blobs b WHERE b.sha256 = ANY($1) AND b.used_at < now() - make_interval(secs => $2)
		AND NOT EXISTS (SELECT 1 FROM job_artifacts a WHERE a.sha256 = b.sha256)`
	if dry {
		err = db.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(b.size), 0)`+orphans, sums, grace.Seconds()).Scan(&n, &bytes)
	} else {
		err = db.pool.QueryRow(ctx, `WITH gone AS (DELETE`+orphans+` RETURNING b.size)
			SELECT count(*), coalesce(sum(size), 0) FROM gone`, sums, grace.Seconds()).Scan(&n, &bytes)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("prune artifact contents: %w", err)
	}
	return n, bytes, nil
}
