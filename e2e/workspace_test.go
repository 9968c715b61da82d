package e2e

import (
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Workspaces (issue 18) through the built binary: a project in and the
// job's changes out, over MCP (the Go SDK's client) and the CLI.

// changesOut is get_job_result's changes.
type changesOut struct {
	Added, Modified, Deleted int
	IgnoredAdded             int `json:"ignored_added"`
	Error                    string
	Files                    []struct {
		Path, Kind string
		Size       int64
	}
}

type wsResult struct {
	Status   string      `json:"status"`
	ExitCode *int        `json:"exit_code"`
	Output   string      `json:"output"`
	Stderr   string      `json:"stderr"`
	Error    string      `json:"error"`
	Changes  *changesOut `json:"changes"`
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
		"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// calcProject is a git work tree with a bug, an ignored build output and
// an untracked note, under root.
func calcProject(t *testing.T, root string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := filepath.Join(root, "calc")
	writeTree(t, dir, map[string]string{
		"go.mod":       "module example.com/calc\n\ngo 1.22\n",
		"calc.go":      "package calc\n\nfunc Add(a, b int) int { return a - b }\n",
		"calc_test.go": "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatalf(\"Add(2, 3) = %d\", Add(2, 3))\n\t}\n}\n",
		"README":       "calc\n",
		".gitignore":   "build/\n",
		"build/old":    "an old build\n",
	})
	gitIn(t, dir, "init", "-q")
	gitIn(t, dir, "add", "go.mod", "calc.go", "calc_test.go", "README", ".gitignore")
	gitIn(t, dir, "commit", "-qm", "first")
	writeTree(t, dir, map[string]string{"NOTES": "untracked, not ignored\n"})
	return dir
}

// fixScript is a job that fixes the bug, adds a file, removes one and
// builds (the build output is ignored), after showing what came in.
const fixScript = `set -e
ls -A | tr '\n' ' '; echo
test -e build/old && echo "ignored came" || echo "ignored left out"
git status --porcelain
sed -i 's/a - b/a + b/' calc.go
echo 'fixed Add' > CHANGES
rm README
mkdir -p build && echo bin > build/calc
echo "home=$HOME"`

func readResource(t *testing.T, cs *mcp.ClientSession, uri string) string {
	t.Helper()
	res, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	var b strings.Builder
	for _, c := range res.Contents {
		b.WriteString(c.Text)
	}
	return b.String()
}

// TestWorkspaceOverMCP: a git work tree comes in as git sees it (its
// ignored files left out, or asked for), with .git so that git works
// inside, HOME out of /workspace; the result lists what the job changed,
// job://{id}/diff shows it and job://{id}/patch is what git apply takes in
// the source. Every bad source is a tool error naming the field and the
// rule, and stores nothing.
func TestWorkspaceOverMCP(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	many := filepath.Join(root, "many")
	for i := range 120 {
		writeTree(t, many, map[string]string{fmt.Sprintf("f%02d", i): "x"})
	}
	os.Symlink(dir, filepath.Join(root, "link"))
	outside := t.TempDir()
	cs, _, _ := stdioSession(t, t.TempDir(), "", "DELEGATE_WORKSPACE_ROOTS="+root, "DELEGATE_WORKSPACE_MAX_FILES=100")

	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": fixScript, "workspace": map[string]any{"dir": dir}, "statusMode": "detailed"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 50})
	res := call[wsResult](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Status != "success" {
		t.Fatalf("job: %+v", res)
	}
	for _, want := range []string{".git .gitignore NOTES README calc.go calc_test.go go.mod \n", "ignored left out\n", "home=/tmp\n"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("the job's output lacks %q:\n%s", want, res.Output)
		}
	}
	if strings.Contains(res.Output, " M ") || !strings.Contains(res.Output, "?? NOTES\n") {
		t.Errorf("git status inside: want only NOTES untracked:\n%s", res.Output)
	}
	c := res.Changes
	if c == nil || c.Added != 1 || c.Modified != 1 || c.Deleted != 1 || c.IgnoredAdded != 1 {
		t.Fatalf("changes %+v", c)
	}
	var files []string
	for _, f := range c.Files {
		files = append(files, f.Kind+" "+f.Path)
	}
	if want := []string{"added CHANGES", "deleted README", "modified calc.go"}; !slices.Equal(files, want) {
		t.Errorf("changed files %q, want %q", files, want)
	}
	diff := readResource(t, cs, "job://"+sub.JobID+"/diff")
	if !strings.Contains(diff, "-func Add(a, b int) int { return a - b }\n+func Add(a, b int) int { return a + b }\n") ||
		!strings.Contains(diff, "--- a/README\n+++ /dev/null") {
		t.Errorf("job://…/diff:\n%s", diff)
	}
	if d := readResource(t, cs, "job://"+sub.JobID+"/diff?offset=0"); d != diff {
		t.Errorf("the diff from offset 0 differs from the diff")
	}
	patch := readResource(t, cs, "job://"+sub.JobID+"/patch")
	pf := filepath.Join(t.TempDir(), "job.patch")
	os.WriteFile(pf, []byte(patch), 0o644)
	gitIn(t, dir, "apply", "--check", pf)
	// Timeline: the copy as a provisioning step.
	st := call[struct {
		Timeline []struct{ Message string } `json:"timeline"`
	}](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID})
	said := ""
	for _, e := range st.Timeline {
		said += e.Message + "\n"
	}
	if !regexp.MustCompile(`copying workspace \(\d+ files, 0\.0 MB\)\n`).MatchString(said) || !strings.Contains(said, "changes: 1 added, 1 modified, 1 deleted") {
		t.Errorf("timeline:\n%s", said)
	}

	// Ignored files, asked for.
	withIgnored := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": "cat build/old; rm build/old", "workspace": map[string]any{"dir": dir, "includeIgnored": true}}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": withIgnored.JobID, "timeout_seconds": 50})
	res = call[wsResult](t, cs, "get_job_result", map[string]any{"job_id": withIgnored.JobID})
	if res.Output != "an old build\n" || res.Changes == nil || res.Changes.Deleted != 1 || res.Changes.Files[0].Path != "build/old" {
		t.Errorf("with ignored files: %+v %+v", res, res.Changes)
	}

	// Bad sources: a field error each, and nothing stored.
	before := len(call[listOut](t, cs, "list_jobs", map[string]any{}).Jobs)
	for _, tc := range []struct {
		ws   map[string]any
		want string
	}{
		{map[string]any{"dir": "calc"}, "manifest.workspace.dir: must be an absolute path"},
		{map[string]any{"dir": outside}, "manifest.workspace.dir: " + outside + " is not under an allowed root (DELEGATE_WORKSPACE_ROOTS: " + root + ")"},
		{map[string]any{"dir": filepath.Join(root, "nope")}, "manifest.workspace.dir: does not exist"},
		{map[string]any{"dir": filepath.Join(dir, "calc.go")}, "manifest.workspace.dir: "},
		{map[string]any{"dir": filepath.Join(root, "link")}, "symbolic link"},
		{map[string]any{"dir": many}, "over the cap of 100 (DELEGATE_WORKSPACE_MAX_FILES)"},
		{map[string]any{"git": "http://example.com/x.git"}, "manifest.workspace.git: must be an https URL or the absolute path of a repository under an allowed root"},
		{map[string]any{"git": "https://127.0.0.1/x.git"}, "manifest.workspace.git: "},
		{map[string]any{"dir": dir, "ref": "main"}, "manifest.workspace.ref: is for a git source"},
	} {
		msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": tc.ws}})
		if !strings.Contains(msg, tc.want) {
			t.Errorf("workspace %v: %q, want %q", tc.ws, msg, tc.want)
		}
	}
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"dir": dir},
		"files": []map[string]any{{"path": "calc.go", "content": "eA=="}}}}); !strings.Contains(msg, "manifest.files[0].path: calc.go is also in the workspace source") {
		t.Errorf("a file over the project's: %q", msg)
	}
	if after := len(call[listOut](t, cs, "list_jobs", map[string]any{}).Jobs); after != before {
		t.Errorf("bad submissions stored jobs: %d, then %d", before, after)
	}
}

