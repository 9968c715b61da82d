package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// gitDirs is a repository's work tree, its .git, an empty .GIT/hooks
// beside it (a real directory: on a case-folding filesystem it would be
// .git's), and a bare repository, all under one root.
func gitDirs(t *testing.T) (root, repo, bare string) {
	t.Helper()
	root = t.TempDir()
	repo = filepath.Join(root, "proj")
	os.MkdirAll(repo, 0o755)
	git(t, repo, "init", "-q", "-b", "main")
	writeFiles(t, repo, map[string]string{"a": "a\n"})
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "first")
	os.MkdirAll(filepath.Join(repo, ".GIT", "hooks"), 0o755)
	bare = filepath.Join(root, "served.git")
	git(t, root, "init", "-q", "--bare", bare)
	return root, repo, bare
}

// A source that is a git directory, or lies in one, is refused before
// anything is read: by a component's name (case-folded, and as HFS+ and
// NTFS would read it, whatever ".." follows) or by what it holds (a bare
// repository's HEAD, objects/ and refs/), itself or above it.
func TestScanRefusesGitDir(t *testing.T) {
	root, repo, bare := gitDirs(t)
	os.MkdirAll(filepath.Join(bare, "sub"), 0o755)
	hfs := filepath.Join(root, "hfs", ".g\u200cit")
	ntfs := filepath.Join(root, "ntfs", ".git. ")
	short := filepath.Join(root, "short", "GIT~1")
	for _, d := range []string{hfs, ntfs, short} {
		os.MkdirAll(d, 0o755)
	}
	for _, tc := range []struct{ name, dir string }{
		{"REPO/.git", filepath.Join(repo, ".git")},
		{"REPO/.git/hooks", filepath.Join(repo, ".git", "hooks")},
		{"REPO/.GIT/hooks", filepath.Join(repo, ".GIT", "hooks")},
		{"ROOT/proj/.git/../.git", repo + "/.git/../.git"},
		{"ROOT/proj/.git/..", repo + "/.git/.."},
		{"a bare repository", bare},
		{"in a bare repository", filepath.Join(bare, "sub")},
		{"HFS+ ignorables", hfs},
		{"NTFS trailing dot and space", ntfs},
		{"NTFS short name", short},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Scan(context.Background(), tc.dir, ScanOptions{Within: root})
			if !errors.Is(err, ErrGitDir) {
				t.Fatalf("Scan(%s): %v, want %v", tc.dir, err, ErrGitDir)
			}
		})
	}
	// The work tree itself is what a workspace is for.
	if _, err := Scan(context.Background(), repo, ScanOptions{Within: root}); err != nil {
		t.Errorf("the work tree: %v", err)
	}
}

// plantChanges are what a job in a .git directory would hand back:
// a hook and a configuration that runs a command on git status.
func plantChanges(t *testing.T) *Changes {
	t.Helper()
	hook := []byte("#!/bin/sh\ntouch planted-hook\n")
	conf := []byte("[core]\n\tfsmonitor = touch planted-fsmonitor\n")
	return &Changes{Changes: []Change{
		{Path: "hooks/pre-commit", Kind: Added, New: &State{Type: TypeFile, Mode: 0o755, Size: int64(len(hook)), SHA256: sha256hex(hook), Data: hook}},
		{Path: "config2", Kind: Added, New: &State{Type: TypeFile, Mode: 0o644, Size: int64(len(conf)), SHA256: sha256hex(conf), Data: conf}},
	}}
}

