package sqlite_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/delegate-dev/delegate/sqlite"
	"github.com/delegate-dev/delegate/workspace"
)

// BenchmarkBaselineSize stores the baseline of an import of 787,000 tiny
// files (0.8 MB of content: a byte or two each, in 100 directories of
// 100 packages) and reports the size of jobs.db it leaves, against the
// same baseline stored as it comes (plain JSON), in the same run (issue
// 35: 242 MB before, goal ≤ 40 MB):
//
//	go test -run X -bench BaselineSize -benchtime 1x ./sqlite/
func BenchmarkBaselineSize(b *testing.B) {
	const files = 787_000
	base := workspace.Baseline{Version: workspace.BaselineVersion, Kind: workspace.KindDir}
	var content int64
	mtime := int64(1_765_000_000_000_000_000)
	for i := range files {
		data := []byte{byte(i)}
		if i%4 == 0 {
			data = append(data, '\n')
		}
		content += int64(len(data))
		h := sha256.Sum256(data)
		base.Files = append(base.Files, workspace.FileState{Path: fmt.Sprintf("node_modules/pkg%02d/sub%03d/file%06d.js", i/7870, i/787%1000, i),
			Type: workspace.TypeFile, Mode: 0o644, Size: int64(len(data)), MTime: mtime + int64(i)*7919, SHA256: hex.EncodeToString(h[:])})
	}
	js, err := json.Marshal(base)
	if err != nil {
		b.Fatal(err)
	}
	size := func(dir string) float64 {
		var n int64
		for _, f := range []string{"jobs.db", "jobs.db-wal"} {
			if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
				n += st.Size()
			}
		}
		return float64(n) / 1e6
	}
	for range b.N {
		ctx := context.Background()
		dir := b.TempDir()
		db, err := sqlite.Open(ctx, filepath.Join(dir, "jobs.db"))
		if err != nil {
			b.Fatal(err)
		}
		if err := db.CreateJob(ctx, newJob("j1")); err != nil {
			b.Fatal(err)
		}
		if err := db.SaveBaseline(ctx, "j1", "/src", js); err != nil {
			b.Fatal(err)
		}
		db.Close()
		b.ReportMetric(size(dir), "MB-jobs.db")
		b.ReportMetric(float64(len(js))/1e6, "MB-plain-json")
		b.ReportMetric(float64(content)/1e6, "MB-content")
	}
}
