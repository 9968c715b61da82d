//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/delegate-dev/delegate/internal/testnet"
)

// walkThroughMarker precedes the README's walk-through block.
const walkThroughMarker = "<!-- walk-through:"

// readmeWalkThrough returns the commands of the README's walk-through:
// the lines of the shell block after the marker that are not comments,
// each without its trailing comment.
func readmeWalkThrough(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), walkThroughMarker)
	if !ok {
		t.Fatalf("the README has no %q marker before its walk-through", walkThroughMarker)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, closed := strings.Cut(rest, "\n```")
	if !ok || !closed {
		t.Fatal("the README's walk-through marker is not followed by a ```sh block")
	}
	var cmds []string
	sc := bufio.NewScanner(strings.NewReader(block))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The walk-through's commands hold no '#' of their own: what
		// follows one is a comment saying what the command shows.
		if i := strings.Index(line, " #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		cmds = append(cmds, line)
	}
	return cmds
}

// A walkStep is what the test expects of a walk-through command: the
// command (a pattern of it, after ids and hosts are replaced), its exit
// code (-1: any but 0), what its output holds, and a check of its effects.
type walkStep struct {
	command string
	exit    int
	holds   []string
	after   func(t *testing.T, project string)
}

// TestReadmeWalkThrough runs every command of the README's walk-through
// (issue 40, item 8) through the built binary, in order, as a user would
// in a shell: a Python project whose test fails goes into a kept sandbox,
// is fixed there, and the fix is applied to the project; a job with an
// allowlist is refused a host outside it and the network log says so;
// and the `claude mcp add` line's server command answers MCP. What is not
// the user's machine is replaced, and only that: the README's example ids
// by the ids the commands before printed, example.com and example.org by
// the test internet's allowed.test and denied.test (test hosts have no
// internet), `/usr/local/bin/delegate` by the binary the tests built (the
// go build line is checked by that build: same source, same command), and
// ~ by a temporary home. A command the test does not know fails the test,
// so that a new line in the README comes with its check.
func TestReadmeWalkThrough(t *testing.T) {
	if !testnet.Isolate(t) {
		return
	}
	testnet.World(t)
	home := t.TempDir()
	project := filepath.Join(home, "src", "calc")
	writeCalcProject(t, project)
	bin := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(bin, "delegate")); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	env := append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn", "HOME="+home), "PATH="+bin+":"+os.Getenv("PATH"))

	steps := []walkStep{
		{command: `^delegate run --workspace \. --keep `, exit: 1, holds: []string{"AssertionError: -1 != 5", "kept sandbox sbx-"}},
		{command: `^delegate exec sbx-\w+ -- sed `},
		{command: `^delegate exec sbx-\w+ -- python3 -m unittest$`, holds: []string{"OK"}},
		{command: `^delegate jobs diff sbx-\w+$`, holds: []string{"-    return a - b", "+    return a + b"}},
		{command: `^delegate jobs apply sbx-\w+$`, holds: []string{"written calc.py"}, after: func(t *testing.T, project string) {
			if b, err := os.ReadFile(filepath.Join(project, "calc.py")); err != nil || !strings.Contains(string(b), "return a + b") {
				t.Fatalf("after jobs apply, calc.py in the project holds %q (%v), not the fix", b, err)
			}
		}},
		{command: `^delegate sandboxes release sbx-\w+$`, holds: []string{"released"}},
		{command: `^delegate run --network allowed\.test `, exit: -1, holds: []string{"403"}},
		{command: `^delegate jobs network job-\w+ --denied$`, holds: []string{"denied.test"}},
	}
	ids := map[string]*regexp.Regexp{"job-": regexp.MustCompile(`job-[a-z0-9]{16}`), "sbx-": regexp.MustCompile(`sbx-[a-z0-9]{16}`)}
	latest := map[string]string{}
	dir := home
	var sawBuild, sawClaude bool
	for _, line := range readmeWalkThrough(t) {
		switch {
		case strings.HasPrefix(line, "go build -o /usr/local/bin/delegate ./cmd/delegate"):
			sawBuild = true // TestMain built the binary from this source
			continue
		case strings.HasPrefix(line, "cd "):
			dir = strings.Replace(strings.TrimPrefix(line, "cd "), "~", home, 1)
			continue
		case strings.HasPrefix(line, "claude mcp add "):
			sawClaude = true
			checkClaudeServerCommand(t, line, env)
			continue
		}
		cmdLine := line
		for prefix, re := range ids {
			if latest[prefix] != "" {
				cmdLine = re.ReplaceAllString(cmdLine, latest[prefix])
			}
		}
		cmdLine = strings.NewReplacer("example.com", "allowed.test", "example.org", "denied.test").Replace(cmdLine)
		i := slices.IndexFunc(steps, func(s walkStep) bool { return regexp.MustCompile(s.command).MatchString(cmdLine) })
		if i < 0 {
			t.Fatalf("the README's walk-through has a command this test does not check: %s\n(add its check to TestReadmeWalkThrough)", line)
		}
		step := steps[i]
		steps = slices.Delete(steps, i, i+1)
		cmd := exec.CommandContext(testContext(t), "bash", "-c", cmdLine)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		code := exitCode(t, cmd)
		t.Logf("$ %s\n%s(exit %d)", cmdLine, out.String(), code)
		if (step.exit == -1 && code == 0) || (step.exit != -1 && code != step.exit) {
			t.Fatalf("%s: exit %d, the walk-through expects %d (-1: a failure)\n%s", cmdLine, code, step.exit, out.String())
		}
		for _, want := range step.holds {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("%s: the output lacks %q\n%s", cmdLine, want, out.String())
			}
		}
		if step.after != nil {
			step.after(t, project)
		}
		for prefix, re := range ids {
			if all := re.FindAllString(out.String(), -1); len(all) > 0 {
				latest[prefix] = all[0]
			}
		}
	}
	if len(steps) > 0 || !sawBuild || !sawClaude {
		t.Fatalf("the README's walk-through lacks commands the test checks: %d steps left (first %q), go build seen %v, claude mcp add seen %v",
			len(steps), append(steps, walkStep{})[0].command, sawBuild, sawClaude)
	}
}

