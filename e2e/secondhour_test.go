package e2e

import (
	"encoding/json"
	"errors"
	"html"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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

// bigOutput prints 2,000 numbered lines of 86 bytes (172 KB) to stdout,
// a line to stderr, and exits 3.
const bigOutput = `i=1; while [ $i -le 2000 ]; do printf 'line %04d %s\n' $i ` +
	`xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; echo 'it broke' >&2; exit 3`

// maxResultText is what a result of bigOutput may put into a model's
// context: the inline output (4 KiB), stderr's tail and the rest.
const maxResultText = 6 << 10

// checkReadable checks a result an agent reads (item 7): small; how the
// job ended first (the text starts with the status and exit code), the
// output last, from a line's start to the end, said to be truncated, and
// where the rest is.
func checkReadable(t *testing.T, what, text string, prefix string) resultOut {
	t.Helper()
	if len(text) > maxResultText {
		t.Errorf("%s: %d bytes of text, more than %d", what, len(text), maxResultText)
	}
	if !strings.HasPrefix(text, prefix) {
		t.Errorf("%s starts %.200q, want %q first", what, text, prefix)
	}
	var r resultOut
	var waited struct {
		Result *resultOut `json:"result"`
	}
	if err := json.Unmarshal([]byte(text), &waited); err != nil {
		t.Fatalf("%s: %v: %s", what, err, text)
	}
	if waited.Result != nil { // wait_job's: the result inside
		r = *waited.Result
	} else {
		json.Unmarshal([]byte(text), &r)
	}
	if !strings.HasSuffix(text, `"output":`+quote(r.Output)+"}") && !strings.HasSuffix(text, `"output":`+quote(r.Output)+"}}") {
		t.Errorf("%s: the output is not last: %.300q", what, text[max(0, len(text)-300):])
	}
	if r.Stderr != "it broke\n" || r.Error == "" || r.OutputBytes != 172009 || !r.OutputTruncated || !strings.HasPrefix(r.OutputURI, "job://") {
		t.Errorf("%s: %+v", what, r)
	}
	if !regexp.MustCompile(`^(line \d{4} x{75}\n)+$`).MatchString(r.Output) || !strings.HasSuffix(r.Output, "line 2000 "+strings.Repeat("x", 75)+"\n") ||
		len(r.Output) > 4<<10 || len(r.Output) < 3<<10 {
		t.Errorf("%s: the output shown is not whole lines up to the end (%d bytes): %.120q…", what, len(r.Output), r.Output)
	}
	return r
}

func quote(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// TestResultsAgentsCanRead: a job printing 170 KB, in a sandbox of its own
// and as a command in a kept sandbox, through wait_job, get_job_result and
// a task's result (the official TypeScript client): each says how the job
// ended first and shows the end of the output, whole lines, at most 4 KiB;
// output_truncated says that there is more, and output_uri (the job's log)
// has all of it (issue 40, item 7).
func TestResultsAgentsCanRead(t *testing.T) {
	dataDir := t.TempDir()
	out, errOut, code := delegateCLI(t, dataDir, "sandboxes", "open")
	sbx := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(sbx, "sbx-") {
		t.Fatalf("sandboxes open (%d): %q %s", code, out, errOut)
	}
	t.Cleanup(func() { delegateCLI(t, dataDir, "sandboxes", "release", sbx) })
	cs, _, _ := stdioSession(t, dataDir, "")
	for _, m := range []map[string]any{
		{"agentType": "script", "task": bigOutput},
		{"task": bigOutput, "sandbox": sbx},
	} {
		sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": m})
		var waited string
		for {
			res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "wait_job", Arguments: map[string]any{"job_id": sub.JobID}})
			if err != nil || res.IsError {
				t.Fatalf("wait_job: %v %s", err, text(res))
			}
			if waited = text(res); strings.Contains(waited, `"done":true`) {
				break
			}
		}
		checkReadable(t, "wait_job", waited, `{"status":"failed","done":true,"error":"exit code 3","result":{"status":"failed","exit_code":3,"exit_reason":"exited",`)
		res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "get_job_result", Arguments: map[string]any{"job_id": sub.JobID}})
		if err != nil {
			t.Fatal(err)
		}
		r := checkReadable(t, "get_job_result", text(res), `{"status":"failed","exit_code":3,"exit_reason":"exited","error":"exit code 3",`)
		if r.OutputURI != "job://"+sub.JobID+"/log" {
			t.Errorf("output_uri %q", r.OutputURI)
		}
		all, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: r.OutputURI})
		if err != nil {
			t.Fatal(err)
		}
		if log := all.Contents[0].Text; len(log) != 172009 || !strings.HasPrefix(log, "line 0001 ") || !strings.Contains(log, "line 1000 ") || !strings.HasSuffix(log, "it broke\n") {
			t.Errorf("%s has %d bytes, not the whole output: %.100q…", r.OutputURI, len(log), log)
		}
	}
	requireTasksClient(t)
	task := tasksClient(t, "stdio", binary, dataDir, "insandbox", sbx, bigOutput)
	if task.Outcome != "completed" || !task.IsError {
		t.Fatalf("the task: %+v", task)
	}
	checkReadable(t, "the task's result", task.Text, `{"status":"failed","exit_code":3,"exit_reason":"exited","error":"exit code 3",`)
}

