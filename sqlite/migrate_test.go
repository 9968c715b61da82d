package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestMigrateKeepsJobs: a database made by the first schema version keeps
// its jobs when a newer delegate opens it, and a database from a newer
// delegate is refused rather than misread.
func TestMigrateKeepsJobs(t *testing.T) {
	ctx := context.Background()
	s, path := openMigrated(t, 1, `
		INSERT INTO jobs (id, status, manifest, created_at, updated_at) VALUES ('old', 'success', '{"agentType":"script","task":"x"}', 1, 1);`)
	j, err := s.GetJob(ctx, "old")
	if err != nil || j.Status != "success" || j.Manifest.Task != "x" {
		t.Fatalf("old job after migration: %+v %v", j, err)
	}
	if _, err := s.wdb.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer than this delegate") {
		t.Fatalf("newer schema: %v", err)
	}
}

// TestMigrateMovesManifests: a database of schema 2 with a job whose
// manifest carries files gets its manifest moved out of the job row, the
// files apart, and the count of finished jobs.
func TestMigrateMovesManifests(t *testing.T) {
	ctx := context.Background()
	s, _ := openMigrated(t, 2, `
		INSERT INTO jobs (id, status, manifest, created_at, updated_at, progress) VALUES
			('files', 'running', '{"agentType":"script","task":"x","files":[{"path":"a.txt","content":"aGk="}],"env":{"K":"v"}}', 1, 1, 'step 1'),
			('plain', 'success', '{"agentType":"script","task":"y"}', 2, 2, 'success');
		INSERT INTO job_events (job_id, seq, time, message) VALUES ('files', 1, 1, 'step 1');`)
	j, err := s.GetJob(ctx, "files")
	if err != nil || j.Manifest.Task != "x" || j.Manifest.Env["K"] != "v" || len(j.Manifest.Files) != 0 || j.Progress != "step 1" {
		t.Fatalf("migrated job: %+v %v", j, err)
	}
	files, err := s.JobFiles(ctx, "files")
	if err != nil || len(files) != 1 || files[0].Path != "a.txt" || files[0].Content != "aGk=" {
		t.Fatalf("migrated files: %+v %v", files, err)
	}
	if files, err := s.JobFiles(ctx, "plain"); err != nil || len(files) != 0 {
		t.Fatalf("files of a job without: %+v %v", files, err)
	}
	if n, err := s.Finishes(ctx); err != nil || n != 1 {
		t.Fatalf("finishes after migration: %d %v", n, err)
	}
	var cols int
	if err := s.rdb.QueryRow(`SELECT count(*) FROM pragma_table_info('jobs') WHERE name = 'manifest'`).Scan(&cols); err != nil || cols != 0 {
		t.Fatalf("jobs still has a manifest column (%d) %v", cols, err)
	}
	if evs, err := s.Events(ctx, "files"); err != nil || len(evs) != 1 {
		t.Fatalf("events: %+v %v", evs, err)
	}
}

// TestMigrateIdempotencyDigest: a job stored with an idempotency key
// before digests were kept is still found by its key, with no digest
// (which the engine takes as matching any manifest, as before).
func TestMigrateIdempotencyDigest(t *testing.T) {
	ctx := context.Background()
	s, _ := openMigrated(t, 4, `
		INSERT INTO jobs (seq, id, status, created_at, updated_at, idempotency_key) VALUES (1, 'keyed', 'success', 1, 1, 'k');
		INSERT INTO job_manifests (seq, manifest) VALUES (1, '{"agentType":"script","task":"x"}');`)
	j, err := s.JobByIdempotencyKey(ctx, "k")
	if err != nil || j.ID != "keyed" || j.IdempotencyDigest != "" || j.Manifest.Task != "x" {
		t.Fatalf("a keyed job from schema 4: %+v %v", j, err)
	}
}

// TestSandboxCountsOfOldRows: a sandbox row from when its activity was
// counted in the row ("running" state, counts in its JSON) reads its
// activity from its jobs once the index for it is made.
func TestSandboxCountsOfOldRows(t *testing.T) {
	ctx := context.Background()
	s, _ := openMigrated(t, len(migrations)-1, fmt.Sprintf(`
		INSERT INTO sandboxes (id, state, backend, instance, data) VALUES ('sbx-old', 'running', 'local', 'sb-1',
			'{"id":"sbx-old","state":"running","backend":"local","instance":"sb-1","createdAt":"2026-11-01T10:00:00Z",
			"lastUsedAt":"2026-11-01T10:00:00Z","expiresAt":"2026-11-02T10:00:00Z","commands":5,"running":2}');
		INSERT INTO jobs (seq, id, status, created_at, updated_at, finished_at, sandbox) VALUES
			(1, 'c1', 'success', 1, 1, %d, 'sbx-old');`, time.Date(2026, 11, 1, 11, 0, 0, 0, time.UTC).UnixNano()))
	sb, err := s.GetSandbox(ctx, "sbx-old")
	if err != nil || sb.State != delegate.SandboxIdle || sb.Running != 0 || sb.Commands != 1 ||
		!sb.LastUsedAt.Equal(time.Date(2026, 11, 1, 11, 0, 0, 0, time.UTC)) {
		t.Fatalf("an old sandbox row: %+v %v", sb, err)
	}
}

// openMigrated opens a database made by the first version migrations
// (with data, SQL, put in it then) as this delegate does, migrating it
// to the current schema, and returns it with its path.
func openMigrated(t *testing.T, version int, data string) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobs.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(strings.Join(migrations[:version], ";") + fmt.Sprintf("; PRAGMA user_version = %d;", version) + data); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}
