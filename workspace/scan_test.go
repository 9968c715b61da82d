package workspace

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// A git work tree comes in as git sees it: the paths Scan takes outside
// .git are exactly what `git ls-files --cached --others --exclude-standard`
// lists (less what is deleted from the work tree), and .git comes whole.
func TestScanGitTreeAsGitSeesIt(t *testing.T) {
	repo := newRepo(t, map[string]string{
		".gitignore":            "*.log\nbuild/\n/top-only.txt\n!keep.log\nnode_modules\n",
		"main.go":               "package main\n",
		"keep.log":              "kept by the negation\n",
		"sub/.gitignore":        "*.tmp\n",
		"sub/a.go":              "package sub\n",
		"docs/guide.md":         "# guide\n",
		"tracked-but-ignored/x": "tracked\n",
		"deleted.txt":           "will be deleted\n",
		"link":                  "->main.go",
		"dangling":              "->/nowhere/at/all",
	})
	// Tracked, then ignored: still taken (git tracks it).
	writeFiles(t, repo, map[string]string{".git/info/exclude": "secret.env\ntracked-but-ignored/\n"})
	writeFiles(t, repo, map[string]string{
		"untracked.go":            "package main // new\n",
		"debug.log":               "ignored\n",
		"build/out.bin":           "ignored dir\n",
		"sub/x.tmp":               "ignored by sub/.gitignore\n",
		"x.tmp":                   "not ignored at the top\n",
		"top-only.txt":            "ignored at the top only\n",
		"sub/top-only.txt":        "not ignored here\n",
		"node_modules/pkg/i.js":   "ignored\n",
		"secret.env":              "ignored by info/exclude\n",
		"tracked-but-ignored/new": "untracked in an ignored dir\n",
		"new/deep/dir/file.txt":   "untracked, deep\n",
		"sub/node_modules/x/y.js": "ignored\n",
	})
	os.Remove(filepath.Join(repo, "deleted.txt"))

	want := lines(git(t, repo, "ls-files", "--cached", "--others", "--exclude-standard"))
	want = slices.DeleteFunc(want, func(p string) bool { return p == "deleted.txt" })

	tr, err := Scan(context.Background(), repo, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Kind != KindGit || tr.Branch != "main" || len(tr.Head) != 40 {
		t.Errorf("kind %q, branch %q, head %q: want git, main and a commit", tr.Kind, tr.Branch, tr.Head)
	}
	if got := paths(tr, false); !slices.Equal(got, want) {
		t.Errorf("scan took\n%q\ngit lists\n%q", got, want)
	}
	// .git itself, all of it.
	for _, p := range []string{".git/HEAD", ".git/index", ".git/info/exclude"} {
		if !slices.Contains(paths(tr, true), p) {
			t.Errorf("%s missing from the tree", p)
		}
	}

	// Asked for, ignored files come too: every file there is.
	all, err := Scan(context.Background(), repo, ScanOptions{IncludeIgnored: true})
	if err != nil {
		t.Fatal(err)
	}
	got := paths(all, false)
	for _, p := range []string{"debug.log", "build/out.bin", "node_modules/pkg/i.js", "secret.env", "sub/x.tmp"} {
		if !slices.Contains(got, p) {
			t.Errorf("IncludeIgnored: %s missing", p)
		}
	}
	if !all.IncludeIgnored || len(got) <= len(want) {
		t.Errorf("IncludeIgnored took %d paths, without %d", len(got), len(want))
	}
}

// A plain directory comes whole; links are entries (never followed);
// sockets and fifos are skipped and listed.
func TestScanPlainDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		".gitignore":  "*.log\n", // not a git tree: no rules apply
		"a.log":       "taken\n",
		"sub/b.txt":   "b\n",
		"out":         "->/etc",
		"sub/loop":    "->loop",
		"empty/.keep": "",
	})
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	tr, err := Scan(context.Background(), dir, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".gitignore", "a.log", "empty/.keep", "out", "sub/b.txt", "sub/loop"}
	if got := paths(tr, false); !slices.Equal(got, want) || tr.Kind != KindDir {
		t.Errorf("kind %s, took %q, want %q", tr.Kind, got, want)
	}
	for _, e := range tr.Entries {
		if e.Path == "out" && (e.Type != TypeSymlink || e.Target != "/etc") {
			t.Errorf("out: %+v, want a link to /etc", e)
		}
	}
	skipped := map[string]string{}
	for _, s := range tr.Skipped {
		skipped[s.Path] = s.Reason
	}
	if skipped["fifo"] != "a fifo" || skipped["sock"] != "a socket" || tr.SkippedCount != 2 {
		t.Errorf("skipped %v (%d), want the fifo and the socket", skipped, tr.SkippedCount)
	}
	if tr.Files != 6 || tr.Dirs != 2 || tr.Bytes != int64(len("taken\nb\n*.log\n")) {
		t.Errorf("files %d dirs %d bytes %d", tr.Files, tr.Dirs, tr.Bytes)
	}
}

// The caps are checked while scanning, and the error has the figure found.
func TestScanCaps(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for i := range 30 {
		files[filepath.Join("d", string(rune('a'+i%26))+strings.Repeat("x", i))] = strings.Repeat("y", 100)
	}
	writeFiles(t, dir, files)
	for _, tc := range []struct {
		name string
		opts ScanOptions
		want string
	}{
		{"files", ScanOptions{MaxFiles: 10}, "31 files found, over the cap of 10"},
		{"files counted up to four times the cap", ScanOptions{MaxFiles: 5}, "more than 21 files found, over the cap of 5"},
		{"bytes", ScanOptions{MaxBytes: 1000}, "3000 bytes found, over the cap of 1000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Scan(context.Background(), dir, tc.opts)
			var ce *CapError
			if !errors.As(err, &ce) || !errors.Is(err, ErrOverCap) || err.Error() != tc.want {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Scan(context.Background(), dir, ScanOptions{MaxFiles: 31, MaxBytes: 3000}); err != nil {
		t.Errorf("at the caps exactly: %v", err)
	}
}

// Bad sources: each a clear error that errors.Is can tell.
func TestScanBadSource(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"file": "x", "link": "->.", "loop": "->loop", "ok/a": "a"})
	for _, tc := range []struct {
		name, path string
		within     string
		want       error
	}{
		{"relative", "some/dir", "", ErrNotAbsolute},
		{"missing", filepath.Join(dir, "missing"), "", fs.ErrNotExist},
		{"a file", filepath.Join(dir, "file"), "", ErrNotDirectory},
		{"a link", filepath.Join(dir, "link"), "", ErrSymlink},
		{"a link loop", filepath.Join(dir, "loop"), "", ErrSymlink},
		{"outside the allowed root", dir, filepath.Join(dir, "ok"), ErrOutside},
		{"a link under the allowed root", filepath.Join(dir, "link", "ok"), dir, ErrSymlink},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Scan(context.Background(), tc.path, ScanOptions{Within: tc.within})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := Scan(context.Background(), filepath.Join(dir, "ok"), ScanOptions{Within: dir}); err != nil {
		t.Errorf("under the allowed root: %v", err)
	}
}
