package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The second hour (issue 40) through the built binary: the loop of a kept
// sandbox and its project, applied more than once, with the ids it needs
// printed where they are needed.

var keptSandbox = regexp.MustCompile(`delegate: kept sandbox (sbx-[a-z0-9]+): 'delegate exec `)

// TestApplyTwiceFromSandbox: run --keep prints the sandbox's id; its
// changes are applied by that id; a later command's changes are applied
// over the first apply (item 1: "changed in the target since the import"
// before), diffed from it, and only what someone else changed in the
// target is a conflict. jobs list and jobs status say each job's sandbox,
// and the two list commands print one JSON shape (item 2).
func TestApplyTwiceFromSandbox(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	dataDir := t.TempDir()
	cli := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, code := delegateCLI(t, dataDir, args...)
		if code != 0 {
			t.Fatalf("delegate %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out, errOut
	}
	_, errOut := cli("run", "-q", "--keep", "--workspace", dir, "--script", "sed -i 's/a - b/a + b/' calc.go")
	m := keptSandbox.FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("run --keep does not print the sandbox's id: %q", errOut)
	}
	sbx := m[1]
	t.Cleanup(func() { delegateCLI(t, dataDir, "sandboxes", "release", sbx) })
	maker := newestJob(t, dataDir)
	if out, _ := cli("jobs", "status", maker); !regexp.MustCompile(`sandbox\s+` + sbx + ` \(made by this job\)`).MatchString(out) {
		t.Errorf("jobs status does not say the job's sandbox:\n%s", out)
	}

	out, errOut := cli("jobs", "apply", sbx)
	if out != "written calc.go\n" || !strings.Contains(errOut, sbx+": the changes of its latest command that has ended, "+maker) {
		t.Fatalf("the first apply, by the sandbox's id: %q %s", out, errOut)
	}
	// A second command: calc.go further, a new file, README deleted.
	cli("exec", sbx, "--", "sh", "-c", "echo '// two' >> calc.go && echo two > TWO && rm README")
	second := newestJob(t, dataDir)
	if out, _ := cli("jobs", "status", second); !regexp.MustCompile(`sandbox\s+` + sbx + ` \(a command in it\)`).MatchString(out) {
		t.Errorf("jobs status of a command does not say its sandbox:\n%s", out)
	}
	list, _ := cli("jobs", "list")
	for _, id := range []string{maker, second} {
		if !regexp.MustCompile(id + `\s+success\s+0\s+` + sbx).MatchString(list) {
			t.Errorf("jobs list does not show %s's sandbox:\n%s", id, list)
		}
	}
	// The diff of the sandbox: since the first apply.
	diff, errOut := cli("jobs", "diff", sbx)
	if !strings.Contains(diff, "+// two") || strings.Contains(diff, "a - b") || !strings.Contains(diff, "+two") || !strings.Contains(diff, "deleted file") ||
		!strings.Contains(errOut, "the changes since those of "+maker+" were applied to "+dir) {
		t.Errorf("jobs diff %s after an apply:\n%s%s", sbx, diff, errOut)
	}
	out, errOut = cli("jobs", "apply", sbx)
	if out != "written TWO\nwritten calc.go\ndeleted README\n" || !strings.Contains(errOut, "from what "+maker+" wrote there") {
		t.Fatalf("the second apply: %q %s", out, errOut)
	}
	calc, _ := os.ReadFile(filepath.Join(dir, "calc.go"))
	if !strings.Contains(string(calc), "a + b") || !strings.HasSuffix(string(calc), "// two\n") {
		t.Errorf("calc.go after two applies:\n%s", calc)
	}
	// Once more: nothing to write.
	if out, errOut := cli("jobs", "apply", sbx); out != "" || !strings.Contains(errOut, "nothing to write") {
		t.Errorf("the same changes again: %q %s", out, errOut)
	}

	// Someone else edits calc.go; a third command too: that is a conflict,
	// and nothing is written.
	os.WriteFile(filepath.Join(dir, "calc.go"), append(calc, "// mine\n"...), 0o644)
	cli("exec", sbx, "--", "sh", "-c", "echo '// three' >> calc.go && echo three > THREE")
	_, errOut, code := delegateCLI(t, dataDir, "jobs", "apply", sbx)
	if code != 1 || !strings.Contains(errOut, "nothing written: 1 file changed here since the changes of "+second+" were applied:\n  calc.go: ") {
		t.Errorf("apply over someone else's edit: %d %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "THREE")); err == nil {
		t.Error("a conflicting apply wrote THREE")
	}

	// The two lists, one shape: an object naming its list.
	for _, args := range [][]string{{"jobs", "list", "--json"}, {"sandboxes", "list", "--json"}} {
		out, _ := cli(args...)
		var page map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &page); err != nil || page[args[0]] == nil {
			t.Errorf("%s: not an object with %q: %v\n%s", strings.Join(args, " "), args[0], err, out)
		}
		if !strings.Contains(out, `"sandbox_id": "`+sbx+`"`) {
			t.Errorf("%s does not name the sandbox as sandbox_id:\n%s", strings.Join(args, " "), out)
		}
	}
}
