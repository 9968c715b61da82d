//go:build linux

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tryNFixesMarker precedes the README's "try N fixes, keep the best"
// block.
const tryNFixesMarker = "<!-- try-n-fixes:"

// TestReadmeTryNFixes runs the README's "try N fixes, keep the best" block
// (issue 38) through the built binary, as one shell script in the
// walk-through's project (its test failing): a kept sandbox with the
// project, a checkpoint, three forks of it, a different fix in each, the
// one whose test passes applied to the project, every sandbox released.
// Only the binary's path is the test's.
func TestReadmeTryNFixes(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), tryNFixesMarker)
	if ok {
		_, rest, ok = strings.Cut(rest, "```sh\n")
	}
	script, _, closed := strings.Cut(rest, "\n```")
	if !ok || !closed {
		t.Fatalf("the README has no %q marker followed by a ```sh block", tryNFixesMarker)
	}
	home := t.TempDir()
	project := filepath.Join(home, "src", "calc")
	writeCalcProject(t, project)
	bin := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(bin, "delegate")); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	env := append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn", "HOME="+home), "PATH="+bin+":"+os.Getenv("PATH"))
	cmd := exec.CommandContext(testContext(t), "bash", "-e", "-c", script)
	cmd.Dir, cmd.Env = project, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	code := exitCode(t, cmd)
	t.Logf("%s\n%s(exit %d)", script, out.String(), code)
	if code != 0 {
		t.Fatalf("the block failed: exit %d", code)
	}
	if got, err := os.ReadFile(filepath.Join(project, "calc.py")); err != nil || !strings.Contains(string(got), "return a + b") {
		t.Errorf("calc.py in the project after the block: %q %v, want the fix that passed (a + b)", got, err)
	}
	if n := strings.Count(out.String(), " released\n"); n != 4 {
		t.Errorf("%d sandboxes released, want 4 (three forks and the source)", n)
	}
	list, errOut, code := delegateCLI(t, dataDir, "sandboxes", "list", "--json")
	if code != 0 {
		t.Fatalf("sandboxes list: %d %s", code, errOut)
	}
	if strings.Contains(list, "sbx-") {
		t.Errorf("sandboxes left after the block: %s", list)
	}
}