// writeCalcProject makes the walk-through's project: a git work tree whose
// test fails (calc.py subtracts where test_calc.py expects a sum).
func writeCalcProject(t *testing.T, dir string) {
	t.Helper()
	files := map[string]string{
		"calc.py": "def add(a, b):\n    return a - b\n",
		"test_calc.py": "import unittest\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n" +
			"    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.name=t", "-c", "user.email=t@test", "commit", "-q", "-m", "calc"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// checkClaudeServerCommand runs the server command of a `claude mcp add …
// -- COMMAND` line (with the built binary for /usr/local/bin/delegate) as
// Claude Code would, over stdio, and checks that it answers MCP with
// submit_job among its tools.
func checkClaudeServerCommand(t *testing.T, line string, env []string) {
	t.Helper()
	_, server, ok := strings.Cut(line, " -- ")
	args := strings.Fields(server)
	if !ok || len(args) < 2 || args[0] != "/usr/local/bin/delegate" {
		t.Fatalf("the walk-through's claude line runs no /usr/local/bin/delegate command after --: %s", line)
	}
	cmd := exec.Command(binary, args[1:]...)
	cmd.Env = env
	client := mcp.NewClient(&mcp.Implementation{Name: "walk-through", Version: "1"}, nil)
	cs, err := client.Connect(testContext(t), &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil)
	if err != nil {
		t.Fatalf("%s: the server does not answer MCP: %v", server, err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(testContext(t), nil)
	if err != nil {
		t.Fatalf("%s: tools/list: %v", server, err)
	}
	if !slices.ContainsFunc(tools.Tools, func(tool *mcp.Tool) bool { return tool.Name == "submit_job" }) {
		t.Fatalf("%s: tools/list has no submit_job", server)
	}
}
