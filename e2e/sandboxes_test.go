package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Kept sandboxes through the built binary: the MCP tools with the go-sdk
// client over stdio and HTTP, and the CLI's sandboxes, exec and cp.

type sandboxOut struct {
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	Commands  int    `json:"commands"`
	Running   int    `json:"running"`
	Reason    string `json:"reason"`
	ExpiresAt string `json:"expires_at"`
}

type filesOut struct {
	Text       *string `json:"text"`
	Content    *string `json:"content"`
	Size       *int64  `json:"size"`
	EOF        *bool   `json:"eof"`
	NextOffset *int64  `json:"next_offset"`
	Entries    []struct {
		Path string `json:"path"`
		Type string `json:"type"`
		Size int64  `json:"size"`
		Mode string `json:"mode"`
	} `json:"entries"`
}

// inSandbox runs a script in sandbox id and returns its result once it
// has ended.
func inSandbox(t *testing.T, cs *mcp.ClientSession, id, script string) resultOut {
	t.Helper()
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": id, "task": script, "timeout": 60}})
	for {
		st := call[struct {
			Done bool `json:"done"`
		}](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 30})
		if st.Done {
			break
		}
	}
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	res.JobID = sub.JobID
	return res
}

func TestSandboxOverMCP(t *testing.T) {
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			dataDir := t.TempDir()
			var cs *mcp.ClientSession
			if transport == "stdio" {
				cs, _, _ = stdioSession(t, dataDir, "")
			} else {
				cs = httpSession(t, httpServer(t, dataDir), "")
			}
			sandboxConversation(t, cs)
		})
	}
}

