package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestRestartRecoveryOnPostgres is TestRestartRecovery with the jobs in
// PostgreSQL: the server is killed (SIGKILL) while jobs run; the next one
// on the same store re-attaches to the job whose sandbox lives (its whole
// output and exit code) and fails, with a reason, the one whose sandbox
// died too; what finished before is read as it was.
func TestRestartRecoveryOnPostgres(t *testing.T) {
	url := pgtest.Own(t, pgtest.Options{}).NewDatabase(t)
	dataDir := t.TempDir()
	env := "DELEGATE_STORE=" + url
	cs, cmd, stderr := stdioSession(t, dataDir, "", env)
	survivor := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo before; sleep 3; echo after; exit 4"}})
	victim := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "sleep 300"}})
	finished := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo kept"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": finished.JobID})
	waitFor(t, cs, survivor.JobID, "running")
	waitFor(t, cs, victim.JobID, "running")
	if !strings.Contains(stderr.String(), `store="postgres://postgres@/`) {
		t.Errorf("the server does not say which store it uses:\n%s", stderr)
	}

	killServer(t, cmd)
	victimSandbox := sandboxOf(t, dataDir, victim.JobID)
	for _, f := range []string{"shim.pid", "init.pid"} {
		syscall.Kill(readPIDFile(t, filepath.Join(victimSandbox, f)), syscall.SIGKILL)
	}

	cs2, _, _ := stdioSession(t, dataDir, "", env)
	st := call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": survivor.JobID, "timeout_seconds": 30})
	res := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": survivor.JobID})
	if st.Status != "failed" || res.ExitCode == nil || *res.ExitCode != 4 || res.Output != "before\nafter\n" {
		t.Fatalf("re-attached job: %+v, output %q", res, res.Output)
	}
	st = call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": victim.JobID, "timeout_seconds": 30})
	if st.Status != "failed" || !strings.Contains(st.Error, "lost") {
		t.Fatalf("lost job: %+v", st)
	}
	if res := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": finished.JobID}); res.Output != "kept\n" {
		t.Fatalf("job finished before the crash: %+v", res)
	}
	if page := call[listOut](t, cs2, "list_jobs", map[string]any{}); len(page.Jobs) != 3 {
		t.Fatalf("after restart the server lists %d jobs", len(page.Jobs))
	}
	// The data dir holds no jobs.db: the jobs are in PostgreSQL.
	if _, err := os.Stat(filepath.Join(dataDir, "jobs.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a jobs.db in the data dir: %v", err)
	}
}
