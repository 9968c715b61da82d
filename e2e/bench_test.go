package e2e

import (
	"os/exec"
	"strings"
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
	cmd.Env = append(serverEnv(t.TempDir()), "DELEGATE_BENCH_SMALL=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{"submit_job p50", "get_job_status p50", "list_jobs p50", "server RSS",
		"callbacks accepted", "answer p50 to a job over its rate (429)", "A/B", "[B] " + binary} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "callbacks refused") && !strings.Contains(line, " 0  (0–0)") {
			t.Errorf("callbacks under the limits were refused: %s", line)
		}
	}
}