func sandboxConversation(t *testing.T, cs *mcp.ClientSession) {
	tools, err := cs.ListTools(testContext(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	offered := map[string]*mcp.Tool{}
	for _, tool := range tools.Tools {
		offered[tool.Name] = tool
	}
	for _, name := range []string{"open_sandbox", "list_sandboxes", "sandbox_files", "release_job"} {
		if offered[name] == nil {
			t.Fatalf("%s is not offered", name)
		}
	}
	if a := offered["release_job"].Annotations; a.DestructiveHint != nil || a.ReadOnlyHint {
		t.Errorf("release_job is destructive: %+v", a)
	}

	open := call[sandboxOut](t, cs, "open_sandbox", map[string]any{"resources": map[string]any{"memory": "256M"}, "idle_timeout": 600})
	id := open.SandboxID
	if !strings.HasPrefix(id, "sbx-") || open.State != "idle" || open.ExpiresAt == "" {
		t.Fatalf("open_sandbox: %+v", open)
	}

	// Two commands, one sandbox: the second sees what the first left.
	first := inSandbox(t, cs, id, "echo hi > f")
	if first.Status != "success" {
		t.Fatalf("echo hi > f: %+v", first)
	}
	second := inSandbox(t, cs, id, "cat f; echo err >&2; exit 4")
	if second.Output != "hi\n" || second.Stderr != "err\n" || second.ExitCode == nil || *second.ExitCode != 4 {
		t.Fatalf("cat f: %+v", second)
	}
	st := call[struct {
		SandboxID string `json:"sandbox_id"`
	}](t, cs, "get_job_status", map[string]any{"job_id": second.JobID})
	if st.SandboxID != id {
		t.Errorf("the command's status names sandbox %q, want %s", st.SandboxID, id)
	}

	// Files: read what a command wrote, write what the next one runs.
	f := call[filesOut](t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "read", "path": "f"})
	if f.Text == nil || *f.Text != "hi\n" || !*f.EOF || *f.Size != 3 {
		t.Fatalf("read f: %+v", f)
	}
	w := call[filesOut](t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "write", "path": "bin/hello.sh",
		"text": "#!/bin/sh\necho \"hello $1\"\n", "mode": "0755"})
	if w.Size == nil || *w.Size != 26 {
		t.Fatalf("write: %+v", w)
	}
	if r := inSandbox(t, cs, id, "./bin/hello.sh world"); r.Output != "hello world\n" {
		t.Fatalf("the written script: %+v", r)
	}
	// Binary, larger than one read: written in base64, read back by pages.
	blob := make([]byte, 1<<20+12345)
	rand.Read(blob)
	call[filesOut](t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "write", "path": "data/blob.bin",
		"content": base64.StdEncoding.EncodeToString(blob)})
	var got []byte
	offset := int64(0)
	for range 4 {
		part := call[filesOut](t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "read", "path": "data/blob.bin", "offset": offset})
		switch {
		case part.Content != nil:
			b, err := base64.StdEncoding.DecodeString(*part.Content)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b...)
		case part.Text != nil:
			got = append(got, *part.Text...)
		}
		if *part.EOF {
			break
		}
		offset = *part.NextOffset
	}
	if !bytes.Equal(got, blob) {
		t.Fatalf("read back %d bytes, not the %d written", len(got), len(blob))
	}
	sum := sha256.Sum256(blob)
	if r := inSandbox(t, cs, id, "sha256sum data/blob.bin"); !strings.HasPrefix(r.Output, hex.EncodeToString(sum[:])) {
		t.Errorf("the command sees another file: %q", r.Output)
	}
	ls := call[filesOut](t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "list", "depth": 2})
	found := map[string]string{}
	for _, e := range ls.Entries {
		found[strings.TrimPrefix(e.Path, "/workspace/")] = e.Type + " " + e.Mode
	}
	if found["f"] != "file 0644" || found["bin"] != "dir 0755" || found["bin/hello.sh"] != "file 0755" || found["data/blob.bin"] == "" {
		t.Errorf("list: %v", found)
	}
	// Paths stay inside the workspace, and the error names the path.
	for _, p := range []string{"../etc/passwd", "/etc/passwd"} {
		if msg := callErr(t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "read", "path": p}); !strings.Contains(msg, "path") {
			t.Errorf("read %s: %q", p, msg)
		}
	}
	if msg := callErr(t, cs, "sandbox_files", map[string]any{"sandbox_id": id, "op": "write", "path": "../x", "text": "x"}); !strings.Contains(msg, "path") {
		t.Errorf("write ../x: %q", msg)
	}

	// A process left in the background by one command runs on beside
	// the next ones.
	bg := inSandbox(t, cs, id, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.1; done' >/dev/null 2>&1 & sleep 0.5; echo started`)
	if bg.Status != "success" {
		t.Fatalf("background: %+v", bg)
	}
	alive := inSandbox(t, cs, id, `a=$(cat counter); sleep 1; b=$(cat counter); [ "$b" -gt "$a" ] && echo alive`)
	if alive.Output != "alive\n" {
		t.Fatalf("the background process did not go on: %+v", alive)
	}

	// Listed, described, as a resource.
	list := call[struct {
		Sandboxes []sandboxOut `json:"sandboxes"`
	}](t, cs, "list_sandboxes", map[string]any{})
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].SandboxID != id || list.Sandboxes[0].Commands != 6 {
		t.Errorf("list_sandboxes: %+v", list)
	}
	res, err := cs.ReadResource(testContext(t), &mcp.ReadResourceParams{URI: "sandbox://" + id})
	var asResource sandboxOut
	if err != nil || json.Unmarshal([]byte(res.Contents[0].Text), &asResource) != nil || asResource.SandboxID != id {
		t.Errorf("sandbox://%s: %v", id, err)
	}
	if msg := callErr(t, cs, "list_sandboxes", map[string]any{"sandbox_id": "sbx-nope"}); !strings.Contains(msg, "sandbox_id") || !strings.Contains(msg, "list_sandboxes") {
		t.Errorf("unknown sandbox: %q", msg)
	}
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": "sbx-nope", "task": "true"}}); !strings.Contains(msg, "manifest.sandbox") || !strings.Contains(msg, "list_sandboxes") {
		t.Errorf("a command in an unknown sandbox: %q", msg)
	}

	// Released: gone, and said so.
	rel := call[struct {
		Released bool `json:"released"`
	}](t, cs, "release_job", map[string]any{"sandbox_id": id})
	if !rel.Released {
		t.Fatalf("release: %+v", rel)
	}
	one := call[struct {
		Sandboxes []sandboxOut `json:"sandboxes"`
	}](t, cs, "list_sandboxes", map[string]any{"sandbox_id": id})
	if len(one.Sandboxes) != 1 || one.Sandboxes[0].State != "released" {
		t.Errorf("after release: %+v", one)
	}
	if msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": id, "task": "true"}}); !strings.Contains(msg, id) {
		t.Errorf("a command in a released sandbox: %q", msg)
	}
	if again := call[struct {
		Released bool `json:"released"`
	}](t, cs, "release_job", map[string]any{"sandbox_id": id}); again.Released {
		t.Error("released twice")
	}
}

