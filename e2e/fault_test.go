//go:build fault

package e2e

// Fault tests (issue 35): the built binary paused, stopped while a job
// ends, on a full disk. They take tens of seconds each, and run in the
// second stage of ./scripts/test (go test -tags fault -run '^TestFault').

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("%d sandboxes left behind", len(left))
	}
	// Nor a process of theirs (a supervisor, a command, its egress
	// helpers): each names the data dir on its command line.
	for range 50 {
		if !namedIn(dataDir) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("processes left running: %q", processesNaming(t, dataDir))
}

// namedIn tells whether a process's command line names dir.
func namedIn(dir string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), dir) {
			return true
		}
	}
	return false
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

// mountTmpfs mounts a tmpfs of size bytes on a directory of the test's,
// unmounted when the test ends.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillUp writes a file in dir until its file system is full.
func fillUp(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for _, n := range []int{len(buf), 4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	return p
}

// TestFaultDiskFull is the reproduction: the data dir on a 64 MiB
// tmpfs, three jobs that sleep 6 s then write 1,346,674 bytes; 2 s in the
// tmpfs is filled, 10 s later the filler goes. Every job then ends (none
// stays running), each with its true output or an honest loss: success
// with all of its output stored, or output_lost_bytes and a reason for
// what the sandbox could not keep, or failed saying "no space left on";
// never success with less output stored than it wrote and nothing said
// (before: two of three so, and one running for ever).
func TestFaultDiskFull(t *testing.T) {
	dataDir := mountTmpfs(t, 64<<20)
	cs, cmd, stderr := stdioSession(t, dataDir, "", "DELEGATE_MIN_FREE=1M", "DELEGATE_OUTPUT_LIMIT=4M")
	const task = `sleep 6; head -c 1000000 /dev/urandom | base64 -w 100; echo END`
	const wrote = 1_346_674
	var ids []string
	for range 3 {
		ids = append(ids, call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": task}}).JobID)
	}
	for _, id := range ids {
		waitFor(t, cs, id, "running")
	}
	time.Sleep(2 * time.Second)
	filler := fillUp(t, dataDir)
	time.Sleep(10 * time.Second)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 45})
	}
	cs.Close()
	waitExited(t, cmd.Process.Pid)

	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "jobs.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, id := range ids {
		var (
			status, why, lostWhy string
			exit                 sql.NullInt64
			bytes, lost, stored  int64
		)
		err := db.QueryRow(`SELECT status, error, exit_code, output_bytes, output_lost_bytes, output_lost,
			(SELECT coalesce(sum(length(data)), 0) FROM job_output WHERE job_id = jobs.id) FROM jobs WHERE id = ?`, id).
			Scan(&status, &why, &exit, &bytes, &lost, &lostWhy, &stored)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("job %s: %s (%s), exit %v, output %d bytes, %d stored, %d lost (%s)", id, status, why, exit.Int64, bytes, stored, lost, lostWhy)
		switch {
		case status == "success" && exit.Valid && exit.Int64 == 0 && stored == wrote && lost == 0:
		case status == "success" && exit.Valid && exit.Int64 == 0 && lost > 0 && stored+lost == wrote && lostWhy != "":
		case status == "failed" && strings.Contains(why, "no space left on"):
		default:
			t.Errorf("job %s is not in its true state with its true output or an honest loss\n%s", id, stderr)
		}
	}
	checkDataDir(t, dataDir)
}

// TestFaultServerGoneWhileJobEnds: the server (a stdio one, as Claude
// Code quits) goes while a 3 s job runs; the job ends with no server;
// the next server, started 6 s later, adopts it with the end its
// supervisor recorded: success in about 3 s, not in the time until the
// adoption (a 3 s job showed "success in 505.2s").
func TestFaultServerGoneWhileJobEnds(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 3; echo done"}}).JobID
	waitFor(t, cs, job, "running")
	cs.Close() // the client quits: a stdio server ends with it
	waitExited(t, cmd.Process.Pid)
	time.Sleep(6 * time.Second)
	// With no server, the read-only list says it ended, as its
	// supervisor recorded.
	list := exec.Command(binary, "jobs", "list")
	list.Env = serverEnv(dataDir)
	if out, err := list.Output(); err != nil || !strings.Contains(string(out), "running (ended, not recorded yet)") {
		t.Errorf("jobs list with no server: %v\n%s", err, out)
	}

	cs2, _, _ := stdioSession(t, dataDir, "")
	st := call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": job, "timeout_seconds": 30})
	res := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": job})
	if st.Status != "success" || res.Output != "done\n" || res.DurationSeconds < 2.5 || res.DurationSeconds > 5 {
		t.Errorf("adopted: %s (%s), output %q, in %.1fs; want success, done, in about 3 s", st.Status, st.Error, res.Output, res.DurationSeconds)
	}
	cs2.Close()
	checkDataDir(t, dataDir)
}