// TestSecondHourOneRule: what used to differ from place to place (issue
// 40, item 4), through the built binary: durations as seconds or "10m"
// in every flag, a size stored in one form ("1GB" is "1G"), an allowlist
// widened shown by sandboxes show and the dashboard, "copying workspace"
// once in a timeline, and the dashboard's job page with the changed files
// and the diff.
func TestSecondHourOneRule(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	dataDir := t.TempDir()
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := delegateCLI(t, dataDir, args...)
		if code != 0 {
			t.Fatalf("delegate %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	if _, errOut, code := delegateCLI(t, dataDir, "run", "--timeout", "soon", "--script", "true"); code != 125 ||
		!strings.Contains(errOut, `invalid argument "soon" for "--timeout" flag: must be seconds or a duration of whole seconds like "90s", "10m" or "1h30m"`) {
		t.Errorf("--timeout soon: exit %d, %s", code, errOut)
	}
	cli("run", "-q", "--timeout", "10m", "--memory", "1GB", "--workspace", dir, "--script", "sed -i 's/a - b/a + b/' calc.go")
	job := newestJob(t, dataDir)
	status := cli("jobs", "status", job)
	if n := strings.Count(status, "copying workspace ("); n != 1 {
		t.Errorf("jobs status says copying workspace %d times, want once:\n%s", n, status)
	}

	sbx := strings.TrimSpace(cli("sandboxes", "open", "--memory", "1GB", "--idle", "600", "--lifetime", "2h", "--network", "pypi.org"))
	t.Cleanup(func() { delegateCLI(t, dataDir, "sandboxes", "release", sbx) })
	cli("jobs", "allow", sbx, "example.com")
	show := cli("sandboxes", "show", sbx)
	if !strings.Contains(show, "1G memory") || !strings.Contains(show, "example.com") || !strings.Contains(show, "pypi.org") {
		t.Errorf("sandboxes show after the allowlist was widened:\n%s", show)
	}

	base := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken)
	page := func(path string) string {
		t.Helper()
		code, _, body := fetch(t, http.DefaultClient, "GET", base+path, "Authorization", "Bearer "+httpToken)
		if code != 200 {
			t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		return body
	}
	jobPage := html.UnescapeString(page("/jobs/" + job))
	for _, want := range []string{"<dd>600 s, ", " CPU, 1G memory", "<h2>Changes</h2>", "0 added, 1 modified, 0 deleted", `<td data-label="File">calc.go</td>`,
		"+func Add(a, b int) int { return a + b }", `href="/jobs/` + job + `/patch"`} {
		if !strings.Contains(jobPage, want) {
			t.Errorf("the dashboard's job page lacks %q:\n%s", want, jobPage[strings.Index(jobPage, "<main"):])
		}
	}
	if patch := page("/jobs/" + job + "/patch"); !strings.Contains(patch, "-func Add(a, b int) int { return a - b }") {
		t.Errorf("the dashboard's patch: %q", patch)
	}
	if sp := page("/sandboxes/" + sbx); !strings.Contains(sp, "example.com") {
		t.Errorf("the dashboard's sandbox page does not show the widened allowlist")
	}
}

// TestGitSourcePath (issue 40, item 5): a git source given as the path
// of a repository under an allowed root is cloned at its ref (not
// mounted: uncommitted files do not come), shallow as an https one is
// (one commit of history: the ref's), one outside the roots is a field
// error, and a missing artifact of a job that is there is named as the
// artifact, with the protocol's not-found code.
func TestGitSourcePath(t *testing.T) {
	root := t.TempDir()
	repo := calcProject(t, root)
	writeTree(t, repo, map[string]string{"README": "calc, a calculator\n"})
	gitIn(t, repo, "commit", "-qam", "second")
	gitIn(t, repo, "tag", "-a", "v1", "-m", "one")
	writeTree(t, repo, map[string]string{"calc.go": "package calc\n\nfunc Add(a, b int) int { return a + b }\n"})
	gitIn(t, repo, "commit", "-qam", "fixed")
	cs, _, _ := stdioSession(t, t.TempDir(), "", "DELEGATE_WORKSPACE_ROOTS="+root)
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"task": "cat calc.go; ls; git log --oneline | wc -l", "workspace": map[string]any{"git": repo, "ref": "v1"}}})
	var res resultOut
	for {
		w := call[struct {
			Done   bool      `json:"done"`
			Result resultOut `json:"result"`
		}](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
		if w.Done {
			res = w.Result
			break
		}
	}
	if res.Status != "success" || !strings.Contains(res.Output, "a - b") || strings.Contains(res.Output, "NOTES") || !strings.HasSuffix(res.Output, "\n1\n") {
		t.Errorf("the job on %s at v1: %+v", repo, res)
	}
	outside := calcProject(t, t.TempDir())
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"task": "true", "workspace": map[string]any{"git": outside}}}); !strings.Contains(msg,
		"manifest.workspace.git: "+outside+" is not under an allowed root (DELEGATE_WORKSPACE_ROOTS: "+root+")") {
		t.Errorf("a repository outside the roots: %s", msg)
	}
	_, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "job://" + sub.JobID + "/artifacts/nope.txt"})
	var wire *jsonrpc.Error
	if !errors.As(err, &wire) || wire.Code != mcp.CodeResourceNotFound || !strings.Contains(wire.Message, `artifact "nope.txt" of job `+sub.JobID) {
		t.Errorf("a missing artifact: %#v", err)
	}
}