// TestWorkspaceDirOff: without DELEGATE_WORKSPACE_ROOTS a dir source is
// refused naming the setting, and a root that is / or holds the data dir
// stops the server at start.
func TestWorkspaceDirOff(t *testing.T) {
	root := t.TempDir()
	cs, _, _ := stdioSession(t, t.TempDir(), "")
	msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"dir": root}}})
	if !strings.Contains(msg, "manifest.workspace.dir: directories are not allowed on this server") || !strings.Contains(msg, "DELEGATE_WORKSPACE_ROOTS") {
		t.Errorf("dir source without roots: %q", msg)
	}
	dataDir := t.TempDir()
	for _, roots := range []string{"/", filepath.Dir(dataDir)} {
		_, errOut, code := delegateCLIEnv(t, dataDir, []string{"DELEGATE_WORKSPACE_ROOTS=" + roots}, "serve")
		if code != 2 || !strings.Contains(errOut, "DELEGATE_WORKSPACE_ROOTS") {
			t.Errorf("serve with roots %s: exit %d, %s", roots, code, errOut)
		}
	}
}

// TestWorkspaceCLI: delegate run --workspace, jobs diff, jobs apply into
// the source (a conflict lists the files and writes nothing; a link the
// job made is refused), and --branch, which leaves the work tree, the
// index and HEAD alone.
func TestWorkspaceCLI(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	dataDir := t.TempDir()
	_, errOut, code := delegateCLI(t, dataDir, "run", "-q", "--workspace", dir, "--script", fixScript)
	if code != 0 {
		t.Fatalf("run: exit %d: %s", code, errOut)
	}
	fix := newestJob(t, dataDir)
	// Without -q, run says what the job changed.
	_, errOut, _ = delegateCLI(t, dataDir, "run", "--workspace", dir, "--script", "echo more >> calc.go")
	if !strings.Contains(errOut, "the job changed 1 file (0 added, 1 modified, 0 deleted): 'delegate jobs diff") {
		t.Errorf("run does not say what the job changed: %s", errOut)
	}
	diff, _, code := delegateCLI(t, dataDir, "jobs", "diff", fix)
	if code != 0 || !strings.Contains(diff, "+func Add(a, b int) int { return a + b }") {
		t.Fatalf("jobs diff: %d\n%s", code, diff)
	}
	patch, _, _ := delegateCLI(t, dataDir, "jobs", "diff", fix, "--patch")
	if !strings.HasPrefix(patch, "diff --git a/CHANGES b/CHANGES\nnew file mode 100644\n") {
		t.Errorf("jobs diff --patch:\n%s", patch)
	}

	// --branch: a commit on a new branch, nothing else touched.
	head := gitIn(t, dir, "rev-parse", "HEAD")
	out, errOut, code := delegateCLI(t, dataDir, "jobs", "apply", fix, "--branch")
	if code != 0 || !strings.HasPrefix(out, "delegate/"+fix+" ") {
		t.Fatalf("apply --branch: %d %q %s", code, out, errOut)
	}
	if gitIn(t, dir, "rev-parse", "HEAD") != head || gitIn(t, dir, "status", "--porcelain") != "?? NOTES\n" {
		t.Errorf("--branch touched HEAD or the work tree: %s", gitIn(t, dir, "status", "--porcelain"))
	}
	if got := gitIn(t, dir, "diff", "--stat", "HEAD", "delegate/"+fix); !strings.Contains(got, "3 files changed") {
		t.Errorf("the branch holds: %s", got)
	}
	if got := gitIn(t, dir, "show", "delegate/"+fix+":calc.go"); !strings.Contains(got, "a + b") {
		t.Errorf("the branch's calc.go: %s", got)
	}

	// A conflict: calc.go was edited here since the import.
	orig, _ := os.ReadFile(filepath.Join(dir, "calc.go"))
	os.WriteFile(filepath.Join(dir, "calc.go"), append(orig, "// mine\n"...), 0o644)
	_, errOut, code = delegateCLI(t, dataDir, "jobs", "apply", fix)
	if code != 1 || !strings.Contains(errOut, "nothing written: 1 file changed here since the import:\n  calc.go: ") {
		t.Errorf("apply over an edit: %d %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "CHANGES")); err == nil {
		t.Error("a conflicting apply wrote CHANGES")
	}
	// Clean: written.
	os.WriteFile(filepath.Join(dir, "calc.go"), orig, 0o644)
	out, errOut, code = delegateCLI(t, dataDir, "jobs", "apply", fix)
	if code != 0 || out != "written CHANGES\nwritten calc.go\ndeleted README\n" {
		t.Fatalf("apply: %d %q %s", code, out, errOut)
	}
	if got := gitIn(t, dir, "status", "--porcelain"); got != " D README\n M calc.go\n?? CHANGES\n?? NOTES\n" {
		t.Errorf("after apply, git status:\n%s", got)
	}
	// Into another copy.
	other := filepath.Join(t.TempDir(), "copy")
	gitIn(t, root, "clone", "-q", dir, other)
	if _, errOut, code := delegateCLI(t, dataDir, "jobs", "apply", fix, "--to", other); code != 0 {
		t.Errorf("apply --to: %d %s", code, errOut)
	}

	// A job that plants a link: refused, nothing written.
	gitIn(t, dir, "checkout", "-q", "--", ".")
	_, errOut, _ = delegateCLI(t, dataDir, "run", "-q", "--workspace", dir, "--script", "ln -s /etc/passwd evil; echo x > plain")
	evil := newestJob(t, dataDir)
	_, errOut, code = delegateCLI(t, dataDir, "jobs", "apply", evil)
	if code != 1 || !strings.Contains(errOut, "nothing written") || !strings.Contains(errOut, "evil") {
		t.Errorf("apply of a link: %d %s", code, errOut)
	}
	for _, p := range []string{"evil", "plain"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
			t.Errorf("a refused apply wrote %s", p)
		}
	}
}

