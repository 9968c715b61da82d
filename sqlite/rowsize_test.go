package sqlite

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestUpdateCostIgnoresFiles: a job with a 10 MB file is updated with the
// same bytes written as a job without one (measured as what the WAL grows
// by), and the job row holds none of the manifest. Before the files left
// the row, each update of such a job wrote the 10 MB again.
func TestUpdateCostIgnoresFiles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big := base64.StdEncoding.EncodeToString(make([]byte, 10<<20))
	for _, id := range []string{"small", "big"} {
		j := &delegate.Job{ID: id, Status: delegate.StatusPending, CreatedAt: time.Now(),
			Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}}
		if id == "big" {
			j.Manifest.Files = []delegate.File{{Path: "big.bin", Content: big}}
		}
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	var rowBytes int64
	if err := s.rdb.QueryRowContext(ctx, `SELECT sum(length(CAST(jobs AS BLOB))) FROM (SELECT `+
		`id || status || progress || error || backend || sandbox_id || exec_id || owner || result || token_hash AS jobs FROM jobs WHERE id = 'big')`).Scan(&rowBytes); err != nil {
		t.Fatal(err)
	}
	if rowBytes > 1024 {
		t.Fatalf("the job row holds %d bytes of text", rowBytes)
	}
	walGrowth := func(id string) int64 {
		if _, err := s.wdb.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error { j.Progress = fmt.Sprint("step ", i); return nil }); err != nil {
				t.Fatal(err)
			}
			if err := s.SaveProgress(ctx, []delegate.JobProgress{{ID: id, Progress: fmt.Sprint("line ", i), Heartbeat: time.Now()}}); err != nil {
				t.Fatal(err)
			}
		}
		st, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	small, bigWAL := walGrowth("small"), walGrowth("big")
	t.Logf("100 updates wrote %d bytes (no files) and %d bytes (a 10 MB file)", small, bigWAL)
	if small != bigWAL {
		t.Fatalf("updates of the job with a 10 MB file wrote %d bytes, without %d", bigWAL, small)
	}
	if small > 100*2*4096+32 {
		t.Fatalf("100 updates wrote %d bytes: more than two pages each", small)
	}
}

// TestManifestCacheBounded: the cache of parsed manifests holds a bounded
// number of bytes whatever the manifests, and skips the largest.
func TestManifestCacheBounded(t *testing.T) {
	var c manifestCache
	c.put("huge", "local", delegate.Manifest{Task: "x"}, manifestCacheMax+1)
	if _, ok := c.get("huge", ""); ok {
		t.Fatal("a manifest over the per-entry cap was cached")
	}
	for i := range 1000 {
		c.put(fmt.Sprint("job-", i), "local", delegate.Manifest{Task: fmt.Sprint(i)}, manifestCacheMax)
		if c.bytes > manifestCacheBytes {
			t.Fatalf("after %d manifests the cache holds %d bytes", i+1, c.bytes)
		}
	}
	m, ok := c.get("job-999", "")
	if !ok || m.Task != "999" {
		t.Fatalf("the latest manifest: %+v %v", m, ok)
	}
	c.put("job-999", "local", delegate.Manifest{Task: "again"}, 10) // replaced, not counted twice
	if want := (len(c.m)-1)*manifestCacheMax + 10; c.bytes != want {
		t.Fatalf("cache bytes %d, want %d", c.bytes, want)
	}
}
