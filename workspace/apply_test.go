package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// snapshot is every path of a tree with its type, mode, owner and content
// hash: to show that nothing was written.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Lstat(p)
		st := fi.Sys().(*syscall.Stat_t)
		v := fmt.Sprintf("%v uid=%d", fi.Mode(), st.Uid)
		switch {
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			v += fmt.Sprintf(" %x", sha256.Sum256(data))
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += " -> " + l
		}
		m[strings.TrimPrefix(p, dir)] = v
		return nil
	})
	return m
}

// jobChanges imports src, lets job change the sandbox, and returns the
// changes (through JSON, as the engine would keep them).
func jobChanges(t *testing.T, src string, job func(sandbox string)) *Changes {
	t.Helper()
	sandbox, base := importTree(t, src, ScanOptions{})
	job(sandbox)
	cs := readBack(t, sandbox, base, ChangesOptions{})
	js, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	var back Changes
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	return &back
}

// Applied to the source, the changes make it what the sandbox held; as
// the source's owner; and a second time, they are already there.
func TestApplyClean(t *testing.T) {
	needRoot(t)
	const uid = 4242
	src := t.TempDir()
	writeFiles(t, src, map[string]string{
		"a.txt": "a\n", "run.sh": "#!/bin/sh\n", "old/only.txt": "gone soon\n", "f": "a file, then a dir\n",
		"l": "->a.txt", "keep/x": "x\n",
	})
	os.Chmod(filepath.Join(src, "a.txt"), 0o640)
	chownTree(t, src, uid)
	var sandbox string
	cs := jobChanges(t, src, func(sb string) {
		sandbox = sb
		writeFiles(t, sb, map[string]string{"a.txt": "a, edited\n", "new/deep/n.txt": "new\n", "l2.txt": "plain\n"})
		os.Chmod(filepath.Join(sb, "run.sh"), 0o755)
		os.RemoveAll(filepath.Join(sb, "old"))
		os.Remove(filepath.Join(sb, "f"))
		writeFiles(t, sb, map[string]string{"f/inside": "now a directory\n"})
		os.Remove(filepath.Join(sb, "l"))
		writeFiles(t, sb, map[string]string{"l": "a link became a file\n"})
	})
	res, err := Apply(context.Background(), src, cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(res.Written)
	if want := []string{"a.txt", "f/inside", "l", "l2.txt", "new/deep/n.txt", "run.sh"}; !slices.Equal(res.Written, want) {
		t.Errorf("written %q, want %q", res.Written, want)
	}
	if want := []string{"f", "old/only.txt"}; !slices.Equal(res.Deleted, want) {
		t.Errorf("deleted %q, want %q", res.Deleted, want)
	}
	compareTrees(t, sandbox, src)
	if _, err := os.Lstat(filepath.Join(src, "old")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the emptied directory stays: %v", err)
	}
	for p, want := range map[string]fs.FileMode{"a.txt": 0o640, "run.sh": 0o755, "new/deep/n.txt": 0o644, "new/deep": fs.ModeDir | 0o755} {
		fi, err := os.Lstat(filepath.Join(src, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want || fi.Sys().(*syscall.Stat_t).Uid != uid {
			t.Errorf("%s: mode %v uid %d, want %v and %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, want, uid)
		}
	}
	again, err := Apply(context.Background(), src, cs, ApplyOptions{})
	if err != nil || len(again.Written)+len(again.Deleted) != 0 || len(again.Already) != len(cs.Changes) {
		t.Errorf("a second time: %+v, %v", again, err)
	}
}

// When a file the changes touch changed in the target since the import,
// Apply lists every such path and writes nothing.
func TestApplyConflicts(t *testing.T) {
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a\n", "b": "b\n", "c": "c\n", "d/e": "e\n", "untouched": "u\n"})
	cs := jobChanges(t, src, func(sb string) {
		writeFiles(t, sb, map[string]string{"a": "a by the job\n", "b": "b by the job\n", "new": "job\n", "d/e": "e by the job\n", "ok": "fine\n"})
		os.Remove(filepath.Join(sb, "c"))
	})
	// Meanwhile, in the source.
	writeFiles(t, src, map[string]string{"a": "a by the user\n", "new": "user\n"})
	os.Remove(filepath.Join(src, "b"))
	writeFiles(t, src, map[string]string{"c": "c by the user\n"})
	os.RemoveAll(filepath.Join(src, "d"))
	os.Symlink(t.TempDir(), filepath.Join(src, "d"))
	before := snapshot(t, src)

	_, err := Apply(context.Background(), src, cs, ApplyOptions{})
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
		t.Fatalf("err %v, want a *ConflictError", err)
	}
	got := map[string]string{}
	for _, c := range ce.Conflicts {
		got[c.Path] = c.Reason
	}
	want := map[string]string{
		"a":   "changed in the target since the import",
		"b":   "deleted in the target since the import",
		"c":   "changed in the target since the import",
		"d/e": "a parent is now a symbolic link (never followed)",
		"new": "created in the target since the import",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("conflicts %v\nwant %v", got, want)
	}
	if after := snapshot(t, src); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("something was written:\n%v\n%v", before, after)
	}
}

// Changes Apply never writes, whatever the target: links, setuid and
// setgid modes, paths out of the target or under .git, content that is
// not what the change names. Nothing is written.
func TestApplyRefuses(t *testing.T) {
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a\n"})
	good := func(p string) Change {
		data := []byte("x\n")
		return Change{Path: p, Kind: Added, New: &State{Type: TypeFile, Mode: 0o644, Size: 2, SHA256: sha256hex(data), Data: data}}
	}
	for _, tc := range []struct {
		name   string
		change func() Change
		reason string
	}{
		{"a link", func() Change {
			return Change{Path: "l", Kind: Added, New: &State{Type: TypeSymlink, Mode: 0o777, Target: "/etc/shadow"}}
		}, "a symbolic link"},
		{"setuid", func() Change { c := good("s"); c.New.Mode = 0o4755; return c }, "setuid or setgid"},
		{"setgid", func() Change { c := good("s"); c.New.Mode = 0o2755; return c }, "setuid or setgid"},
		{"dot-dot", func() Change { return good("../escape") }, "leaves the target"},
		{"absolute", func() Change { return good("/etc/escape") }, "leaves the target"},
		{"under .git", func() Change { return good(".git/hooks/pre-commit") }, "under .git"},
		{"under a nested .GIT", func() Change { return good("sub/.GIT/config") }, "under .git"},
		{"forged content", func() Change { c := good("f"); c.New.Data = []byte("y\n"); return c }, "sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, src)
			cs := &Changes{Changes: []Change{good("fine"), tc.change()}}
			_, err := Apply(context.Background(), src, cs, ApplyOptions{})
			var re *RefusedError
			if !errors.As(err, &re) || len(re.Conflicts) != 1 || !strings.Contains(re.Conflicts[0].Reason, tc.reason) {
				t.Fatalf("err %v, want a refusal: %s", err, tc.reason)
			}
			if after := snapshot(t, src); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Error("something was written")
			}
		})
	}
}

// Apply writes as the target's owner: a directory only root may write in
// is a conflict found before anything is written.
func TestApplyAsOwner(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a\n", "ro/f": "f\n"})
	chownTree(t, src, 4242)
	os.Chown(filepath.Join(src, "ro"), 0, 0)
	cs := jobChanges(t, src, func(sb string) {
		writeFiles(t, sb, map[string]string{"a": "a by the job\n", "ro/f": "f by the job\n", "ro/new": "new\n"})
	})
	before := snapshot(t, src)
	_, err := Apply(context.Background(), src, cs, ApplyOptions{})
	var ce *ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 2 || !strings.Contains(ce.Conflicts[0].Reason, "cannot write in ro/") {
		t.Fatalf("err %v, want ro/f and ro/new refused", err)
	}
	if after := snapshot(t, src); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("something was written")
	}
}