func TestSandboxCLI(t *testing.T) {
	dataDir := t.TempDir()
	id, errOut, code := delegateCLI(t, dataDir, "sandboxes", "open", "--memory", "256M", "--idle", "10m")
	id = strings.TrimSpace(id)
	if code != 0 || !strings.HasPrefix(id, "sbx-") {
		t.Fatalf("sandboxes open: %d %q %s", code, id, errOut)
	}

	inIt := func(args ...string) (string, string, int) {
		t.Helper()
		return delegateCLI(t, dataDir, append([]string{"exec", id, "--"}, args...)...)
	}
	if out, errOut, code := inIt("sh", "-c", "echo hi > f"); code != 0 || out != "" {
		t.Fatalf("exec echo: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := inIt("cat", "f"); code != 0 || out != "hi\n" {
		t.Fatalf("exec cat: %d %q %s", code, out, errOut)
	}
	// stdout and stderr apart, the command's exit code as delegate's.
	if out, errOut, code := inIt("sh", "-c", "echo out; echo err >&2; exit 3"); code != 3 || out != "out\n" || errOut != "err\n" {
		t.Errorf("streams and code: %d %q %q", code, out, errOut)
	}
	// Arguments arrive as they were given, never through a shell.
	args := []string{"a b", "it's", "$(touch pwned)", "`id`", "*", ""}
	if out, errOut, code := inIt(append([]string{"printf", "[%s]"}, args...)...); code != 0 || out != "[a b][it's][$(touch pwned)][`id`][*][]" {
		t.Errorf("argv: %d %q %s", code, out, errOut)
	}
	if _, _, code := inIt("test", "-e", "pwned"); code != 1 {
		t.Error("an argument was run by a shell")
	}
	if _, _, code := inIt("no-such-command"); code != 127 {
		t.Errorf("a missing command: exit %d, want 127", code)
	}

	// cp in and out, more than one read's worth.
	dir := t.TempDir()
	local := filepath.Join(dir, "in.sh")
	os.WriteFile(local, []byte("#!/bin/sh\necho copied in\n"), 0o755)
	if _, errOut, code := delegateCLI(t, dataDir, "cp", local, id+":bin/in.sh"); code != 0 {
		t.Fatalf("cp in: %d %s", code, errOut)
	}
	if out, _, code := inIt("./bin/in.sh"); code != 0 || out != "copied in\n" {
		t.Errorf("the file copied in: %d %q", code, out)
	}
	if _, errOut, code := inIt("sh", "-c", "head -c 2500000 /dev/urandom > big.bin"); code != 0 {
		t.Fatalf("make big.bin: %s", errOut)
	}
	sum, _, _ := inIt("sha256sum", "big.bin")
	outFile := filepath.Join(dir, "big.bin")
	if _, errOut, code := delegateCLI(t, dataDir, "cp", id+":big.bin", dir); code != 0 {
		t.Fatalf("cp out: %d %s", code, errOut)
	}
	data, _ := os.ReadFile(outFile)
	got := sha256.Sum256(data)
	if len(data) != 2500000 || !strings.HasPrefix(sum, hex.EncodeToString(got[:])) {
		t.Errorf("cp out: %d bytes, sha256 %x, in the sandbox %s", len(data), got, sum)
	}
	if out, _, code := delegateCLI(t, dataDir, "cp", id+":f", "-"); code != 0 || out != "hi\n" {
		t.Errorf("cp to stdout: %d %q", code, out)
	}
	if _, errOut, code := delegateCLI(t, dataDir, "cp", id+":../etc/passwd", dir); code == 0 || !strings.Contains(errOut, "path") {
		t.Errorf("cp of a path outside: %d %q", code, errOut)
	}

	// Listed and shown.
	out, _, code := delegateCLI(t, dataDir, "sandboxes", "list")
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("sandboxes list: %d\n%s", code, out)
	}
	out, _, _ = delegateCLI(t, dataDir, "sandboxes", "show", id, "--json")
	var shown struct {
		ID       string `json:"sandbox_id"`
		Commands int    `json:"commands"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil || shown.ID != id || shown.Commands < 8 {
		t.Errorf("sandboxes show --json: %v %s", err, out)
	}

	// Released: exec says so, with the way to the others.
	if out, errOut, code := delegateCLI(t, dataDir, "sandboxes", "release", id); code != 0 || out != id+" released\n" {
		t.Fatalf("release: %d %q %s", code, out, errOut)
	}
	if _, errOut, code := inIt("true"); code != 125 || !strings.Contains(errOut, id) {
		t.Errorf("exec in a released sandbox: %d %q", code, errOut)
	}
	if _, errOut, code := delegateCLI(t, dataDir, "exec", "sbx-nope", "--", "true"); code != 125 || !strings.Contains(errOut, "'delegate sandboxes list' shows the sandboxes.") {
		t.Errorf("exec in an unknown sandbox: %d %q", code, errOut)
	}
}

// TestSandboxesDashboardInChromium: the sandboxes page lists a kept
// sandbox, follows it live while a command runs in it (a confirmation
// the reader opened stays open), links it from the command's page, and
// releases it after the confirmation.
func TestSandboxesDashboardInChromium(t *testing.T) {
	b := newBrowser(t)
	dataDir := t.TempDir()
	base := startHTTP(t, dataDir, nil)
	cs := httpSession(t, base+"/mcp", "")
	id := call[sandboxOut](t, cs, "open_sandbox", map[string]any{}).SandboxID
	row := `tr[data-sandbox="` + id + `"]`

	b.do(t, "open the sandboxes page", chromedp.Navigate(base+"/sandboxes"), chromedp.WaitVisible(chromedp.CSS(row)))
	if s := b.text(t, row+" .status"); s != "idle" {
		t.Errorf("state shown as %q", s)
	}
	b.waitFor(t, "the live updates to connect", `document.querySelector('#live-state.on') !== null`, 10*time.Second)
	b.do(t, "open the release confirmation", chromedp.Click(chromedp.CSS(row+" details summary")),
		chromedp.WaitVisible(chromedp.CSS(row+" details button")))

	// A command runs: the row follows, the confirmation stays open.
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": id, "task": "sleep 3"}})
	b.waitFor(t, "the running state", `document.querySelector(`+jsString(row+" .sb-running")+`) !== null`, 20*time.Second)
	if !b.eval(t, `document.getElementById(`+jsString("release-"+id)+`).open`) {
		t.Error("the live update closed the confirmation the reader had opened")
	}
	b.waitFor(t, "the idle state again", `document.querySelector(`+jsString(row+" .sb-idle")+`) !== null`, 20*time.Second)
	b.shoot(t, "dashboard-sandboxes.png", 1280, 500)

	// The command's page links its sandbox.
	b.do(t, "open the command's page", chromedp.Navigate(base+"/jobs/"+sub.JobID),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/sandboxes/`+id+`"]`)))
	b.do(t, "follow the link", chromedp.Click(chromedp.CSS(`a[href="/sandboxes/`+id+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("h1.job-id")))
	if h := b.text(t, "h1.job-id"); h != id {
		t.Errorf("the sandbox page is %q", h)
	}

	// Release, after confirming.
	b.do(t, "release it",
		chromedp.Click(chromedp.CSS("details.cancel summary")),
		chromedp.WaitVisible(chromedp.CSS("details.cancel button")),
		chromedp.Click(chromedp.CSS("details.cancel button")),
		chromedp.WaitVisible(chromedp.CSS(".notice")))
	if s := b.text(t, "#live .status"); s != "released" {
		t.Errorf("after release the page shows %q", s)
	}
	one := call[struct {
		Sandboxes []sandboxOut `json:"sandboxes"`
	}](t, cs, "list_sandboxes", map[string]any{"sandbox_id": id})
	if len(one.Sandboxes) != 1 || one.Sandboxes[0].State != "released" {
		t.Errorf("the service says %+v after the dashboard released it", one)
	}

	time.Sleep(200 * time.Millisecond)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		t.Errorf("browser: %s", p)
	}
}