// gitServer serves the bare repositories under root over https with
// Debian's git-http-backend (in the test only: delegate runs no git).
func gitServer(t *testing.T, root string) *httptest.Server {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		t.Skip("git-http-backend is not installed")
	}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + root},
		Stderr: io.Discard, Logger: log.New(io.Discard, "", 0)}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestWorkspaceGitSource: a git source is cloned on the server's side at
// the ref asked for (a branch that is not the default), over https from
// an address the operator allows; an unknown ref is a field error; the
// changes apply to a checkout with --to.
func TestWorkspaceGitSource(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	gitIn(t, dir, "checkout", "-q", "-b", "feature")
	writeTree(t, dir, map[string]string{"feature.txt": "only on the branch\n"})
	gitIn(t, dir, "add", "feature.txt")
	gitIn(t, dir, "commit", "-qm", "feature")
	gitIn(t, dir, "checkout", "-q", "main")
	served := t.TempDir()
	gitIn(t, served, "clone", "-q", "--bare", dir, "calc.git")
	srv := gitServer(t, served)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	url := srv.URL + "/calc.git"
	env := []string{"SSL_CERT_FILE=" + ca, "DELEGATE_WORKSPACE_GIT_ALLOW=127.0.0.1/32"}

	// Without the operator's allowance, loopback is refused at submission.
	cs0, _, _ := stdioSession(t, t.TempDir(), "", "SSL_CERT_FILE="+ca)
	if msg := callErr(t, cs0, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"git": url}}}); !strings.Contains(msg, "manifest.workspace.git: ") || !strings.Contains(msg, "refused") {
		t.Errorf("a loopback git server without DELEGATE_WORKSPACE_GIT_ALLOW: %q", msg)
	}

	dataDir := t.TempDir()
	cs, _, _ := stdioSession(t, dataDir, "", env...)
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"git": url, "ref": "nope"}}}); !strings.Contains(msg, "manifest.workspace.ref: ") {
		t.Errorf("an unknown ref: %q", msg)
	}
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": `cat feature.txt; git rev-parse --abbrev-ref HEAD; echo more >> feature.txt`, "workspace": map[string]any{"git": url, "ref": "feature"}}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 50})
	res := call[wsResult](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Status != "success" || res.Output != "only on the branch\nfeature\n" || res.Changes == nil || res.Changes.Modified != 1 {
		t.Fatalf("git source: %+v %+v", res, res.Changes)
	}
	if entries, _ := os.ReadDir(filepath.Join(dataDir, "clones")); len(entries) != 0 {
		t.Errorf("the clone was left behind: %v", entries)
	}
	// Its changes, into a checkout of the branch.
	co := filepath.Join(t.TempDir(), "co")
	gitIn(t, root, "clone", "-q", "-b", "feature", dir, co)
	if _, errOut, code := delegateCLIEnv(t, dataDir, env, "jobs", "apply", sub.JobID); code != 2 || !strings.Contains(errOut, "--to DIR") {
		t.Errorf("apply of a git source without --to: %d %s", code, errOut)
	}
	if _, errOut, code := delegateCLIEnv(t, dataDir, env, "jobs", "apply", sub.JobID, "--to", co); code != 0 {
		t.Fatalf("apply --to: %d %s", code, errOut)
	}
	if got, _ := os.ReadFile(filepath.Join(co, "feature.txt")); string(got) != "only on the branch\nmore\n" {
		t.Errorf("feature.txt after apply: %q", got)
	}
}

