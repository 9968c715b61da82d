package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSandboxesDir: the sandboxes' records go to a directory of the
// first place that is a real tmpfs and this uid's alone, linked from
// DATA_DIR/sandboxes, made again after a reboot; a sandboxes directory
// holding sandboxes keeps them; a link of ours to a place not chosen any
// more is moved while empty; where no place fits (on disk, not
// writable, another's, writable by others, a link) they stay on the
// data dir.
func TestSandboxesDir(t *testing.T) {
	for _, tt := range []struct {
		name string
		// prepare returns the places, given tmp (on a tmpfs, not made)
		// and disk (on no tmpfs, made).
		prepare func(t *testing.T, dataDir, tmp, disk string) []string
		want    string // "tmp", "disk" or "data"
	}{
		{"fresh", func(_ *testing.T, _, tmp, _ string) []string { return []string{tmp} }, "tmp"},
		{"an empty directory before", func(t *testing.T, dataDir, tmp, _ string) []string {
			mkdir(t, filepath.Join(dataDir, "sandboxes"))
			return []string{tmp}
		}, "tmp"},
		{"sandboxes made before", func(t *testing.T, dataDir, tmp, _ string) []string {
			mkdir(t, filepath.Join(dataDir, "sandboxes", "sb-0123456789ab"))
			return []string{tmp}
		}, "data"},
		{"after a reboot", func(t *testing.T, dataDir, tmp, _ string) []string {
			sandboxesDir(slog.New(slog.DiscardHandler), dataDir, []string{tmp})
			if err := os.RemoveAll(tmp); err != nil {
				t.Fatal(err)
			}
			return []string{tmp}
		}, "tmp"},
		{"a place on disk, then a tmpfs", func(_ *testing.T, _, tmp, disk string) []string { return []string{disk, tmp} }, "tmp"},
		{"a place on disk only", func(_ *testing.T, _, _, disk string) []string { return []string{disk} }, "data"},
		{"our empty records on disk before", func(t *testing.T, dataDir, tmp, disk string) []string {
			sandboxesDir(slog.New(slog.DiscardHandler), dataDir, []string{filepath.Join(disk, "x")})
			return []string{filepath.Join(disk, "x"), tmp}
		}, "tmp"},
		{"our records on disk before, holding a sandbox", func(t *testing.T, dataDir, tmp, disk string) []string {
			places := []string{filepath.Join(disk, "x"), tmp}
			mkdir(t, filepath.Join(disk, "x"))
			if err := os.Symlink(filepath.Join(disk, "x", recordsName(dataDir)), filepath.Join(dataDir, "sandboxes")); err != nil {
				t.Fatal(err)
			}
			mkdir(t, filepath.Join(disk, "x", recordsName(dataDir), "sb-0123456789ab"))
			return places
		}, "disk"},
		{"a place not writable", func(t *testing.T, _, tmp, _ string) []string {
			if err := os.WriteFile(tmp, nil, 0o600); err != nil { // a file where its directory would be
				t.Fatal(err)
			}
			return []string{tmp}
		}, "data"},
		{"a place writable by others", func(t *testing.T, _, tmp, _ string) []string {
			mkdir(t, tmp)
			if err := os.Chmod(tmp, 0o1777); err != nil {
				t.Fatal(err)
			}
			return []string{tmp}
		}, "data"},
		{"a place of another uid", func(t *testing.T, _, tmp, _ string) []string {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory away")
			}
			mkdir(t, tmp)
			if err := os.Chown(tmp, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return []string{tmp}
		}, "data"},
		{"a place made a link by another", func(t *testing.T, _, tmp, _ string) []string {
			elsewhere := filepath.Join(filepath.Dir(tmp), "elsewhere")
			mkdir(t, elsewhere)
			if err := os.Symlink(elsewhere, tmp); err != nil {
				t.Fatal(err)
			}
			return []string{tmp}
		}, "data"},
		{"a link of someone else's", func(t *testing.T, dataDir, tmp, _ string) []string {
			if err := os.Symlink(t.TempDir(), filepath.Join(dataDir, "sandboxes")); err != nil {
				t.Fatal(err)
			}
			return []string{tmp}
		}, "data"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dataDir, tmp, disk := t.TempDir(), filepath.Join(tmpfsDir(t), "delegate"), diskDir(t)
			places := tt.prepare(t, dataDir, tmp, disk)
			log := slog.New(slog.DiscardHandler)
			dir := sandboxesDir(log, dataDir, places)
			link := filepath.Join(dataDir, "sandboxes")
			switch tt.want {
			case "data":
				if dir != link {
					t.Fatalf("dir %s; want the data dir's %s", dir, link)
				}
				if err := os.MkdirAll(dir, 0o700); err != nil { // as local.New does
					t.Fatal(err)
				}
				return
			case "disk":
				if want := filepath.Join(disk, "x", recordsName(dataDir)); dir != want {
					t.Fatalf("dir %s; want the records made before, %s", dir, want)
				}
				return
			}
			if filepath.Dir(dir) != tmp || !onTmpfs(dir) {
				t.Fatalf("dir %s (on a tmpfs: %v); want one in %s, a tmpfs", dir, onTmpfs(dir), tmp)
			}
			fi, err := os.Lstat(dir)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Fatalf("%s: %v, %v; want a directory 0700", dir, fi, err)
			}
			if target, err := os.Readlink(link); err != nil || target != dir {
				t.Errorf("%s links to %q (%v); want %s", link, target, err, dir)
			}
			if again := sandboxesDir(log, dataDir, places); again != dir {
				t.Errorf("a second call: %s; want %s", again, dir)
			}
			if other := sandboxesDir(log, t.TempDir(), places); other == dir {
				t.Errorf("another data dir has the same records' directory %s", dir)
			}
		})
	}
}

// TestSandboxesDirOnATmpfs: with this host's places, the records land
// on a tmpfs wherever root has one (/run, else /dev/shm), and the
// choice is logged. Before, they went to /run/delegate whatever its
// filesystem: on a host whose /run is on disk, ext4 (issue 41, item 2).
func TestSandboxesDirOnATmpfs(t *testing.T) {
	if !onTmpfs("/run/delegate") && (os.Geteuid() != 0 || !onTmpfs("/dev/shm")) {
		t.Skip("no tmpfs for this uid's records on this host: the data dir's is right")
	}
	dataDir := t.TempDir()
	var logged bytes.Buffer
	dir := sandboxesDir(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})), dataDir, recordPlaces())
	if dir != filepath.Join(dataDir, "sandboxes") {
		t.Cleanup(func() { os.Remove(dir) })
	}
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil || s.Type != unix.TMPFS_MAGIC {
		t.Fatalf("records in %s: filesystem %#x (%v); want a tmpfs (%#x). Log:\n%s", dir, s.Type, err, unix.TMPFS_MAGIC, logged.String())
	}
	if want := "on_tmpfs=true"; !strings.Contains(logged.String(), want) {
		t.Errorf("the debug log does not say %q:\n%s", want, logged.String())
	}
}

// tmpfsDir is a directory of the test's on /dev/shm, a real tmpfs.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	if !onTmpfs("/dev/shm") {
		t.Skip("/dev/shm is not a tmpfs on this host")
	}
	dir, err := os.MkdirTemp("/dev/shm", "delegate-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// diskDir is a directory of the test's on no tmpfs.
func diskDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if onTmpfs(dir) {
		t.Skip("the test's temporary directory is on a tmpfs: no place on disk to try")
	}
	return dir
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}