// TestSandboxOverMCPProxmox: the same conversation with a kept VM of a
// simulated cluster (commands through its guest agent, files through
// agent/file-read and file-write), over stdio and HTTP; then a sandbox
// idle past its idle timeout is suspended, and its next command resumes
// it with what it left running; no VM is left once they are released.
func TestSandboxOverMCPProxmox(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			sim, env := simCluster(t, 1)
			dataDir := t.TempDir()
			var cs *mcp.ClientSession
			if transport == "stdio" {
				cs, _, _ = stdioSession(t, dataDir, "", env...)
			} else {
				cs = httpSession(t, httpServer(t, dataDir, env...), "")
			}
			sandboxConversation(t, cs)
			if transport == "http" {
				noVMsLeft(t, sim)
				return
			}

			open := call[sandboxOut](t, cs, "open_sandbox", map[string]any{"idle_timeout": 1})
			id := open.SandboxID
			bg := inSandbox(t, cs, id, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.1; done' >/dev/null 2>&1 & sleep 0.3; echo started`)
			if bg.Status != "success" {
				t.Fatalf("background: %+v", bg)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				one := call[struct {
					Sandboxes []sandboxOut `json:"sandboxes"`
				}](t, cs, "list_sandboxes", map[string]any{"sandbox_id": id})
				if one.Sandboxes[0].State == "paused" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not paused after its idle timeout: %+v", one.Sandboxes[0])
				}
				time.Sleep(200 * time.Millisecond)
			}
			paused := 0
			for _, v := range jobVMs(sim) {
				if v.Paused {
					paused++
				}
			}
			if paused != 1 {
				t.Errorf("%d VMs suspended in the simulator, want the kept one", paused)
			}
			alive := inSandbox(t, cs, id, `a=$(cat counter); sleep 1; b=$(cat counter); [ "$b" -gt "$a" ] && echo alive`)
			if alive.Output != "alive\n" {
				t.Fatalf("after the resume, the background process did not go on: %+v", alive)
			}
			call[struct{}](t, cs, "release_job", map[string]any{"sandbox_id": id})
			noVMsLeft(t, sim)
		})
	}
}

