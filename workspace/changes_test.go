package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// importTree scans and archives src, extracts it into a new directory
// (the sandbox's /workspace) and returns both and the baseline.
func importTree(t *testing.T, src string, opts ScanOptions) (sandbox string, base *Baseline) {
	t.Helper()
	tr, err := Scan(context.Background(), src, opts)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	base, err = tr.Archive(context.Background(), &buf, ArchiveOptions{Gzip: true})
	if err != nil {
		t.Fatal(err)
	}
	sandbox = t.TempDir()
	if _, err := Extract(context.Background(), &buf, sandbox, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	return sandbox, base
}

// readBack is what the engine does after the job: the sandbox's tree as a
// stream (taken whole), compared with the baseline.
func readBack(t *testing.T, sandbox string, base *Baseline, opts ChangesOptions) *Changes {
	t.Helper()
	tr, err := Scan(context.Background(), sandbox, ScanOptions{IncludeIgnored: true})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := tr.Archive(context.Background(), &buf, ArchiveOptions{NoBaseline: true}); err != nil {
		t.Fatal(err)
	}
	cs, err := ReadChanges(context.Background(), base, &buf, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Read from the directory itself, the same changes.
	dc, err := DirChanges(context.Background(), base, sandbox, opts)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(cs)
	b, _ := json.Marshal(dc)
	if !bytes.Equal(a, b) {
		t.Errorf("ReadChanges and DirChanges differ:\n%s\n%s", a, b)
	}
	return cs
}

func summary(cs *Changes) []string {
	var out []string
	for _, c := range cs.Changes {
		out = append(out, string(c.Kind)+" "+c.Path)
	}
	return out
}

// The changes of a job: added, modified (content, mode, type) and deleted
// paths with sizes; nothing under .git; new files git ignores left out;
// a diff that names binary files; a patch `git apply` takes, after which
// the source is what the sandbox holds.
func TestChangesDiffAndPatch(t *testing.T) {
	src := newRepo(t, map[string]string{
		".gitignore":       "build/\n*.o\n",
		"main.go":          "package main\n\nfunc main() {\n\tprintln(\"a\")\n}\n",
		"lib/long.txt":     numbered(1, 40),
		"lib/gone.txt":     "to be deleted\n",
		"bin.dat":          "\x00\x01\x02\x03 binary",
		"bin-gone.dat":     "\x00 binary, deleted",
		"script.sh":        "#!/bin/sh\necho hi\n",
		"no-newline.txt":   "last line without newline",
		"link":             "->main.go",
		"becomes-link.txt": "a file for now\n",
		"with space.txt":   "spaces\n",
		"ünïcode.txt":      "unicode name\n",
		"empty-gone":       "",
	})
	// Untracked at the import, not ignored: part of the baseline too.
	writeFiles(t, src, map[string]string{"notes.txt": "untracked notes\n"})
	sandbox, base := importTree(t, src, ScanOptions{})

	// The job.
	lt := strings.Replace(numbered(1, 40), "line 5\n", "line 5 changed\n", 1)
	lt = strings.Replace(lt, "line 30\n", "", 1) + "line 41\n"
	writeFiles(t, sandbox, map[string]string{
		"main.go":               "package main\n\nfunc main() {\n\tprintln(\"b\")\n}\n",
		"lib/long.txt":          lt,
		"bin.dat":               "\x00\x01\x02\x04 binary, changed",
		"no-newline.txt":        "last line without newline, changed",
		"link":                  "->lib/long.txt",
		"becomes-link.txt":      "->main.go",
		"new/dir/added.go":      "package dir\n",
		"new-binary.bin":        "\x00\xff new",
		"new-empty":             "",
		"with space.txt":        "spaces changed\n",
		"ünïcode.txt":           "unicode changed\n",
		"build/output":          "ignored: build/\n",
		"x.o":                   "ignored: *.o\n",
		".git/hooks/pre-commit": "#!/bin/sh\necho planted\n",
		".git/config":           "[core]\n\tfsmonitor = /tmp/evil\n",
		"notes.txt":             "untracked notes, edited\n",
		// The answers to its questions (engine.AnswersDir): delegate's.
		".delegate/answers/q-1.json": "{\"action\":\"accept\"}\n",
	})
	os.Chmod(filepath.Join(sandbox, "script.sh"), 0o755)
	os.Remove(filepath.Join(sandbox, "lib/gone.txt"))
	os.Remove(filepath.Join(sandbox, "bin-gone.dat"))
	os.Remove(filepath.Join(sandbox, "empty-gone"))

	cs := readBack(t, sandbox, base, ChangesOptions{})
	want := []string{
		"modified becomes-link.txt", "deleted bin-gone.dat", "modified bin.dat", "deleted empty-gone",
		"deleted lib/gone.txt", "modified lib/long.txt", "modified link", "modified main.go",
		"added new-binary.bin", "added new-empty", "added new/dir/added.go", "modified no-newline.txt",
		"modified notes.txt", "modified script.sh", "modified with space.txt", "modified ünïcode.txt",
	}
	if got := summary(cs); !slices.Equal(got, want) {
		t.Fatalf("changes\n%q\nwant\n%q", got, want)
	}
	if cs.Added != 3 || cs.Modified != 10 || cs.Deleted != 3 || cs.IgnoredAdded != 2 {
		t.Errorf("added %d modified %d deleted %d ignored %d", cs.Added, cs.Modified, cs.Deleted, cs.IgnoredAdded)
	}
	for _, c := range cs.Changes {
		switch c.Path {
		case "main.go":
			if c.Old.Size != 44 || c.New.Size != 44 || c.Binary {
				t.Errorf("main.go sizes %d -> %d", c.Old.Size, c.New.Size)
			}
		case "bin.dat", "new-binary.bin":
			if !c.Binary {
				t.Errorf("%s is not binary", c.Path)
			}
		}
	}

	// The diff before the old contents are read: named, not shown.
	page := cs.Diff(DiffOptions{})
	if !strings.Contains(page.Text, "# main.go: the old content is unknown") {
		t.Errorf("diff without ReadOld:\n%s", page.Text)
	}
	if _, err := cs.Patch(0); err == nil {
		t.Error("a patch without the old contents")
	}

	if err := cs.ReadOld(context.Background(), src, ""); err != nil {
		t.Fatal(err)
	}
	full := cs.Diff(DiffOptions{Limit: 1 << 20})
	for _, s := range []string{
		"diff --git a/main.go b/main.go\n--- a/main.go\n+++ b/main.go\n@@ -1,5 +1,5 @@\n package main\n \n func main() {\n-\tprintln(\"a\")\n+\tprintln(\"b\")\n }\n",
		"Binary files a/bin.dat and b/bin.dat differ\n",
		"old mode 100644\nnew mode 100755\n",
		"-last line without newline\n\\ No newline at end of file\n+last line without newline, changed\n\\ No newline at end of file\n",
		"diff --git a/becomes-link.txt b/becomes-link.txt\ndeleted file mode 100644\n",
		"diff --git a/becomes-link.txt b/becomes-link.txt\nnew file mode 120000\n",
		`diff --git "a/\303\274n\303\257code.txt" "b/\303\274n\303\257code.txt"`,
		"@@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+line 5 changed\n",
	} {
		if !strings.Contains(full.Text, s) {
			t.Errorf("the diff lacks\n%s\n--- diff:\n%s", s, full.Text)
		}
	}
	if strings.Contains(full.Text, ".git/") || strings.Contains(full.Text, "planted") {
		t.Error("the diff shows something under .git")
	}

	// Pages of 200 bytes put back together are the whole diff, and each
	// ends at a line's end.
	var joined strings.Builder
	pages := 0
	for off := int64(0); ; pages++ {
		p := cs.Diff(DiffOptions{Offset: off, Limit: 200})
		joined.WriteString(p.Text)
		if p.Next != 0 && !strings.HasSuffix(p.Text, "\n") {
			t.Errorf("page at %d ends mid-line", off)
		}
		if p.Total != full.Total {
			t.Errorf("total %d, want %d", p.Total, full.Total)
		}
		if p.Next == 0 {
			break
		}
		off = p.Next
	}
	if joined.String() != full.Text || pages < 5 {
		t.Errorf("%d pages joined differ from the whole", pages)
	}
	// Capped: the files past the cap are named.
	capped := cs.Diff(DiffOptions{MaxBytes: 300, Limit: 1 << 20})
	if capped.Omitted == 0 || !strings.Contains(capped.Text, `#   modified "\303\274n\303\257code.txt": 16 bytes, mode 100644, sha256 `) {
		t.Errorf("capped diff (%d omitted):\n%s", capped.Omitted, capped.Text)
	}

	// The patch, applied by git to a fresh copy of the source, gives the
	// sandbox's tree (less what git ignores and .git).
	patch, err := cs.Patch(0)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := importTree(t, src, ScanOptions{})
	pf := filepath.Join(t.TempDir(), "job.patch")
	os.WriteFile(pf, patch, 0o644)
	if out, err := gitTry(t, target, "apply", "--check", pf); err != nil {
		t.Fatalf("git apply --check: %v\n%s\n--- patch:\n%s", err, out, patch)
	}
	git(t, target, "apply", pf)
	os.RemoveAll(filepath.Join(sandbox, ".delegate")) // delegate's, not in the patch
	compareTrees(t, sandbox, target)
	if _, err := cs.Patch(int64(len(patch) - 1)); !errors.Is(err, ErrOverCap) {
		t.Errorf("a patch over its cap: %v", err)
	}
}

// compareTrees checks that two trees hold the same files, links and exec
// bits, outside .git and what git ignores in the first.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	a, err := Scan(context.Background(), want, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Scan(context.Background(), got, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pa, pb := paths(a, false), paths(b, false); !slices.Equal(pa, pb) {
		t.Fatalf("paths differ:\n%q\n%q", pa, pb)
	}
	for _, e := range a.Entries {
		if e.Type == TypeDir || inGit(e.Path) {
			continue
		}
		x, y := filepath.Join(want, e.Path), filepath.Join(got, e.Path)
		fx, _ := os.Lstat(x)
		fy, _ := os.Lstat(y)
		if fx.Mode().Type() != fy.Mode().Type() || fx.Mode()&0o100 != fy.Mode()&0o100 {
			t.Errorf("%s: mode %v, got %v", e.Path, fx.Mode(), fy.Mode())
		}
		if e.Type == TypeSymlink {
			lx, _ := os.Readlink(x)
			ly, _ := os.Readlink(y)
			if lx != ly {
				t.Errorf("%s: link %q, got %q", e.Path, lx, ly)
			}
			continue
		}
		dx, _ := os.ReadFile(x)
		dy, _ := os.ReadFile(y)
		if !bytes.Equal(dx, dy) {
			t.Errorf("%s: content %q, got %q", e.Path, dx, dy)
		}
	}
}

