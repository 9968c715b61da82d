package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// plantScript is a job that plants, in whatever directory it was given, a
// pre-commit hook and a configuration whose fsmonitor runs on git status:
// each leaves a marker file on the host when git runs it.
func plantScript(markers string) string {
	return `set -e
mkdir -p hooks
printf '#!/bin/sh\ntouch ` + markers + `/hook\n' > hooks/pre-commit
chmod 0755 hooks/pre-commit
cp hooks/pre-commit pre-commit
printf '[core]\n\tfsmonitor = "touch ` + markers + `/fsmonitor"\n' >> config`
}

// noPlanted runs git status and git commit in repo as its owner would and
// fails when a planted hook or fsmonitor ran.
func noPlanted(t *testing.T, repo, markers string) {
	t.Helper()
	gitIn(t, repo, "status")
	gitIn(t, repo, "commit", "-q", "--allow-empty", "-m", "after the jobs")
	for _, m := range []string{"hook", "fsmonitor"} {
		if _, err := os.Stat(filepath.Join(markers, m)); err == nil {
			t.Errorf("git ran the planted %s", m)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, ".git", "hooks", "pre-commit")); err == nil {
		t.Errorf("a pre-commit hook was planted in %s/.git/hooks", repo)
	}
}

// gitDirSources are sources that are, or lie in, a git directory: REPO/.git,
// REPO/.git/hooks, REPO/.GIT/hooks (a real directory: on a case-folding
// filesystem it is .git's), ROOT/calc/.git/../.git and a bare repository.
func gitDirSources(t *testing.T, root, repo string) []string {
	t.Helper()
	os.MkdirAll(filepath.Join(repo, ".GIT", "hooks"), 0o755)
	bare := filepath.Join(root, "served.git")
	gitIn(t, root, "init", "-q", "--bare", bare)
	return []string{filepath.Join(repo, ".git"), filepath.Join(repo, ".git", "hooks"), filepath.Join(repo, ".GIT", "hooks"),
		repo + "/.git/../.git", bare, filepath.Join(bare, "hooks")}
}

// TestWorkspaceGitDirCLI (issue 34, item 1): `delegate run --workspace`
// refuses a source that is or lies in a git directory, `jobs apply`
// refuses a target (--to, --branch) in one, and git in the repository
// then runs nothing a job planted.
func TestWorkspaceGitDirCLI(t *testing.T) {
	root := t.TempDir()
	repo := calcProject(t, root)
	markers := t.TempDir()
	dataDir := t.TempDir()
	for _, src := range gitDirSources(t, root, repo) {
		_, errOut, code := delegateCLI(t, dataDir, "run", "-q", "--workspace", src, "--script", plantScript(markers))
		if code == 0 {
			t.Errorf("run --workspace %s: accepted", src)
			// What the operator would do next.
			delegateCLI(t, dataDir, "jobs", "apply", newestJob(t, dataDir))
			continue
		}
		if !strings.Contains(errOut, "git directory") {
			t.Errorf("run --workspace %s: exit %d, %s", src, code, errOut)
		}
	}
	// A job on the work tree itself is fine; its changes go nowhere near a
	// .git, whatever --to or --branch says.
	_, errOut, code := delegateCLI(t, dataDir, "run", "-q", "--workspace", repo, "--script", "mkdir -p hooks && printf '#!/bin/sh\\ntouch "+markers+"/hook\\n' > hooks/pre-commit && chmod 0755 hooks/pre-commit")
	if code != 0 {
		t.Fatalf("run --workspace %s: exit %d, %s", repo, code, errOut)
	}
	job := newestJob(t, dataDir)
	bare := filepath.Join(root, "served.git")
	for _, args := range [][]string{
		{"--to", filepath.Join(repo, ".git")},
		{"--to", filepath.Join(repo, ".git"), "--branch"},
		{"--to", filepath.Join(repo, ".git", "hooks")},
		{"--to", filepath.Join(repo, ".git", "hooks"), "--branch"},
		{"--to", repo + "/.git/../.git"},
		{"--to", bare},
		{"--to", bare, "--branch"},
	} {
		out, errOut, code := delegateCLI(t, dataDir, append([]string{"jobs", "apply", job}, args...)...)
		if code == 0 || !strings.Contains(errOut, "git directory") {
			t.Errorf("jobs apply %v: exit %d, %q %s", args, code, out, errOut)
		}
	}
	noPlanted(t, repo, markers)
}

// TestWorkspaceGitDirMCP (issue 34, item 1): over MCP with
// DELEGATE_WORKSPACE_ROOTS, the same sources are field errors of
// manifest.workspace.dir, and no job is stored.
func TestWorkspaceGitDirMCP(t *testing.T) {
	root := t.TempDir()
	repo := calcProject(t, root)
	markers := t.TempDir()
	dataDir := t.TempDir()
	cs, _, _ := stdioSession(t, dataDir, "", "DELEGATE_WORKSPACE_ROOTS="+root)
	for _, src := range gitDirSources(t, root, repo) {
		res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "submit_job", Arguments: map[string]any{"manifest": map[string]any{
			"task": plantScript(markers), "workspace": map[string]any{"dir": src}}}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			t.Errorf("submit_job with workspace.dir %s: accepted: %s", src, text(res))
			var sub submitOut
			if b, ok := res.StructuredContent.(map[string]any); ok {
				sub.JobID, _ = b["job_id"].(string)
			}
			if sub.JobID != "" {
				call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 50})
				delegateCLI(t, dataDir, "jobs", "apply", sub.JobID) // what the operator would do next
			}
			continue
		}
		if msg := text(res); !strings.Contains(msg, "manifest.workspace.dir: ") || !strings.Contains(msg, "git directory") {
			t.Errorf("submit_job with workspace.dir %s: %s", src, msg)
		}
	}
	if n := len(call[listOut](t, cs, "list_jobs", map[string]any{}).Jobs); n != 0 {
		t.Errorf("%d jobs stored", n)
	}
	noPlanted(t, repo, markers)
}
