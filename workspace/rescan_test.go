package workspace

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitPastTimes returns once the kernel's clock, as it stamps files on
// dir's filesystem, is past every change time under dir: a change made
// from then on shows in a status (no sleep: a probe's change time is
// read until it moves on).
func waitPastTimes(t *testing.T, dir string) {
	t.Helper()
	var newest int64
	filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		var st unix.Stat_t
		if err == nil && unix.Lstat(p, &st) == nil {
			newest = max(newest, st.Ctim.Nano())
		}
		return nil
	})
	probe := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+".probe")
	if err := os.WriteFile(probe, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline, mode := time.Now().Add(10*time.Second), fs.FileMode(0o600); ; mode ^= 0o100 {
		var st unix.Stat_t
		if err := os.Chmod(probe, mode); err != nil || unix.Lstat(probe, &st) != nil {
			t.Fatal(err)
		}
		if st.Ctim.Nano() > newest {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the change time of %s stays at or before %d", probe, newest)
		}
	}
}

// scanView is what a scan found, for comparing two.
type scanView struct {
	Kind           Kind
	Head, Branch   string
	Entries        []Entry
	Files, Dirs    int
	Bytes          int64
	Skipped        []Skipped
	SkippedCount   int
	IncludeIgnored bool
}

func viewOf(t *Tree) scanView {
	return scanView{t.Kind, t.Head, t.Branch, t.Entries, t.Files, t.Dirs, t.Bytes, t.Skipped, t.SkippedCount, t.IncludeIgnored}
}

// TestRescan: a tree that nothing changed since its scan is taken again
// as it is, and after any change that a scan would see — a file's content
// of the same size, its mode, a file added, removed or renamed, a link's
// time or target, a directory's mode, an ignore file that ignores itself,
// the index — Rescan gives what a new scan gives. A scan too close to the
// last change, or with other options, scans again.
func TestRescan(t *testing.T) {
	base := map[string]string{
		"a.go":         "package a\n",
		"b.txt":        "bee\n",
		"sub/c.go":     "package sub\n",
		"sub/deep/d":   "d\n",
		"link":         "->a.go",
		"app.log":      "ignored\n",
		".gitignore":   ".gitignore\n*.log\n",
		"sub/.keep":    "",
		"sub/deep/e.o": "object\n",
	}
	cases := []struct {
		name   string
		git    bool
		change func(t *testing.T, dir string)
	}{
		{"nothing", false, nil},
		{"nothing (git)", true, nil},
		{"content of the same size", false, func(t *testing.T, dir string) { rewrite(t, dir, "b.txt", "BEE\n") }},
		{"mode", false, func(t *testing.T, dir string) { chmodIn(t, dir, "a.go", 0o755) }},
		{"directory mode", false, func(t *testing.T, dir string) { chmodIn(t, dir, "sub/deep", 0o700) }},
		{"file added", false, func(t *testing.T, dir string) { rewrite(t, dir, "sub/deep/new", "new\n") }},
		{"file removed", false, func(t *testing.T, dir string) { mustOK(t, os.Remove(filepath.Join(dir, "sub/c.go"))) }},
		{"file renamed", false, func(t *testing.T, dir string) {
			mustOK(t, os.Rename(filepath.Join(dir, "sub/deep/d"), filepath.Join(dir, "sub/deep/f")))
		}},
		{"link's time", false, func(t *testing.T, dir string) {
			ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
			mustOK(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "link"), ts, unix.AT_SYMLINK_NOFOLLOW))
		}},
		{"link's target", false, func(t *testing.T, dir string) {
			mustOK(t, os.Remove(filepath.Join(dir, "link")))
			mustOK(t, os.Symlink("b.txt", filepath.Join(dir, "link")))
		}},
		{"an ignore file that ignores itself", true, func(t *testing.T, dir string) { rewrite(t, dir, ".gitignore", ".gitignore\n*.o\n") }},
		{"the index", true, func(t *testing.T, dir string) { git(t, dir, "add", "-f", "app.log") }},
		{"a file's time set back", false, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "sub/c.go")
			fi, err := os.Stat(p)
			mustOK(t, err)
			rewrite(t, dir, "sub/c.go", "package s\n\n")
			mustOK(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
		}},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "src")
			writeFiles(t, dir, base)
			if c.git {
				git(t, dir, "init", "-q", "-b", "main")
				git(t, dir, "add", "a.go", "b.txt", "sub", "link")
				git(t, dir, "commit", "-q", "-m", "one")
			}
			waitPastTimes(t, dir)
			tree, err := Scan(ctx, dir, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// As if the scan had begun racyMargin later: every time the
			// tree holds is before its start, and a change from now on
			// is after (waitPastTimes).
			tree.began = tree.began.Add(racyMargin)
			if c.change != nil {
				c.change(t, dir)
			}
			again, err := tree.Rescan(ctx, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			fresh, err := Scan(ctx, dir, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(viewOf(again), viewOf(fresh)) {
				t.Fatalf("Rescan found\n%+v\na scan finds\n%+v", viewOf(again), viewOf(fresh))
			}
			local := stampsLocally(openDir(t, dir))
			switch {
			case c.change == nil && local && again != tree:
				t.Error("an unchanged tree was scanned again")
			case c.change != nil && again == tree:
				t.Error("a changed tree was taken as it was")
			}
			if c.change == nil {
				if other, _ := tree.Rescan(ctx, ScanOptions{IncludeIgnored: true}); other == tree {
					t.Error("other options took the tree as it was")
				}
				tree.began = tree.began.Add(-racyMargin)
				if recent, _ := tree.Rescan(ctx, ScanOptions{}); recent == tree {
					t.Error("a tree changed within racyMargin of its scan was taken as it was")
				}
			}
		})
	}
}

func rewrite(t *testing.T, dir, p, content string) {
	t.Helper()
	mustOK(t, os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644))
}

func chmodIn(t *testing.T, dir, p string, mode fs.FileMode) {
	t.Helper()
	mustOK(t, os.Chmod(filepath.Join(dir, p), mode))
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func openDir(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	mustOK(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}