func numbered(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// Without Verify, a file whose size, time and mode are the baseline's is
// taken as unchanged (git's own shortcut); Verify reads it all.
func TestChangesVerify(t *testing.T) {
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "AAAA", "b": "BBBB"})
	sandbox, base := importTree(t, src, ScanOptions{})
	fi, _ := os.Stat(filepath.Join(sandbox, "a"))
	os.WriteFile(filepath.Join(sandbox, "a"), []byte("XXXX"), 0o644)
	os.Chtimes(filepath.Join(sandbox, "a"), time.Now(), fi.ModTime())
	if cs := readBack(t, sandbox, base, ChangesOptions{}); len(cs.Changes) != 0 {
		t.Errorf("without Verify: %q", summary(cs))
	}
	if cs := readBack(t, sandbox, base, ChangesOptions{Verify: true}); !slices.Equal(summary(cs), []string{"modified a"}) {
		t.Errorf("with Verify: %q", summary(cs))
	}
	// Touched only: read, found the same, not a change.
	os.WriteFile(filepath.Join(sandbox, "b"), []byte("BBBB"), 0o644)
	if cs := readBack(t, sandbox, base, ChangesOptions{}); len(cs.Changes) != 0 {
		t.Errorf("touched: %q", summary(cs))
	}
}

