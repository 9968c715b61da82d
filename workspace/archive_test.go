package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it reads and writes as another user")
	}
}

// chownTree gives a whole tree to uid (and its group, the same number).
func chownTree(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A tree archived and extracted elsewhere is the same tree, and git works
// in the copy as in the original.
func TestArchiveRoundTrip(t *testing.T) {
	repo := newRepo(t, map[string]string{
		"main.go":       "package main\n",
		"run.sh":        "#!/bin/sh\necho hi\n",
		"dir/data.bin":  "\x00\x01\x02binary",
		"dir/link":      "->../main.go",
		".gitignore":    "*.o\n",
		"unicode/é.txt": "accent\n",
	})
	os.Chmod(filepath.Join(repo, "run.sh"), 0o755)
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "modes")
	writeFiles(t, repo, map[string]string{"main.go": "package main // edited\n", "new.txt": "untracked\n", "x.o": "ignored\n"})
	os.Chmod(filepath.Join(repo, "dir"), 0o750)

	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "tar", true: "tar.gz"}[gz], func(t *testing.T) {
			tr, err := Scan(context.Background(), repo, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			base, err := tr.Archive(context.Background(), &buf, ArchiveOptions{Gzip: gz})
			if err != nil {
				t.Fatal(err)
			}
			if gz != bytes.HasPrefix(buf.Bytes(), []byte{0x1f, 0x8b}) {
				t.Errorf("gzip %v, stream starts % x", gz, buf.Bytes()[:2])
			}
			dst := t.TempDir()
			res, err := Extract(context.Background(), &buf, dst, ExtractOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Files != tr.Files || res.Dirs != tr.Dirs {
				t.Errorf("extracted %d files %d dirs, scanned %d and %d", res.Files, res.Dirs, tr.Files, tr.Dirs)
			}
			if _, err := os.Lstat(filepath.Join(dst, "x.o")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the ignored x.o came along: %v", err)
			}
			for _, e := range tr.Entries {
				src, cp := filepath.Join(repo, e.Path), filepath.Join(dst, e.Path)
				a, err1 := os.Lstat(src)
				b, err2 := os.Lstat(cp)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: %v %v", e.Path, err1, err2)
				}
				if a.Mode() != b.Mode() || !a.ModTime().Equal(b.ModTime()) {
					t.Errorf("%s: mode %v mtime %v, copy %v %v", e.Path, a.Mode(), a.ModTime(), b.Mode(), b.ModTime())
				}
				switch e.Type {
				case TypeFile:
					x, _ := os.ReadFile(src)
					y, _ := os.ReadFile(cp)
					if !bytes.Equal(x, y) {
						t.Errorf("%s: content differs", e.Path)
					}
				case TypeSymlink:
					x, _ := os.Readlink(src)
					y, _ := os.Readlink(cp)
					if x != y {
						t.Errorf("%s: link %q, copy %q", e.Path, x, y)
					}
				}
			}
			for _, args := range [][]string{{"status", "--porcelain"}, {"diff"}, {"log", "--oneline"}} {
				if a, b := git(t, repo, args...), git(t, dst, args...); a != b {
					t.Errorf("git %s differs:\n%s\ncopy:\n%s", strings.Join(args, " "), a, b)
				}
			}

			// The baseline: every file and link outside .git, with its hash,
			// and it survives JSON.
			js, err := json.Marshal(base)
			if err != nil {
				t.Fatal(err)
			}
			var back Baseline
			if err := json.Unmarshal(js, &back); err != nil || back.Check() != nil {
				t.Fatalf("baseline JSON: %v %v\n%s", err, back.Check(), js)
			}
			if back.Kind != KindGit || back.Head != tr.Head || back.Branch != "main" {
				t.Errorf("baseline %s %s %s", back.Kind, back.Head, back.Branch)
			}
			files := back.byPath()
			if len(files) != len(paths(tr, false)) {
				t.Errorf("baseline has %d paths, the tree %d", len(files), len(paths(tr, false)))
			}
			for p, f := range files {
				if inGit(p) {
					t.Errorf("baseline holds %s", p)
				}
				switch f.Type {
				case TypeFile:
					data, _ := os.ReadFile(filepath.Join(repo, p))
					sum := sha256.Sum256(data)
					if f.SHA256 != hex.EncodeToString(sum[:]) || f.Size != int64(len(data)) {
						t.Errorf("%s: baseline %+v", p, f)
					}
				case TypeSymlink:
					if f.Target != "../main.go" {
						t.Errorf("%s: baseline %+v", p, f)
					}
				}
			}
			if files["run.sh"].Mode != 0o755 || !strings.Contains(string(js), `"mode":"0755"`) {
				t.Errorf("run.sh mode %v in %s", files["run.sh"].Mode, js)
			}
		})
	}
}

