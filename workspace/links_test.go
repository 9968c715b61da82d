package workspace

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// CommitBranch refuses a symbolic link whose target leaves the work tree
// (absolute, or climbing out), enters a .git, or goes through another
// link (issue 34, item 8): checking the branch out would make it. A link
// that stays inside is committed.
func TestCommitBranchRefusesEscapingLinks(t *testing.T) {
	repo := newRepo(t, map[string]string{"a.txt": "a\n", "sub/b.txt": "b\n", "out": "->/tmp"})
	_, base := importTree(t, repo, ScanOptions{})
	link := func(p, target string) Change {
		return Change{Path: p, Kind: Added, New: &State{Type: TypeSymlink, Mode: 0o777, Target: target}}
	}
	for _, tc := range []struct {
		name    string
		changes []Change
		refused []string
	}{
		{"inside", []Change{link("ok", "a.txt"), link("sub/ok", "../a.txt"), link("sub/here", "./b.txt"), link("dir", "sub")}, nil},
		{"absolute", []Change{link("ok", "a.txt"), link("abs", "/etc/passwd")}, []string{"abs"}},
		{"climbing out", []Change{link("up", "../x"), link("sub/up", "../../x"), link("sub/deep", "b/../../../x")}, []string{"sub/deep", "sub/up", "up"}},
		{"into .git", []Change{link("g", ".git/config"), link("sub/g", "../.GIT/hooks")}, []string{"g", "sub/g"}},
		{"through a link", []Change{link("esc", "/etc"), link("through", "esc/passwd"), link("old", "out/x")}, []string{"esc", "old", "through"}},
		{"empty", []Change{link("e", "")}, []string{"e"}},
		{"a link to the top, then up", []Change{link("top", "."), link("sub/top", ".."), link("x", "top/.."), link("sub/y", "top/../..")}, []string{"sub/y", "x"}},
		{"a loop", []Change{link("l1", "l2"), link("l2", "l1/x")}, []string{"l1", "l2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CommitBranch(context.Background(), repo, base, &Changes{Changes: tc.changes}, BranchOptions{Name: "delegate/" + strings.ReplaceAll(tc.name, " ", "-")})
			if tc.refused == nil {
				if err != nil {
					t.Fatalf("CommitBranch: %v", err)
				}
				return
			}
			var re *RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("CommitBranch: %v, want a refusal", err)
			}
			var got []string
			for _, c := range re.Conflicts {
				got = append(got, c.Path)
				if !strings.Contains(c.Reason, "link") {
					t.Errorf("%s: %q", c.Path, c.Reason)
				}
			}
			sort.Strings(got)
			if fmt.Sprint(got) != fmt.Sprint(tc.refused) {
				t.Errorf("refused %q, want %q", got, tc.refused)
			}
			if out, _ := gitTry(t, repo, "branch", "--list", "delegate/*"); strings.Contains(out, strings.ReplaceAll(tc.name, " ", "-")) {
				t.Errorf("the branch was made: %s", out)
			}
		})
	}
}
