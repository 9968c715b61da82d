//go:build unix

package engine_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestArtifactModes: kept artifacts are the server's alone (directories
// 0700, files 0600) whatever the umask, and an artifact directory someone
// made readable to others is closed again when the next one is stored.
func TestArtifactModes(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		t.Run(os.FileMode(umask).String(), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dir := filepath.Join(t.TempDir(), "artifacts")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o755)
			f := newFixture(t, engine.Config{ArtifactDir: dir})
			m := script("build")
			m.Artifacts = []string{"*.txt"}
			job := f.submit(m)
			p := f.started()
			p.Sandbox.WriteFile(context.Background(), "/workspace/report.txt", []byte("private results"), 0o644)
			p.Finish(sandbox.Exit{})
			f.wait(f.eng, job.ID)
			files := 0
			err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				want := os.FileMode(0o600)
				if d.IsDir() {
					want = 0o700
				} else {
					files++
				}
				if info.Mode().Perm() != want {
					t.Errorf("%s: mode %v, want %v", path, info.Mode().Perm(), want)
				}
				return nil
			})
			if err != nil || files != 1 {
				t.Fatalf("walk: %v, %d files", err, files)
			}
		})
	}
}