// TestSandboxesSurviveKill: kill -9 of the server with a kept sandbox
// running a command, one idle with a process in the background, and one
// paused: after the restart each is adopted — the command's result
// arrives, the background process still counts, the paused one resumes
// for its next command — and none is lost.
func TestSandboxesSurviveKill(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	open := func(idle int) string {
		return call[sandboxOut](t, cs, "open_sandbox", map[string]any{"idle_timeout": idle}).SandboxID
	}
	running, idle, paused := open(600), open(600), open(1)
	if r := inSandbox(t, cs, idle, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.1; done' >/dev/null 2>&1 & sleep 0.3; echo started`); r.Status != "success" {
		t.Fatalf("background: %+v", r)
	}
	if r := inSandbox(t, cs, paused, `echo kept > note`); r.Status != "success" {
		t.Fatalf("paused sandbox's first command: %+v", r)
	}
	long := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"sandbox": running, "task": "sleep 12; echo finished", "timeout": 60}})
	state := func(cs *mcp.ClientSession, id string) string {
		return call[struct {
			Sandboxes []sandboxOut `json:"sandboxes"`
		}](t, cs, "list_sandboxes", map[string]any{"sandbox_id": id}).Sandboxes[0].State
	}
	for deadline := time.Now().Add(30 * time.Second); state(cs, paused) != "paused" || state(cs, running) != "running"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("states before the kill: running %s, paused %s", state(cs, running), state(cs, paused))
		}
	}

	killServer(t, cmd)
	cs2, _, _ := stdioSession(t, dataDir, "")
	for {
		w := call[struct {
			Done bool `json:"done"`
		}](t, cs2, "wait_job", map[string]any{"job_id": long.JobID, "timeout_seconds": 30})
		if w.Done {
			break
		}
	}
	if r := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": long.JobID}); r.Status != "success" || r.Output != "finished\n" {
		t.Fatalf("the command running through the kill: %+v", r)
	}
	if r := inSandbox(t, cs2, idle, `a=$(cat counter); sleep 1; b=$(cat counter); [ "$b" -gt "$a" ] && echo alive`); r.Output != "alive\n" {
		t.Fatalf("the idle sandbox's background process after the kill: %+v", r)
	}
	if r := inSandbox(t, cs2, paused, `cat note`); r.Output != "kept\n" {
		t.Fatalf("the paused sandbox after the kill: %+v", r)
	}
	for _, id := range []string{running, idle, paused} {
		if s := state(cs2, id); s == "gone" || s == "released" {
			t.Errorf("sandbox %s is %s after the restart", id, s)
		}
		call[struct{}](t, cs2, "release_job", map[string]any{"sandbox_id": id})
	}
}