// An apply target, or a branch's, that is a git directory or lies in one
// is refused with nothing written, whatever the changes.
func TestApplyRefusesGitDirTarget(t *testing.T) {
	root, repo, bare := gitDirs(t)
	_, base := importTree(t, repo, ScanOptions{})
	for _, dir := range []string{filepath.Join(repo, ".git"), filepath.Join(repo, ".git", "hooks"), filepath.Join(repo, ".GIT"),
		repo + "/.git/../.git", bare, filepath.Join(bare, "refs")} {
		before := snapshot(t, root)
		if _, err := Apply(context.Background(), dir, plantChanges(t), ApplyOptions{}); !errors.Is(err, ErrGitDir) {
			t.Errorf("Apply to %s: %v, want %v", dir, err, ErrGitDir)
		}
		if _, err := CommitBranch(context.Background(), dir, base, plantChanges(t), BranchOptions{Name: "delegate/x"}); !errors.Is(err, ErrGitDir) {
			t.Errorf("CommitBranch in %s: %v, want %v", dir, err, ErrGitDir)
		}
		if after := snapshot(t, root); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("something was written for %s", dir)
		}
	}
	// Through a link: the path names no .git, the directory is one.
	link := filepath.Join(t.TempDir(), "innocent")
	os.Symlink(filepath.Join(repo, ".git"), link)
	if _, err := Apply(context.Background(), filepath.Join(link, "hooks"), plantChanges(t), ApplyOptions{}); !errors.Is(err, ErrGitDir) {
		t.Errorf("Apply through a link to .git: %v, want %v", err, ErrGitDir)
	}
}

// Changes that would make a directory of the target a repository as git
// sees one (HEAD, objects/ and refs/, from the changes or already there)
// are refused where they lie in it: git run there would read their config
// and hooks.
func TestApplyRefusesGitShapedChanges(t *testing.T) {
	_, repo, _ := gitDirs(t)
	_, base := importTree(t, repo, ScanOptions{})
	// A project that vendors a bare repository (a test fixture, not
	// committed: a checkout of the branch would write into it all the
	// same).
	git(t, repo, "init", "-q", "--bare", "testdata/fixture.git")
	file := func(p, content string) Change {
		data := []byte(content)
		return Change{Path: p, Kind: Added, New: &State{Type: TypeFile, Mode: 0o644, Size: int64(len(data)), SHA256: sha256hex(data), Data: data}}
	}
	for _, tc := range []struct {
		name    string
		changes []Change
		refused []string
	}{
		{"a bare repository made at the top", []Change{file("HEAD", "ref: refs/heads/main\n"), file("objects/info/x", ""), file("refs/heads/x", ""),
			file("config", "[core]\n\tfsmonitor = touch planted\n"), file("src/ok.go", "package ok\n")},
			[]string{"HEAD", "config", "objects/info/x", "refs/heads/x", "src/ok.go"}},
		{"a bare repository made below", []Change{file("sub/HEAD", "ref: refs/heads/main\n"), file("sub/objects/x", ""), file("sub/refs/x", ""),
			file("sub/hooks/post-checkout", "#!/bin/sh\n"), file("elsewhere", "fine\n")},
			[]string{"sub/HEAD", "sub/hooks/post-checkout", "sub/objects/x", "sub/refs/x"}},
		{"a hook of a vendored bare repository", []Change{file("testdata/fixture.git/hooks/post-checkout", "#!/bin/sh\ntouch planted\n"), file("b", "fine\n")},
			[]string{"testdata/fixture.git/hooks/post-checkout"}},
		{"HEAD and refs only", []Change{file("d/HEAD", "x"), file("d/refs/x", ""), file("d/config", "")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, repo)
			refused := func(what string, err error) {
				t.Helper()
				var re *RefusedError
				if !errors.As(err, &re) {
					t.Fatalf("%s: %v, want a refusal", what, err)
				}
				var got []string
				for _, c := range re.Conflicts {
					got = append(got, c.Path)
					if !strings.Contains(c.Reason, "git") {
						t.Errorf("%s: %s: reason %q", what, c.Path, c.Reason)
					}
				}
				sort.Strings(got)
				if fmt.Sprint(got) != fmt.Sprint(tc.refused) {
					t.Errorf("%s refused %q, want %q", what, got, tc.refused)
				}
			}
			cs := &Changes{Changes: tc.changes}
			if tc.refused == nil {
				if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/fine"}); err != nil {
					t.Fatalf("CommitBranch: %v", err)
				}
				if _, err := Apply(context.Background(), repo, cs, ApplyOptions{}); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				os.RemoveAll(filepath.Join(repo, "d"))
				return
			}
			_, err := Apply(context.Background(), repo, cs, ApplyOptions{})
			refused("Apply", err)
			_, err = CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/x"})
			refused("CommitBranch", err)
			if after := snapshot(t, repo); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Error("something was written")
			}
		})
	}
}