// TestSandboxWithProjectAndTrees (issue 40, item 3): sandboxes open
// --workspace opens a kept sandbox with the project in it (its changes
// diffed by the sandbox's id, as run --keep's), with the --idle and
// --lifetime asked for; cp -r copies a
// directory's tree in (links as links, an empty directory, modes) and
// out (that directory's alone, not the whole workspace), where a link is
// refused and nothing is written, as jobs apply refuses one; out into a
// directory that is there, the tree goes in it.
func TestSandboxWithProjectAndTrees(t *testing.T) {
	root := t.TempDir()
	dir := calcProject(t, root)
	dataDir := t.TempDir()
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := delegateCLI(t, dataDir, args...)
		if code != 0 {
			t.Fatalf("delegate %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	if _, errOut, code := delegateCLI(t, dataDir, "sandboxes", "open", "--cache", "go"); code != 2 || !strings.Contains(errOut, "--cache needs --workspace or --git") {
		t.Errorf("--cache alone: exit %d %s", code, errOut)
	}
	sbx := strings.TrimSpace(cli("sandboxes", "open", "--workspace", dir, "--idle", "10m", "--lifetime", "1h"))
	if !strings.HasPrefix(sbx, "sbx-") {
		t.Fatalf("sandboxes open --workspace printed %q", sbx)
	}
	t.Cleanup(func() { delegateCLI(t, dataDir, "sandboxes", "release", sbx) })
	var shown struct {
		CreatedAt time.Time `json:"created_at"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(cli("sandboxes", "show", sbx, "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	if life := shown.ExpiresAt.Sub(shown.CreatedAt); life != time.Hour || !strings.Contains(cli("sandboxes", "show", sbx), "paused after 10m0s idle") {
		t.Errorf("--idle 10m --lifetime 1h: a lifetime of %s; sandboxes show:\n%s", life, cli("sandboxes", "show", sbx))
	}
	if _, errOut, code := delegateCLI(t, dataDir, "sandboxes", "open", "--workspace", dir, "--idle", "2h"); code != 1 ||
		!strings.Contains(errOut, "--idle: must be at most 1800 seconds (DELEGATE_SANDBOX_IDLE; got 7200)") || !strings.Contains(errOut, "was released") {
		t.Errorf("--idle past the server's: exit %d %s", code, errOut)
	}
	if out := cli("exec", sbx, "--", "sh", "-c", "sed -i 's/a - b/a + b/' calc.go && cat README"); out != "calc\n" {
		t.Errorf("the project in the sandbox: %q", out)
	}
	if diff := cli("jobs", "diff", sbx); !strings.Contains(diff, "+func Add(a, b int) int { return a + b }") {
		t.Errorf("jobs diff of the sandbox:\n%s", diff)
	}

	tree := filepath.Join(t.TempDir(), "data")
	writeTree(t, tree, map[string]string{"sub/a.txt": "a\n", "run.sh": "#!/bin/sh\necho ran\n"})
	os.Chmod(filepath.Join(tree, "run.sh"), 0o755)
	os.Mkdir(filepath.Join(tree, "empty"), 0o755)
	os.Symlink("sub/a.txt", filepath.Join(tree, "link"))
	cli("cp", "-r", tree, sbx+":data")
	if out := cli("exec", sbx, "--", "sh", "-c", "cat data/sub/a.txt; ./data/run.sh; readlink data/link; test -d data/empty && echo empty"); out != "a\nran\nsub/a.txt\nempty\n" {
		t.Errorf("the tree in the sandbox: %q", out)
	}
	local := t.TempDir()
	back := filepath.Join(local, "back")
	if _, errOut, code := delegateCLI(t, dataDir, "cp", "-r", sbx+":data", back); code == 0 || !strings.Contains(errOut, "data/link: a symbolic link (to sub/a.txt): cp -r does not write links out") {
		t.Errorf("cp -r out of a tree with a link: exit %d %s", code, errOut)
	}
	if names, _ := os.ReadDir(local); len(names) != 0 {
		t.Errorf("a refused copy wrote %v", names)
	}
	// Only the directory asked for is packed: a file elsewhere in the
	// workspace that cannot be read (as a whole workspace's copy fails
	// on) is no matter.
	cli("exec", sbx, "--", "sh", "-c", "rm data/link && echo private > elsewhere && chmod 000 elsewhere")
	cli("cp", "-r", sbx+":data", back)
	if b, _ := os.ReadFile(filepath.Join(back, "sub/a.txt")); string(b) != "a\n" {
		t.Errorf("sub/a.txt out: %q", b)
	}
	if fi, err := os.Stat(filepath.Join(back, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh out: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(back, "empty")); err != nil || !fi.IsDir() {
		t.Errorf("the empty directory out: %v", err)
	}
	into := t.TempDir()
	cli("cp", "-r", sbx+":data/sub", into)
	if b, _ := os.ReadFile(filepath.Join(into, "sub", "a.txt")); string(b) != "a\n" {
		t.Errorf("into a directory that is there, the tree goes in it: %q", b)
	}
}
