package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestBenchControlPlane runs `delegate bench --control-plane` small, the
// built binary against itself, and checks that every figure is there,
// both columns and their ratio, that no callback sent under the per-job
// limits was refused, and that a job over its rate was answered (the bench
// fails when none is refused).
func TestBenchControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers and 4 sandboxes")
	}
	cmd := exec.Command(binary, "bench", "--control-plane", "--against", binary, "-n", "1")
	tmp := t.TempDir() // the bench's data dirs go here
	cmd.Env = append(serverEnv(t.TempDir()), "DELEGATE_BENCH_SMALL=1", "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Its jobs ended before its servers did: no sandbox is left running.
	if left := processesNaming(t, tmp); len(left) > 0 {
		t.Errorf("processes of the bench's sandboxes left running: %v", left)
	}
	text := string(out)
	for _, want := range []string{"submit_job p50", "get_job_status p50", "list_jobs p50", "server RSS",
		"callbacks accepted", "answer p50 to a job over its rate (429", "A/B", "[B] " + binary} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "callbacks refused") && !strings.Contains(line, " 0  (0–0)") {
			t.Errorf("callbacks under the limits were refused: %s", line)
		}
		if strings.HasPrefix(line, "answer p50 to a job over its rate") && strings.Contains(line, " 0 ms") {
			t.Errorf("a job over its rate was never refused: %s", line)
		}
	}
}

// processesNaming lists the processes whose command line names dir, and
// kills them (a test that finds them has failed already).
func processesNaming(t *testing.T, dir string) []string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var found []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), dir) {
			continue
		}
		found = append(found, strings.ReplaceAll(string(b), "\x00", " "))
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return found
}
