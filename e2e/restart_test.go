package e2e

import (
	"fmt"
	"net/http"
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
	killServer(t, cmd)
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
	killServer(t, cmd)

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
// the job starts (so it may need a moment to appear, and is empty for a
// moment: the helpers create it, then write it).
func readPIDFile(t *testing.T, path string) int {
	t.Helper()
	var (
		pid int
		err error
	)
	for range 100 {
		var b []byte
		if b, err = os.ReadFile(path); err == nil {
			if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %v", path, err)
	return 0
}

// TestKillAfterCompletion: the server is killed (SIGKILL) right after it
// answered a batch of progress reports and a completion callback. The
// completion was stored before it was answered (with the reports before
// it), so the next server has the job finished with the job's own result
// and its timeline, and removes its sandbox.
func TestKillAfterCompletion(t *testing.T) {
	dataDir := t.TempDir()
	port := freePort(t)
	cs, cmd, _ := stdioSession(t, dataDir, "", fmt.Sprintf("CALLBACK_PORT=%d", port))
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "statusMode": "streaming",
		// A test-only job that shows its credentials, so the test can act as it.
		"task": `echo "$DELEGATE_CALLBACK_URL $DELEGATE_JOB_TOKEN"; sleep 300`}})
	waitFor(t, cs, sub.JobID, "running")
	var url, token string
	for range 100 {
		out := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": sub.JobID}).Output
		if f := strings.Fields(out); len(f) == 2 {
			url, token = f[0], f[1]
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if token == "" {
		t.Fatal("the job did not show its callback credentials")
	}
	post := func(kind, body string) {
		req, _ := http.NewRequest("POST", url+"/"+kind, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", kind, resp.StatusCode)
		}
	}
	for i := range 50 {
		post("status", fmt.Sprintf(`{"progress":"step %d"}`, i))
	}
	post("complete", `{"status":"success","result":"all 50 steps"}`)
	killServer(t, cmd) // at once: no chance to store anything more

	cs2, _, _ := stdioSession(t, dataDir, "")
	st := call[struct {
		Status   string `json:"status"`
		Timeline []struct {
			Message string `json:"message"`
		} `json:"timeline"`
	}](t, cs2, "get_job_status", map[string]any{"job_id": sub.JobID})
	res := call[struct {
		Status string `json:"status"`
		Result string `json:"result"`
	}](t, cs2, "get_job_result", map[string]any{"job_id": sub.JobID})
	if st.Status != "success" || res.Result != "all 50 steps" {
		t.Fatalf("after the kill: status %q, result %q", st.Status, res.Result)
	}
	var steps []string
	for _, ev := range st.Timeline {
		if strings.HasPrefix(ev.Message, "step ") {
			steps = append(steps, ev.Message)
		}
	}
	if len(steps) != 50 || steps[49] != "step 49" {
		t.Fatalf("timeline after the kill: %d steps %v", len(steps), steps)
	}
	// The finished job's sandbox (its process still sleeping) is removed
	// by the new server.
	for range 100 {
		entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
		if len(entries) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the finished job's sandbox was left behind")
}