// Files are read as the tree's owner: one the owner cannot read but root
// can is refused, and so is a directory the owner cannot list.
func TestArchiveReadsAsOwner(t *testing.T) {
	needRoot(t)
	const uid = 4242
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"mine.txt": "mine\n", "sub/ok": "ok\n"})
	chownTree(t, dir, uid)
	os.Chmod(filepath.Dir(dir), 0o755)

	tr, err := Scan(context.Background(), dir, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Archive(context.Background(), io.Discard, ArchiveOptions{}); err != nil {
		t.Fatalf("the owner's own files: %v", err)
	}

	// Root's file, planted in the owner's tree.
	writeFiles(t, dir, map[string]string{"shadow": "root's secret\n"})
	os.Chmod(filepath.Join(dir, "shadow"), 0o600)
	tr, err = Scan(context.Background(), dir, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, err = tr.Archive(context.Background(), &buf, ArchiveOptions{})
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "shadow") {
		t.Fatalf("err %v, want permission denied on shadow", err)
	}
	if bytes.Contains(buf.Bytes(), []byte("root's secret")) {
		t.Fatal("root's file reached the archive")
	}
	os.Remove(filepath.Join(dir, "shadow"))

	// A directory only root can list.
	os.Mkdir(filepath.Join(dir, "rootonly"), 0o700)
	writeFiles(t, dir, map[string]string{"rootonly/x": "x"})
	if _, err := Scan(context.Background(), dir, ScanOptions{}); !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "rootonly") {
		t.Fatalf("err %v, want permission denied on rootonly", err)
	}
}

// A link swapped in after the scan is not followed: the archive fails
// with a *ChangedError and holds nothing of the link's target.
func TestArchiveSwappedLinkNotFollowed(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("TOPSECRET"), 0o600)
	for _, tc := range []struct {
		name string
		swap func(dir string)
	}{
		{"a file becomes a link", func(dir string) {
			os.Remove(filepath.Join(dir, "a/file"))
			os.Symlink(secret, filepath.Join(dir, "a/file"))
		}},
		{"a directory becomes a link", func(dir string) {
			os.RemoveAll(filepath.Join(dir, "a"))
			os.Mkdir(filepath.Join(dir, "b"), 0o755)
			os.WriteFile(filepath.Join(dir, "b/file"), []byte("plain"), 0o644)
			os.Symlink("b", filepath.Join(dir, "a"))
		}},
		{"a link's target changes", func(dir string) {
			os.Remove(filepath.Join(dir, "l"))
			os.Symlink(secret, filepath.Join(dir, "l"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"a/file": "plain", "l": "->a/file"})
			tr, err := Scan(context.Background(), dir, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tc.swap(dir)
			var buf bytes.Buffer
			_, err = tr.Archive(context.Background(), &buf, ArchiveOptions{})
			if !errors.Is(err, ErrChanged) {
				t.Fatalf("err %v, want ErrChanged", err)
			}
			if bytes.Contains(buf.Bytes(), []byte("TOPSECRET")) {
				t.Fatal("the link was followed")
			}
		})
	}
}

// While a path flips between a file and a link to a secret, archives
// either succeed with the file or fail with ErrChanged: the secret never
// shows up.
func TestArchiveRacingLink(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("TOPSECRET"), 0o644)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"d/x": "plain"})
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "d.real"))
			os.Symlink(filepath.Dir(secret), filepath.Join(dir, "d"))
			os.Remove(filepath.Join(dir, "d"))
			os.Rename(filepath.Join(dir, "d.real"), filepath.Join(dir, "d"))
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	ok, changed := 0, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && ok+changed < 2000; {
		tr, err := Scan(context.Background(), dir, ScanOptions{})
		if err != nil {
			changed++
			continue
		}
		var buf bytes.Buffer
		_, err = tr.Archive(context.Background(), &buf, ArchiveOptions{})
		if bytes.Contains(buf.Bytes(), []byte("TOPSECRET")) {
			t.Fatal("a racing link was followed")
		}
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrChanged), errors.Is(err, fs.ErrNotExist):
			changed++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	t.Logf("%d consistent copies, %d consistent errors", ok, changed)
}

