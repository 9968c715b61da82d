package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSandboxesDir: the sandboxes' records go to a directory of the run
// root, linked from DATA_DIR/sandboxes, made again after a reboot; a
// sandboxes directory holding sandboxes keeps them; a run root that
// cannot be written leaves them on the data dir.
func TestSandboxesDir(t *testing.T) {
	for _, tt := range []struct {
		name    string
		prepare func(t *testing.T, dataDir, run string)
		inRun   bool
	}{
		{"fresh", func(*testing.T, string, string) {}, true},
		{"an empty directory before", func(t *testing.T, dataDir, _ string) { mkdir(t, filepath.Join(dataDir, "sandboxes")) }, true},
		{"sandboxes made before", func(t *testing.T, dataDir, _ string) {
			mkdir(t, filepath.Join(dataDir, "sandboxes", "sb-0123456789ab"))
		}, false},
		{"after a reboot", func(t *testing.T, dataDir, run string) {
			sandboxesDir(dataDir, run)
			if err := os.RemoveAll(run); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"run root not writable", func(t *testing.T, _, run string) {
			if err := os.WriteFile(run, nil, 0o600); err != nil { // a file where its directory would be
				t.Fatal(err)
			}
		}, false},
		{"a link of someone else's", func(t *testing.T, dataDir, _ string) {
			other := t.TempDir()
			if err := os.Symlink(other, filepath.Join(dataDir, "sandboxes")); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dataDir, run := t.TempDir(), filepath.Join(t.TempDir(), "delegate")
			tt.prepare(t, dataDir, run)
			dir := sandboxesDir(dataDir, run)
			link := filepath.Join(dataDir, "sandboxes")
			if !tt.inRun {
				if dir != link {
					t.Fatalf("dir %s; want the data dir's %s", dir, link)
				}
				if err := os.MkdirAll(dir, 0o700); err != nil { // as local.New does
					t.Fatal(err)
				}
				return
			}
			if filepath.Dir(dir) != run {
				t.Fatalf("dir %s; want one in %s", dir, run)
			}
			fi, err := os.Stat(dir)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Fatalf("%s: %v, %v; want a directory 0700", dir, fi, err)
			}
			if target, err := os.Readlink(link); err != nil || target != dir {
				t.Errorf("%s links to %q (%v); want %s", link, target, err, dir)
			}
			if again := sandboxesDir(dataDir, run); again != dir {
				t.Errorf("a second call: %s; want %s", again, dir)
			}
			if other := sandboxesDir(t.TempDir(), run); other == dir {
				t.Errorf("another data dir has the same records' directory %s", dir)
			}
		})
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}
