package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// ArtifactStore records the artifacts collected from jobs (their content
// lives by hash outside the database). It implements
// delegate.ArtifactStore on a DB.
type ArtifactStore struct {
	db   *DB
	stmt struct {
		artifacts, one *readStmt  // readers
		wArtifact      *writeStmt // writer
	}
}

var _ delegate.ArtifactStore = (*ArtifactStore)(nil)

func newArtifactStore(ctx context.Context, db *DB) (*ArtifactStore, error) {
	s := &ArtifactStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.artifacts, `SELECT name, size, sha256, skipped FROM job_artifacts WHERE job_id = ?1` + jobIsMine + ` ORDER BY name`},
		{db.rdb, &s.stmt.one, `SELECT name, size, sha256, skipped FROM job_artifacts WHERE job_id = ?1 AND name = ?3` + jobIsMine},
		{db.wdb, &s.stmt.wArtifact, `INSERT OR REPLACE INTO job_artifacts (job_id, name, size, sha256, skipped) VALUES (?, ?, ?, ?, ?)`},
	})
}

// AddArtifact records (or replaces) a collected artifact.
func (s *ArtifactStore) AddArtifact(ctx context.Context, id string, a delegate.Artifact) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, id); err != nil {
			return err
		}
		_, err := s.stmt.wArtifact.in(tx).Exec(id, a.Name, a.Size, a.SHA256, a.Skipped)
		return err
	})
	if err != nil {
		return fmt.Errorf("add artifact to job %s: %w", id, err)
	}
	return nil
}

// Artifacts lists the job's artifacts by name.
func (s *ArtifactStore) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	rows, err := s.stmt.artifacts.QueryContext(ctx, id, delegate.ReaderOf(ctx))
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

// Artifact returns one of the job's artifacts by name.
func (s *ArtifactStore) Artifact(ctx context.Context, id, name string) (delegate.Artifact, error) {
	var a delegate.Artifact
	err := s.stmt.one.QueryRowContext(ctx, id, delegate.ReaderOf(ctx), name).Scan(&a.Name, &a.Size, &a.SHA256, &a.Skipped)
	if errors.Is(err, sql.ErrNoRows) {
		return a, delegate.ArtifactNotFound(id, name)
	}
	if err != nil {
		return a, fmt.Errorf("artifact %q of job %s: %w", name, id, err)
	}
	return a, nil
}