// A file that changes while it is read gives a *ChangedError.
func TestArchiveFileChangedWhileRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(p string)
	}{
		{"appended", func(p string) {
			f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString("more")
			f.Close()
		}},
		{"rewritten in place, same size", func(p string) {
			os.WriteFile(p, []byte("BBBB"), 0o644)
			// Its time moves, as it would past the file system's
			// granularity (a rewrite within it keeps the same time).
			later := time.Now().Add(time.Second)
			os.Chtimes(p, later, later)
		}},
		{"truncated", func(p string) { os.Truncate(p, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"f": "AAAA"})
			tr, err := Scan(context.Background(), dir, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = tr.Archive(context.Background(), io.Discard, ArchiveOptions{afterRead: func(p string) { tc.change(filepath.Join(dir, p)) }})
			var ce *ChangedError
			if !errors.As(err, &ce) || ce.Path != "f" {
				t.Fatalf("err %v, want a *ChangedError for f", err)
			}
		})
	}
	// And one that changed between the scan and the archive.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"f": "AAAA"})
	tr, _ := Scan(context.Background(), dir, ScanOptions{})
	os.WriteFile(filepath.Join(dir, "f"), []byte("AAAAA"), 0o644)
	if _, err := tr.Archive(context.Background(), io.Discard, ArchiveOptions{}); !errors.Is(err, ErrChanged) {
		t.Fatalf("err %v, want ErrChanged", err)
	}
}

// Extract refuses names that leave the directory and never writes through
// a link, even one the archive itself made.
func TestExtractRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		want    error
	}{
		{"dot-dot", []tar.Header{{Name: "../escape", Typeflag: tar.TypeReg}}, ErrBadArchive},
		{"absolute", []tar.Header{{Name: "/etc/escape", Typeflag: tar.TypeReg}}, ErrBadArchive},
		{"inner dot-dot", []tar.Header{{Name: "a/../../escape", Typeflag: tar.TypeReg}}, ErrBadArchive},
		{"through a link it made", []tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "l/escape", Typeflag: tar.TypeReg},
		}, ErrSymlink},
		{"over a link it made", []tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: filepath.Join(outside, "escape")},
			{Name: "l", Typeflag: tar.TypeReg},
		}, fs.ErrExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				h.Mode = 0o644
				tw.WriteHeader(&h)
			}
			tw.Close()
			_, err := Extract(context.Background(), &buf, t.TempDir(), ExtractOptions{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(outside, "escape")); err == nil {
				t.Fatal("wrote outside")
			}
		})
	}
}

// Extract writes as the directory's owner, and drops setuid bits.
func TestExtractWritesAsOwner(t *testing.T) {
	needRoot(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "d/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2})
	tw.Write([]byte("hi"))
	tw.Close()
	dst := t.TempDir()
	os.Chown(dst, 4242, 4242)
	if _, err := Extract(context.Background(), &buf, dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/suid"} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 4242 || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			t.Errorf("%s: uid %d mode %v", p, st.Uid, fi.Mode())
		}
	}
	// A directory the owner cannot write into: refused, though root could.
	os.Chmod(dst, 0o555)
	buf.Reset()
	tw = tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	if _, err := Extract(context.Background(), &buf, dst, ExtractOptions{}); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("err %v, want permission denied", err)
	}
}

// The stream is standard pax: GNU tar extracts it as archive/tar reads
// it, long names, long link targets, names that are not ASCII and
// nanosecond times included.
func TestArchiveReadByGNUTar(t *testing.T) {
	tarBin, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("tar is not installed")
	}
	src := t.TempDir()
	long := strings.Repeat("long-directory-name/", 8) + strings.Repeat("n", 90) + ".txt"
	writeFiles(t, src, map[string]string{
		long:           "deep\n",
		"ünï/cødé.txt": "unicode\n",
		"short":        "s",
		"biglink":      "->" + strings.Repeat("t", 150),
		"empty":        "",
	})
	mt := time.Date(2025, 5, 6, 7, 8, 9, 123456789, time.UTC)
	os.Chtimes(filepath.Join(src, "short"), mt, mt)
	tr, err := Scan(context.Background(), src, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := tr.Archive(context.Background(), &buf, ArchiveOptions{}); err != nil {
		t.Fatal(err)
	}
	// archive/tar reads every entry with its full name and time.
	r := tar.NewReader(bytes.NewReader(buf.Bytes()))
	names := map[string]*tar.Header{}
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = h
	}
	if h := names["short"]; h == nil || !h.ModTime.Equal(mt) || h.Size != 1 || h.Format != tar.FormatPAX {
		t.Errorf("short: %+v", h)
	}
	if h := names[long]; h == nil || h.Size != 5 {
		t.Errorf("the long name: %+v", h)
	}
	if h := names["biglink"]; h == nil || h.Linkname != strings.Repeat("t", 150) {
		t.Errorf("the long link: %+v", h)
	}
	// GNU tar too.
	dst := t.TempDir()
	cmd := exec.Command(tarBin, "-xf", "-", "-C", dst)
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	compareTrees(t, src, dst)
	fi, err := os.Stat(filepath.Join(dst, "short"))
	if err != nil || !fi.ModTime().Equal(mt) {
		t.Errorf("short's time from GNU tar: %v %v", fi.ModTime(), err)
	}
}