// TestWorkspaceCache: a second `go build` of the same module, with the go
// cache, finds the first one's work (`go build -v` names each package it
// compiles, and none it takes from the cache). A build of a package that
// imports nothing, not a `go test`, which would compile the testing
// package's dependencies into an empty cache first (a minute of CPU).
func TestWorkspaceCache(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not installed")
	}
	root := t.TempDir()
	dir := calcProject(t, root)
	dataDir := t.TempDir()
	args := []string{"run", "-q", "--workspace", dir, "--cache", "go", "--memory", "1G", "--env", "PATH=" + filepath.Dir(goBin) + ":/usr/bin:/bin",
		"--env", "GOTOOLCHAIN=local", "--env", "GOFLAGS=-mod=mod", "--script", "go build -v ./... 2>&1 && ls /cache/go"}
	first, errOut, code := delegateCLI(t, dataDir, args...)
	if code != 0 || !strings.Contains(first, "example.com/calc\n") {
		t.Fatalf("first run: %d %q %s", code, first, errOut)
	}
	second, errOut, code := delegateCLI(t, dataDir, args...)
	if code != 0 || strings.Contains(second, "example.com/calc") {
		t.Fatalf("second run did not reuse the cache: %d %q %s", code, second, errOut)
	}
	if !strings.Contains(second, "build\n") {
		t.Errorf("/cache/go holds: %q", second)
	}
	// Another project does not share it.
	other := filepath.Join(t.TempDir(), "other")
	gitIn(t, root, "clone", "-q", dir, other)
	out, _, _ := delegateCLI(t, dataDir, "run", "-q", "--workspace", other, "--cache", "go", "--script", "ls -A /cache/go | wc -l")
	if strings.TrimSpace(out) != "0" {
		t.Errorf("another project's go cache holds %s entries", out)
	}
}