// TestFaultSoak is a soak bounded in time (about 30 s of jobs): jobs
// submitted four at a time while the server is stopped for 5 s, then its
// data dir filled for 6 s. After it every job ends in its true state with
// its true output or an honest loss (a submission refused for lack of
// room is refused by name), the store passes integrity_check, and no
// sandbox is left.
func TestFaultSoak(t *testing.T) {
	dataDir := mountTmpfs(t, 128<<20)
	cs, cmd, stderr := stdioSession(t, dataDir, "", "DELEGATE_MIN_FREE=8M", "HEARTBEAT_THRESHOLD_SECONDS=3")
	ctx := testContext(t)
	const task = `echo start; head -c 30000 /dev/zero | tr '\0' x; echo; echo end`
	const wrote = 6 + 30000 + 1 + 4
	var (
		ids     []string
		refused int
	)
	submit := func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "submit_job", Arguments: map[string]any{"manifest": map[string]any{"agentType": "script", "task": task}}})
		if err != nil {
			t.Fatalf("submit_job: %v", err)
		}
		if res.IsError {
			if msg := text(res); !strings.Contains(msg, "no space left on") || !strings.Contains(msg, "DELEGATE_MIN_FREE") {
				t.Fatalf("submit_job refused, not for room: %s", msg)
			}
			refused++
			return
		}
		var out submitOut
		raw, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(raw, &out)
		ids = append(ids, out.JobID)
	}
	start := time.Now()
	var filler string
	paused, filled, freed := false, false, false
	for time.Since(start) < 30*time.Second {
		for range 4 {
			submit()
		}
		switch since := time.Since(start); {
		case since > 8*time.Second && !paused:
			paused = true
			cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(5 * time.Second) // the server stopped: what it must survive
			cmd.Process.Signal(syscall.SIGCONT)
		case since > 16*time.Second && !filled:
			filled = true
			filler = fillUp(t, dataDir)
		case since > 22*time.Second && !freed:
			freed = true
			os.Remove(filler)
		}
		time.Sleep(500 * time.Millisecond) // the pace of the soak: four jobs every half second
	}
	for _, id := range ids {
		call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 45})
	}
	cs.Close()
	waitExited(t, cmd.Process.Pid)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "jobs.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	counts := map[string]int{}
	for _, id := range ids {
		var (
			status, why         string
			exit                sql.NullInt64
			lost, stored, bytes int64
		)
		if err := db.QueryRow(`SELECT status, error, exit_code, output_bytes, output_lost_bytes,
			(SELECT coalesce(sum(length(data)), 0) FROM job_output WHERE job_id = jobs.id) FROM jobs WHERE id = ?`, id).
			Scan(&status, &why, &exit, &bytes, &lost, &stored); err != nil {
			t.Fatal(err)
		}
		switch {
		case status == "success" && exit.Valid && exit.Int64 == 0 && stored == wrote && lost == 0:
			counts["whole"]++
		case status == "success" && exit.Valid && exit.Int64 == 0 && lost > 0 && stored+lost == wrote:
			counts["honest loss"]++
		case status == "failed" && strings.Contains(why, "no space left on"):
			counts["failed for room"]++
		default:
			t.Errorf("job %s: %s (%s), exit %v, %d bytes written, %d stored, %d lost", id, status, why, exit.Int64, bytes, stored, lost)
		}
	}
	t.Logf("%d jobs: %v; %d submissions refused for room", len(ids), counts, refused)
	if t.Failed() {
		t.Logf("server log:\n%s", stderr)
	}
	checkDataDir(t, dataDir)
}
