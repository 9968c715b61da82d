//go:build unix

package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCloneLocal: a repository on this machine, given as a path (its work
// tree, or a bare one), is cloned as an https one is, at a branch, a tag
// or a commit; its work tree's uncommitted files do not come; a .git file
// (a linked work tree) and a directory that is no repository are refused;
// its config (a hook path, an fsmonitor command) is never run.
func TestCloneLocal(t *testing.T) {
	root := t.TempDir()
	work, commits := servedRepo(t, root)
	marker := filepath.Join(root, "ran")
	git(t, work, "config", "core.fsmonitor", "touch "+marker)
	git(t, work, "config", "core.hooksPath", "/nonexistent")
	writeFiles(t, work, map[string]string{"uncommitted.txt": "not in a commit\n"})
	for _, tc := range []struct {
		name, url, ref, commit string
		shallow                bool
	}{
		{"a work tree's default branch", work, "", commits["main"], true},
		{"an annotated tag", work, "v1", commits["v1"], true},
		{"a branch of a bare repository", filepath.Join(root, "repo.git"), "dev", commits["dev"], true},
		{"a commit no ref names", work, commits["old"], commits["old"], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			commit, _, err := CheckRef(context.Background(), CloneOptions{URL: tc.url, Ref: tc.ref})
			if err != nil || (tc.ref != commits["old"] && commit != tc.commit) {
				t.Fatalf("CheckRef: %s %v, want %s", commit, err, tc.commit)
			}
			dir := t.TempDir()
			res, err := Clone(context.Background(), CloneOptions{URL: tc.url, Ref: tc.ref, Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if res.Commit != tc.commit || res.Shallow != tc.shallow {
				t.Errorf("cloned %+v, want %s (shallow %v)", res, tc.commit, tc.shallow)
			}
			// Depth 1 (the default) where a ref names the commit, as from
			// a remote: the one commit, its parents left out; with
			// Depth 2 its parent too.
			if n := strings.TrimSpace(git(t, dir, "rev-list", "--count", "HEAD")); tc.shallow && n != "1" {
				t.Errorf("%s commits of history, want 1", n)
			}
			if tc.shallow {
				deeper := t.TempDir()
				if _, err := Clone(context.Background(), CloneOptions{URL: tc.url, Ref: tc.ref, Dir: deeper, Depth: 2}); err != nil {
					t.Fatal(err)
				}
				if n := strings.TrimSpace(git(t, deeper, "rev-list", "--count", "HEAD")); n != "2" {
					t.Errorf("depth 2: %s commits of history", n)
				}
				if st := git(t, deeper, "fsck", "--connectivity-only"); st != "" {
					t.Errorf("git fsck in the depth-2 clone:\n%s", st)
				}
			}
			if got := strings.TrimSpace(git(t, dir, "rev-parse", "HEAD")); got != tc.commit {
				t.Errorf("HEAD is %s", got)
			}
			if st := git(t, dir, "status", "--porcelain"); st != "" {
				t.Errorf("git status in the clone:\n%s", st)
			}
			if _, err := os.Stat(filepath.Join(dir, "uncommitted.txt")); err == nil {
				t.Error("a file of the source's work tree that is in no commit came")
			}
		})
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the source's core.fsmonitor ran")
	}
	linked := filepath.Join(root, "linked")
	git(t, work, "worktree", "add", "-q", linked, "dev")
	for dir, want := range map[string]string{linked: "is not a directory (a linked work tree or a submodule)", t.TempDir(): "has no .git directory and is no bare repository"} {
		if _, _, err := CheckRef(context.Background(), CloneOptions{URL: dir}); !errors.Is(err, ErrNotRepository) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", dir, err, want)
		}
	}
}