// TestWorkspaceProxmox: the same on the Proxmox backend (the simulator,
// whose guests run the real qemu-guest-agent where installed): the
// project goes in through the agent, the changes come back through it,
// and caches are refused naming the field.
func TestWorkspaceProxmox(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 1)
	root := t.TempDir()
	dir := calcProject(t, root)
	cs, _, _ := stdioSession(t, t.TempDir(), "", append(env, "DELEGATE_WORKSPACE_ROOTS="+root)...)
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"dir": dir},
		"caches": []string{"go"}}}); !strings.Contains(msg, "manifest.caches: caches are not kept on the proxmox backend") {
		t.Errorf("caches on Proxmox: %q", msg)
	}
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": fixScript, "workspace": map[string]any{"dir": dir},
		"statusMode": "detailed"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 50})
	res := call[wsResult](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	if res.Status != "success" || !strings.Contains(res.Output, "ignored left out") {
		t.Fatalf("job: %+v", res)
	}
	var files []string
	for _, f := range res.Changes.Files {
		files = append(files, f.Kind+" "+f.Path)
	}
	if want := []string{"added CHANGES", "deleted README", "modified calc.go"}; !slices.Equal(files, want) || res.Changes.IgnoredAdded != 1 {
		t.Errorf("changed files %q (ignored added %d), want %q", files, res.Changes.IgnoredAdded, want)
	}
	if diff := readResource(t, cs, "job://"+sub.JobID+"/diff"); !strings.Contains(diff, "+func Add(a, b int) int { return a + b }") {
		t.Errorf("diff:\n%s", diff)
	}
	noVMsLeft(t, sim)
	schema := sim.Schema()
	for _, r := range sim.Requests() {
		if _, _, err := schema.Validate(r.Method, r.Path, r.Params); err != nil {
			t.Errorf("%s %s %v: %v", r.Method, r.Path, r.Params, err)
		}
	}
}

