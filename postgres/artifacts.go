package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delegate-dev/delegate"
)

// ArtifactStore records the artifacts collected from jobs (their content
// lives by hash outside the database). It implements
// delegate.ArtifactStore on a DB.
type ArtifactStore struct{ db *DB }

var _ delegate.ArtifactStore = (*ArtifactStore)(nil)

// AddArtifact records (or replaces) a collected artifact.
func (s *ArtifactStore) AddArtifact(ctx context.Context, id string, a delegate.Artifact) error {
	var owner *string
	f, fenced := delegate.FenceOf(ctx)
	if fenced {
		owner = &f.Owner
	}
	// Under a fence, only while the fence is the job's (its row is
	// locked from the check to the commit).
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO job_artifacts (job_id, name, size, sha256, skipped)
			SELECT $1, $2, $3, $4, $5 WHERE $6::text IS NULL
				OR EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND owner = $6 AND epoch = $7 FOR KEY SHARE)
			ON CONFLICT (job_id, name) DO UPDATE SET size = excluded.size, sha256 = excluded.sha256, skipped = excluded.skipped`,
			id, clean(a.Name), a.Size, a.SHA256, clean(a.Skipped), owner, f.Epoch)
		if err == nil && tag.RowsAffected() == 0 {
			return s.db.refusal(ctx, tx, id, f)
		}
		return err
	})
	if isForeignKey(err) {
		err = delegate.JobNotFound(id)
	}
	if err != nil {
		return fmt.Errorf("add artifact to job %s: %w", id, err)
	}
	return nil
}

// Artifacts lists the job's artifacts by name.
func (s *ArtifactStore) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	// COLLATE "C": by bytes, as SQLite orders them, whatever the
	// database's collation.
	rows, err := s.db.pool.Query(ctx, `SELECT name, size, sha256, skipped FROM job_artifacts WHERE job_id = $1`+jobIsMine+` ORDER BY name COLLATE "C"`,
		id, delegate.ReaderOf(ctx))
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

// Artifact returns one of the job's artifacts by name (a name that is not
// UTF-8 as AddArtifact stored it).
func (s *ArtifactStore) Artifact(ctx context.Context, id, name string) (delegate.Artifact, error) {
	var a delegate.Artifact
	err := s.db.pool.QueryRow(ctx, `SELECT name, size, sha256, skipped FROM job_artifacts WHERE job_id = $1 AND name = $3`+jobIsMine,
		id, delegate.ReaderOf(ctx), clean(name)).
		Scan(&a.Name, &a.Size, &a.SHA256, &a.Skipped)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, delegate.ArtifactNotFound(id, name)
	}
	if err != nil {
		return a, fmt.Errorf("artifact %q of job %s: %w", name, id, err)
	}
	return a, nil
}
