package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestartRecovery kills the server with SIGKILL while jobs run. A new
// server on the same data dir re-attaches to the job whose sandbox is still
// alive (and gets its whole output and exit code), and fails, with a
// reason, the job whose sandbox died too — leaving no sandbox behind.
func TestRestartRecovery(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	survivor := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo before; sleep 3; echo after; exit 4"}})
	victim := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "sleep 300"}})
	finished := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo kept"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": finished.JobID})
	waitFor(t, cs, survivor.JobID, "running")
	waitFor(t, cs, victim.JobID, "running")

	// The server dies without a chance to clean up.
	cmd.Process.Kill()
	cmd.Wait()
	// The victim's sandbox dies with it: kill its supervisor and its pid 1.
	victimSandbox := sandboxOf(t, dataDir, victim.JobID)
	for _, f := range []string{"shim.pid", "init.pid"} {
		syscall.Kill(readPIDFile(t, filepath.Join(victimSandbox, f)), syscall.SIGKILL)
	}

	cs2, _, _ := stdioSession(t, dataDir, "")
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
	// No sandbox is left behind.
	for range 100 {
		entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
		if len(entries) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	t.Fatalf("%d sandboxes left behind", len(entries))
}

// sandboxOf finds the sandbox directory of a job from the local backend's
// state files.
func sandboxOf(t *testing.T, dataDir, jobID string) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "sb-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "state.json"))
		if err == nil && strings.Contains(string(b), jobID) {
			return d
		}
	}
	t.Fatalf("no sandbox for job %s in %v", jobID, dirs)
	return ""
}

// TestTimeoutWithoutServer: a stdio server ends with its client (as Claude
// Code's do); a job it leaves behind still dies at its timeout (plus a
// small grace), and the next server reports it as timed out.
func TestTimeoutWithoutServer(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "sleep 1000", "timeout": 1}})
	waitFor(t, cs, job.JobID, "running")
	dir := sandboxOf(t, dataDir, job.JobID)
	cmd.Process.Kill()
	cmd.Wait()

	initPID := readPIDFile(t, filepath.Join(dir, "init.pid"))
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(initPID, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the job outlived its timeout with no server watching")
		}
		time.Sleep(200 * time.Millisecond)
	}
	cs2, _, _ := stdioSession(t, dataDir, "")
	st := call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 30})
	if st.Status != "timeout" {
		t.Fatalf("after restart: %+v", st)
	}
}

// readPIDFile reads a pid file the sandbox supervisor writes just after
// the job starts (so it may need a moment to appear).
func readPIDFile(t *testing.T, path string) int {
	t.Helper()
	var (
		b   []byte
		err error
	)
	for range 100 {
		if b, err = os.ReadFile(path); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
