package e2e

import (
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/postgres/pgtest"
)

// TestStoreMigrateToPostgres: a data dir's jobs, copied by `delegate
// store migrate` into an empty PostgreSQL database, are listed and read
// from there with DELEGATE_STORE set; a job runs on that store; a second
// migrate into it is refused, saying why; a DELEGATE_STORE that is no
// PostgreSQL URL is refused without being shown (it may hold a password).
func TestStoreMigrateToPostgres(t *testing.T) {
	url := pgtest.Own(t, pgtest.Options{}).NewDatabase(t)
	dataDir := t.TempDir()
	pg := []string{"DELEGATE_STORE=" + url}

	if out, errOut, code := delegateCLI(t, dataDir, "run", "--script", "echo before; echo oops >&2; exit 3"); out != "before\n" || code != 3 {
		t.Fatalf("a job on SQLite: %q %d %s", out, code, errOut)
	}
	out, errOut, code := delegateCLI(t, dataDir, "store", "migrate", "--to", url)
	if code != 0 || !strings.Contains(out, "Copied "+dataDir+"/jobs.db into ") || !strings.Contains(out, "1 jobs (12 B of output") {
		t.Fatalf("store migrate: %d %q %s", code, out, errOut)
	}
	out, errOut, code = delegateCLIEnv(t, dataDir, pg, "jobs", "list")
	if code != 0 || !strings.Contains(out, "failed") || !strings.Contains(out, "echo before") {
		t.Fatalf("jobs list on PostgreSQL: %d %q %s", code, out, errOut)
	}
	id := strings.Fields(strings.Split(out, "\n")[1])[0]
	if out, errOut, code := delegateCLIEnv(t, dataDir, pg, "jobs", "logs", id); code != 0 || !strings.Contains(out, "before") {
		t.Errorf("logs of the copied job: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := delegateCLIEnv(t, dataDir, pg, "run", "--script", "echo on postgres"); out != "on postgres\n" || code != 0 {
		t.Fatalf("a job on PostgreSQL: %q %d %s", out, code, errOut)
	}
	if out, _, _ := delegateCLIEnv(t, dataDir, pg, "jobs", "list"); strings.Count(out, "job-") != 2 {
		t.Errorf("after a job on PostgreSQL: %q", out)
	}
	// Still there in SQLite, and not listed twice anywhere.
	if out, _, _ := delegateCLI(t, dataDir, "jobs", "list"); strings.Count(out, "job-") != 1 {
		t.Errorf("the SQLite store after the migrate: %q", out)
	}
	_, errOut, code = delegateCLI(t, dataDir, "store", "migrate", "--to", url)
	if code == 0 || !strings.Contains(errOut, "is not empty (it holds 2 jobs") || !strings.Contains(errOut, "nothing was copied") {
		t.Errorf("a second migrate: %d %s", code, errOut)
	}
	_, errOut, code = delegateCLIEnv(t, dataDir, []string{"DELEGATE_STORE=mysql://u:s3cret@h/db"}, "jobs", "list")
	if code != 2 || !strings.Contains(errOut, "DELEGATE_STORE: must be empty (SQLite in the data dir) or a PostgreSQL URL") || strings.Contains(errOut, "s3cret") {
		t.Errorf("a DELEGATE_STORE that is no PostgreSQL URL: %d %s", code, errOut)
	}
	_, errOut, code = delegateCLI(t, dataDir, "store", "migrate")
	if code != 2 || !strings.Contains(errOut, "--to: name the PostgreSQL database") {
		t.Errorf("migrate without --to: %d %s", code, errOut)
	}
}