// A stream read back from a sandbox is untrusted: names that climb out,
// duplicates and hard links to content it does not hold are refused.
func TestChangesBadArchive(t *testing.T) {
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "AAAA"})
	_, base := importTree(t, src, ScanOptions{})
	for _, tc := range []struct {
		name    string
		entries []tar.Header
	}{
		{"dot-dot", []tar.Header{{Name: "../a", Typeflag: tar.TypeReg}}},
		{"absolute", []tar.Header{{Name: "/a", Typeflag: tar.TypeReg}}},
		{"twice", []tar.Header{{Name: "b", Typeflag: tar.TypeReg}, {Name: "./b", Typeflag: tar.TypeReg}}},
		{"hard link to an unchanged file", []tar.Header{{Name: "a", Typeflag: tar.TypeReg, Size: 4}, {Name: "c", Typeflag: tar.TypeLink, Linkname: "a"}}},
		{"hard link out", []tar.Header{{Name: "c", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				h.Mode = 0o644
				tw.WriteHeader(&h)
				if h.Size > 0 {
					tw.Write([]byte("AAAA"))
				}
			}
			tw.Close()
			// Make "a" look unchanged to the shortcut: its baseline's time.
			base.Files[0].MTime = 0
			if _, err := ReadChanges(context.Background(), base, &buf, ChangesOptions{}); !errors.Is(err, ErrBadArchive) {
				t.Fatalf("err %v, want ErrBadArchive", err)
			}
		})
	}
}

