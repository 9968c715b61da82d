//go:build fault

package e2e

// Fault tests (issue 35): the built binary paused, stopped while a job
// ends, on a full disk. They take tens of seconds each, and run in the
// second stage of ./scripts/test (go test -tags fault -run '^TestFault').

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// checkDataDir: the store passes PRAGMA integrity_check, and no sandbox
// is left (nothing left running).
func checkDataDir(t *testing.T, dataDir string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "jobs.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ok string
	if err := db.QueryRowContext(context.Background(), `PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("integrity_check: %q, %v", ok, err)
	}
	var left []os.DirEntry
	for range 100 {
		left, _ = os.ReadDir(filepath.Join(dataDir, "sandboxes"))
		if len(left) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%d sandboxes left behind", len(left))
}

// TestFaultPauseServer: the server is stopped (SIGSTOP) for three times
// its heartbeat threshold, then continued. A job that wrote a status line
// every second meanwhile goes on and succeeds, and a job that exited 0
// during the pause is recorded success with exit code 0: the time the
// server did not run is not counted against them (they were killed, 137,
// and failed "lost heartbeat" with exit code 0, before).
func TestFaultPauseServer(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, stderr := stdioSession(t, dataDir, "", "HEARTBEAT_THRESHOLD_SECONDS=2", "GOMAXPROCS=2")
	submit := func(task string) string {
		return call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": task}}).JobID
	}
	var want strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&want, "out %d\n", i)
	}
	jobs := map[string]string{} // id: its output
	for range 2 {
		jobs[submit(`for i in 1 2 3 4 5 6 7 8 9 10; do echo "step $i" > "$DELEGATE_STATUS_FILE"; echo "out $i"; sleep 1; done`)] = want.String()
		jobs[submit(`sleep 2; echo done`)] = "done\n"
	}
	for id := range jobs {
		waitFor(t, cs, id, "running")
	}

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	for id, output := range jobs {
		st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 40})
		res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": id})
		if st.Status != "success" || res.ExitCode == nil || *res.ExitCode != 0 || res.Output != output {
			t.Errorf("job %s after the pause: %s (%s), exit %v, output %q; want success, 0, %q\n%s", id, st.Status, st.Error,
				res.ExitCode, res.Output, output, stderr)
		}
	}
	cs.Close()
	waitExited(t, cmd.Process.Pid)
	checkDataDir(t, dataDir)
}
