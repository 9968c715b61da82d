package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing/object"
)

// userState is what CommitBranch must not touch: HEAD, the index, the
// checked-out branch's ref and every file of the work tree.
func userState(t *testing.T, repo string) string {
	t.Helper()
	snap := snapshot(t, repo)
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(snap)) {
		v := snap[p]
		if strings.HasPrefix(p, "/.git/objects") || strings.HasPrefix(p, "/.git/refs/heads/delegate") || strings.HasPrefix(p, "/.git/logs") {
			continue
		}
		if p == "/.git/refs/heads" { // its directory's listing gains delegate/
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", p, v)
	}
	return b.String()
}

// The changes go to a new branch on the import's commit; HEAD, the index
// and the work tree (uncommitted and staged edits included) are left
// byte for byte; git log and git fsck are happy with what was written.
func TestCommitBranch(t *testing.T) {
	repo := newRepo(t, map[string]string{
		"main.go": "package main\n", "lib/a.go": "package lib\n", "lib/b.go": "package lib // b\n",
		"gone.txt": "gone\n", "keep/deep/x.txt": "x\n", "bin.dat": "\x00\x01",
	})
	// The user's work in progress: an edit, a staged file, an untracked one.
	writeFiles(t, repo, map[string]string{"main.go": "package main // wip\n", "staged.txt": "staged\n", "scratch.txt": "scratch\n"})
	git(t, repo, "add", "staged.txt")
	sandbox, base := importTree(t, repo, ScanOptions{})
	writeFiles(t, sandbox, map[string]string{
		"lib/a.go": "package lib // by the job\n", "new/pkg/n.go": "package pkg\n", "tool.sh": "#!/bin/sh\n",
		"link": "->lib/a.go", "bin.dat": "\x00\x02", "main.go": "package main // wip, then the job\n",
	})
	os.Chmod(filepath.Join(sandbox, "tool.sh"), 0o755)
	os.Remove(filepath.Join(sandbox, "gone.txt"))
	os.RemoveAll(filepath.Join(sandbox, "keep"))
	cs := readBack(t, sandbox, base, ChangesOptions{})

	before := userState(t, repo)
	when := time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)
	commit, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{
		Name: "delegate/job-1", Binary: true, Message: "delegate: job-1\n", Author: object.Signature{Name: "D", Email: "d@example.com", When: when},
	})
	if err != nil {
		t.Fatal(err)
	}
	if after := userState(t, repo); after != before {
		t.Errorf("the user's state changed:\n%s\n---\n%s", before, after)
	}
	if out := git(t, repo, "rev-parse", "delegate/job-1"); strings.TrimSpace(out) != commit {
		t.Errorf("delegate/job-1 is %s, want %s", out, commit)
	}
	log := git(t, repo, "log", "--format=%an <%ae> %aI %s", "delegate/job-1")
	if want := "D <d@example.com> 2026-02-03T04:05:06+00:00 delegate: job-1\nTest <test@example.com> 2026-01-02T03:04:05+00:00 first\n"; log != want {
		t.Errorf("git log:\n%s\nwant\n%s", log, want)
	}
	stat := git(t, repo, "diff", "--name-status", base.Head, "delegate/job-1")
	// Only the job's changes: the user's staged and untracked files,
	// which the job did not touch, stay out; main.go, which it edited,
	// carries the user's uncommitted edit too.
	want := "M\tbin.dat\nD\tgone.txt\nD\tkeep/deep/x.txt\nM\tlib/a.go\nA\tlink\nM\tmain.go\nA\tnew/pkg/n.go\nA\ttool.sh\n"
	if stat != want {
		t.Errorf("the branch's changes:\n%s\nwant\n%s", stat, want)
	}
	for p, want := range map[string]string{"lib/a.go": "package lib // by the job\n", "main.go": "package main // wip, then the job\n", "link": "lib/a.go"} {
		if got := git(t, repo, "show", "delegate/job-1:"+p); got != want {
			t.Errorf("%s on the branch: %q, want %q", p, got, want)
		}
	}
	if mode := git(t, repo, "ls-tree", "delegate/job-1", "tool.sh", "link"); !strings.Contains(mode, "100755 blob") || !strings.Contains(mode, "120000 blob") {
		t.Errorf("modes: %s", mode)
	}
	git(t, repo, "fsck", "--strict", "--no-dangling")

	// Again: the branch exists.
	if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/job-1", Binary: true}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("a second time: %v", err)
	}
}

// Objects are written as the repository's owner, so that the user's own
// git can still write beside them.
func TestCommitBranchAsOwner(t *testing.T) {
	needRoot(t)
	repo := newRepo(t, map[string]string{"a": "a\n"})
	chownTree(t, repo, 4242)
	// The directories above are root's alone (0700): the owner reaches
	// .git through the descriptor, not by its path.
	sandbox, base := importTree(t, repo, ScanOptions{})
	writeFiles(t, sandbox, map[string]string{"a": "a, new\n", "b/c": "c\n"})
	cs := readBack(t, sandbox, base, ChangesOptions{})
	if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/x"}); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(filepath.Join(repo, ".git"), func(p string, d fs.DirEntry, err error) error {
		fi, _ := os.Lstat(p)
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 4242 {
			t.Errorf("%s belongs to uid %d", p, uid)
		}
		return nil
	})
}

func TestCommitBranchBadInput(t *testing.T) {
	repo := newRepo(t, map[string]string{"a": "a\n"})
	_, base := importTree(t, repo, ScanOptions{})
	cs := &Changes{}
	for _, name := range []string{"", "../x", "a..b", "x.lock", "a b", "-/.hidden", "x/"} {
		if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: name}); err == nil || !strings.Contains(err.Error(), "not a valid branch name") {
			t.Errorf("branch %q: %v", name, err)
		}
	}
	plain := t.TempDir()
	writeFiles(t, plain, map[string]string{"a": "a\n"})
	_, pbase := importTree(t, plain, ScanOptions{})
	if _, err := CommitBranch(context.Background(), plain, pbase, cs, BranchOptions{Name: "delegate/x"}); !errors.Is(err, ErrNoBaseCommit) {
		t.Errorf("a plain directory: %v", err)
	}
	empty := t.TempDir()
	git(t, empty, "init", "-q")
	_, ebase := importTree(t, empty, ScanOptions{})
	if _, err := CommitBranch(context.Background(), empty, ebase, cs, BranchOptions{Name: "delegate/x"}); !errors.Is(err, ErrNoBaseCommit) {
		t.Errorf("a repository without commits: %v", err)
	}
}