// BenchmarkWorkspaceGoCache: the second `go test ./...` of a small module
// through `delegate run --workspace DIR --cache go` (the whole run: the
// CLI, the sandbox, the copy in, the test, the changes out), against the
// same command on the host with a warm cache of its own.
//
//	go test -run '^$' -bench WorkspaceGoCache -benchtime 3x ./e2e/
func BenchmarkWorkspaceGoCache(b *testing.B) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		b.Skip("go is not installed")
	}
	root := b.TempDir()
	dir := filepath.Join(root, "calc")
	os.MkdirAll(dir, 0o755)
	for name, content := range map[string]string{
		"go.mod":       "module example.com/calc\n\ngo 1.22\n",
		"calc.go":      "package calc\n\nfunc Add(a, b int) int { return a + b }\n",
		"calc_test.go": "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatal(Add(2, 3))\n\t}\n}\n",
	} {
		os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
	hostCache := b.TempDir()
	host := func() time.Duration {
		cmd := exec.Command(goBin, "test", "./...")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOCACHE="+hostCache, "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go test on the host: %v %s", err, out)
		}
		return time.Since(t0)
	}
	dataDir := b.TempDir()
	env := serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
	run := func() time.Duration {
		cmd := exec.Command(binary, "run", "-q", "--workspace", dir, "--cache", "go", "--memory", "1G",
			"--env", "PATH="+filepath.Dir(goBin)+":/usr/bin:/bin", "--env", "GOTOOLCHAIN=local", "--env", "GOFLAGS=-mod=mod", "--script", "go test ./...")
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("delegate run: %v %s", err, out)
		}
		return time.Since(t0)
	}
	host()
	run() // the first runs fill the caches
	var h, d time.Duration
	for b.Loop() {
		h += host()
		d += run()
	}
	n := float64(b.N)
	b.ReportMetric(h.Seconds()/n, "host-s")
	b.ReportMetric(d.Seconds()/n, "delegate-s")
	b.ReportMetric(d.Seconds()/h.Seconds(), "ratio")
}