// The line diff is a correct edit script on random inputs, the capped
// one included.
func TestDiffLinesRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	gen := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = string(rune('a'+rng.Intn(6))) + "\n"
		}
		return out
	}
	for i := range 500 {
		a, b := gen(rng.Intn(60)), gen(rng.Intn(60))
		if i%50 == 0 {
			a, b = gen(3000), gen(3000) // past maxEditCost
		}
		ops := diffLines(a, b)
		var ra, rb []string
		for _, o := range ops {
			switch o.kind {
			case '=':
				if a[o.a] != b[o.b] {
					t.Fatalf("'=' joins %q and %q", a[o.a], b[o.b])
				}
				ra, rb = append(ra, a[o.a]), append(rb, b[o.b])
			case '-':
				ra = append(ra, a[o.a])
			case '+':
				rb = append(rb, b[o.b])
			}
		}
		if !slices.Equal(ra, a) || !slices.Equal(rb, b) {
			t.Fatalf("case %d: the script does not rebuild both sides", i)
		}
	}
	// Shortest on a known case: one line changed in the middle.
	a := strings.SplitAfter(numbered(1, 9), "\n")
	b := slices.Clone(a)
	b[4] = "five\n"
	edits := 0
	for _, o := range diffLines(a, b) {
		if o.kind != '=' {
			edits++
		}
	}
	if edits != 2 {
		t.Errorf("%d edits, want 2", edits)
	}
}

// DirChanges reads the sandbox as its owner: a file there that only root
// can read is refused, not read.
func TestDirChangesAsOwner(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a\n"})
	sandbox, base := importTree(t, src, ScanOptions{})
	chownTree(t, sandbox, 4242)
	if cs, err := DirChanges(context.Background(), base, sandbox, ChangesOptions{}); err != nil || len(cs.Changes) != 0 {
		t.Fatalf("unchanged: %v %v", err, cs)
	}
	writeFiles(t, sandbox, map[string]string{"secret": "root only\n"})
	os.Chmod(filepath.Join(sandbox, "secret"), 0o600)
	if _, err := DirChanges(context.Background(), base, sandbox, ChangesOptions{}); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("err %v, want permission denied", err)
	}
}
