//go:build unix

package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

// TestFileModes: the database and its WAL and shared-memory files hold
// every job's manifest, output and token hashes: they are the server's
// alone (0600) whatever the umask, also when an older delegate (or
// SQLite's own 0644) made them readable to others.
func TestFileModes(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		t.Run(os.FileMode(umask).String(), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dir := t.TempDir()
			path := filepath.Join(dir, "jobs.db")
			check := func(when string) {
				t.Helper()
				for _, f := range []string{path, path + "-wal", path + "-shm"} {
					st, err := os.Stat(f)
					if err != nil {
						t.Fatalf("%s: %v", when, err)
					}
					if st.Mode().Perm() != 0o600 {
						t.Errorf("%s: %s has mode %v, want 0600", when, filepath.Base(f), st.Mode().Perm())
					}
				}
			}
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC()
			if err := s.CreateJob(context.Background(), &delegate.Job{ID: "job-a", Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now,
				Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "secret work"}}); err != nil {
				t.Fatal(err)
			}
			check("new database")
			s.Close()
			// Made readable by someone else meanwhile: opening tightens it.
			for _, f := range []string{path, path + "-wal", path + "-shm"} {
				os.Chmod(f, 0o644)
			}
			s, err = sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.GetJob(context.Background(), "job-a"); err != nil {
				t.Fatal(err)
			}
			check("reopened database")
		})
	}
}
