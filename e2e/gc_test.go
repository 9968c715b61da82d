package e2e

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestGC (issue 35, item 4): `delegate gc` of the built binary over a
// data dir: a job that ended longer ago than DELEGATE_RETENTION is
// counted by --dry-run and left, then removed with what it kept; a job
// within the retention stays; the store passes integrity_check after.
func TestGC(t *testing.T) {
	dataDir := t.TempDir()
	for _, task := range []string{"echo old", "echo new"} {
		if _, errOut, code := delegateCLI(t, dataDir, "run", "-q", "--script", task); code != 0 {
			t.Fatalf("run %q: exit %d\n%s", task, code, errOut)
		}
	}
	var oldID string
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The first job ended 40 days ago (its times moved back, as a clock
	// would have them).
	ago := time.Now().Add(-40 * 24 * time.Hour).UnixNano()
	if err := db.QueryRow(`SELECT id FROM jobs ORDER BY seq LIMIT 1`).Scan(&oldID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE jobs SET finished_at = ?, updated_at = ? WHERE id = ?`, ago, ago, oldID); err != nil {
		t.Fatal(err)
	}
	old, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--json")
	env := []string{"DELEGATE_RETENTION=30d"}
	out, errOut, code := delegateCLIEnv(t, dataDir, env, "gc", "--dry-run")
	if code != 0 || !strings.Contains(out, "Would remove what ended before") || !strings.Contains(out, "  1 jobs:") {
		t.Fatalf("gc --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if list, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--json"); list != old {
		t.Errorf("gc --dry-run removed something:\n%s\nwas\n%s", list, old)
	}
	out, errOut, code = delegateCLIEnv(t, dataDir, env, "gc")
	if code != 0 || !strings.Contains(out, "Removed what ended before") || !strings.Contains(out, "  1 jobs:") {
		t.Fatalf("gc: exit %d\n%s%s", code, out, errOut)
	}
	list, _, _ := delegateCLI(t, dataDir, "jobs", "list", "--json")
	if strings.Contains(list, oldID) || strings.Count(list, `"job_id"`) != 1 {
		t.Errorf("after gc, jobs list:\n%s", list)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM job_output WHERE job_id = ?`, oldID).Scan(&n); err != nil || n != 0 {
		t.Errorf("the removed job's output: %d rows, %v", n, err)
	}
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("integrity_check: %q, %v", ok, err)
	}
}
