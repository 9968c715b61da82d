package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigrateKeepsJobs: a database made by the first schema version keeps
// its jobs when a newer delegate opens it, and a database from a newer
// delegate is refused rather than misread.
func TestMigrateKeepsJobs(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(migrations[0] + `; PRAGMA user_version = 1;
		INSERT INTO jobs (id, status, manifest, created_at, updated_at) VALUES ('old', 'success', '{"agentType":"script","task":"x"}', 1, 1);`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := s.GetJob(ctx, "old")
	if err != nil || j.Status != "success" || j.Manifest.Task != "x" {
		t.Fatalf("old job after migration: %+v %v", j, err)
	}
	if _, err := s.db.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer than this delegate") {
		t.Fatalf("newer schema: %v", err)
	}
}
