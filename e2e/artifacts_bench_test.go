package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkArtifactsOut: `delegate jobs artifacts ID --out DIR` of the
// built binary saving 10,000 small artifacts from a local data dir
// (issue 35, item 5: the goal is at most 10 s; 5,699 were saved in 120 s
// before artifacts were read by name, several at once). It reports the
// seconds one save takes and the artifacts saved per second.
//
//	go test -run '^$' -bench ArtifactsOut -benchtime 3x ./e2e/
func BenchmarkArtifactsOut(b *testing.B) {
	const n = 10_000
	dataDir := b.TempDir()
	cli := func(args ...string) (string, string) {
		b.Helper()
		cmd := exec.Command(binary, args...)
		cmd.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			b.Fatalf("delegate %v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	cli("run", "-q", "--timeout", "600", "--artifact", "out/**", "--script",
		`mkdir -p out && cd out && i=0; while [ $i -lt 10000 ]; do echo "artifact $i" > a$i.txt; i=$((i+1)); done`)
	id := strings.Fields(strings.Split(func() string { out, _ := cli("jobs", "list", "--limit", "1"); return out }(), "\n")[1])[0]
	start := time.Now()
	for b.Loop() {
		dest := filepath.Join(b.TempDir(), "saved")
		if _, errOut := cli("jobs", "artifacts", id, "--out", dest); !strings.Contains(errOut, "saved 10000 of 10000 artifacts") {
			b.Fatalf("jobs artifacts --out: %s", errOut[max(0, len(errOut)-500):])
		}
	}
	per := time.Since(start).Seconds() / float64(b.N)
	b.ReportMetric(per, "s/save")
	b.ReportMetric(n/per, "artifacts/s")
}
