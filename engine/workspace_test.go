package engine_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// project writes files into a new directory under root.
func project(t *testing.T, root, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func gitRun(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// TestWorkspaceJob: a git work tree comes into the sandbox as git sees it
// (its ignored files left out), with HOME out of /workspace; after the
// job, what it added, modified and deleted is kept with the job — by the
// engine that follows it after a restart, from the stored baseline — the
// manifest's files left out, and read as a summary in the result, a diff
// and a patch.
func TestWorkspaceJob(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root := t.TempDir()
	dir := project(t, root, "calc", map[string]string{
		"calc.go":    "package calc\n\nfunc Add(a, b int) int { return a - b }\n",
		"README":     "calc\n",
		".gitignore": "build/\n",
		"build/out":  "ignored\n",
	})
	gitRun(t, dir, "init", "-q")
	gitRun(t, dir, "add", "calc.go", "README", ".gitignore")
	gitRun(t, dir, "commit", "-qm", "first")
	ctx := context.Background()
	f := newFixture(t, engine.Config{WorkspaceRoots: []string{root}, OwnerAlive: func(string) bool { return false }})
	m := script("go test ./...")
	m.Workspace = &delegate.WorkspaceSource{Dir: dir}
	m.StatusMode = delegate.StatusModeDetailed
	m.Files = []delegate.File{{Path: "input.txt", Content: "aGk="}}
	job := f.submit(m)
	p := f.started()
	sb := p.Sandbox
	if data, ok := sb.File("/workspace/calc.go"); !ok || !strings.Contains(string(data), "a - b") {
		t.Fatalf("calc.go in the sandbox: %q %v", data, ok)
	}
	if _, ok := sb.File("/workspace/.git/HEAD"); !ok {
		t.Error(".git did not come in")
	}
	if _, ok := sb.File("/workspace/build/out"); ok {
		t.Error("an ignored file came in")
	}
	if !slices.Contains(p.Cmd.Env, "HOME=/tmp") {
		t.Errorf("HOME is not out of the workspace: %q", p.Cmd.Env)
	}
	// The job fixes the bug, adds a test, removes the README, builds.
	sb.WriteFile(ctx, "/workspace/calc.go", []byte("package calc\n\nfunc Add(a, b int) int { return a + b }\n"), 0o644)
	sb.WriteFile(ctx, "/workspace/calc_test.go", []byte("package calc\n"), 0o644)
	sb.WriteFile(ctx, "/workspace/build/new", []byte("ignored too\n"), 0o644)
	sb.WriteFile(ctx, "/workspace/input.txt", []byte("changed input\n"), 0o644)
	sb.Remove("/workspace/README")

	// A restart while it runs: the next engine computes the changes.
	f.eng.Close()
	eng2 := f.start(f.backend)
	f.eng = eng2
	p.Finish(sandbox.Exit{})
	j := f.wait(eng2, job.ID)
	if j.Status != delegate.StatusSuccess {
		t.Fatalf("job %s: %s", j.Status, j.Error)
	}
	res, err := eng2.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Changes
	if c == nil || c.Added != 1 || c.Modified != 1 || c.Deleted != 1 || c.IgnoredAdded != 1 || c.Error != "" {
		t.Fatalf("changes %+v", c)
	}
	var paths []string
	for _, f := range c.Files {
		paths = append(paths, f.Kind+" "+f.Path)
	}
	if want := []string{"deleted README", "modified calc.go", "added calc_test.go"}; !slices.Equal(paths, want) {
		t.Errorf("changed files %q, want %q", paths, want)
	}
	page, err := eng2.Diff(ctx, job.ID, delegate.DiffOptions{})
	if err != nil || !strings.Contains(page.Text, "-func Add(a, b int) int { return a - b }\n+func Add(a, b int) int { return a + b }") || page.Next != 0 {
		t.Errorf("diff %+v %v", page, err)
	}
	patch, err := eng2.Patch(ctx, job.ID)
	if err != nil || !strings.Contains(string(patch), "diff --git a/calc.go b/calc.go") {
		t.Errorf("patch %q %v", patch, err)
	}
	// The patch is what git apply takes, in the source.
	os.WriteFile(filepath.Join(root, "job.patch"), patch, 0o644)
	gitRun(t, dir, "apply", "--check", filepath.Join(root, "job.patch"))
	set, err := eng2.ChangeSet(ctx, job.ID)
	if err != nil || set.Source.Dir != dir || len(set.Baseline) == 0 || len(set.Changes) == 0 {
		t.Errorf("change set %+v %v", set, err)
	}
	timeline, _ := eng2.Timeline(ctx, job.ID)
	var said []string
	for _, e := range timeline {
		said = append(said, e.Message)
	}
	for _, want := range []string{`^copying workspace \([0-9]+ files, 0\.0 MB\)$`, `^changes: 1 added, 1 modified, 1 deleted$`} {
		n := 0
		for _, m := range said {
			if regexp.MustCompile(want).MatchString(m) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the timeline has %s %d times, want once: %q", want, n, said)
		}
	}
	// A job without a workspace has none.
	plain := f.submit(script("true"))
	f.started().Finish(sandbox.Exit{})
	f.wait(eng2, plain.ID)
	if r, _ := eng2.Result(ctx, plain.ID, delegate.ResultOptions{}); r.Changes != nil {
		t.Errorf("a job without a workspace has changes %+v", r.Changes)
	}
	if _, err := eng2.Diff(ctx, plain.ID, delegate.DiffOptions{}); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("the diff of a job without a workspace: %v", err)
	}
}

// TestWorkspaceRefused: each bad source is a field error at submission
// naming manifest.workspace… and the rule, and nothing is stored.
func TestWorkspaceRefused(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	outside := t.TempDir()
	dir := project(t, root, "p", map[string]string{"a.txt": "a", "b.txt": "b", "c/d.txt": "d"})
	many := project(t, root, "many", map[string]string{"1": "", "2": "", "3": "", "4": "", "5": "", "6": ""})
	big := project(t, root, "big", map[string]string{"blob": strings.Repeat("x", 40<<20)})
	notDir := filepath.Join(dir, "a.txt")
	link := filepath.Join(root, "link")
	os.Symlink(dir, link)
	loop := filepath.Join(root, "loop")
	os.Symlink(loop, loop)
	locked := project(t, root, "locked", map[string]string{"secret/x": "x"})
	os.Chown(locked, 65534, 65534)
	os.Chmod(filepath.Join(locked, "secret"), 0o700) // root's, unreadable by nobody
	f := newFixture(t, engine.Config{WorkspaceRoots: []string{root}, WorkspaceMaxFiles: 5})
	noRoots := newFixture(t, engine.Config{})
	for _, tc := range []struct {
		name  string
		f     *fixture
		m     func(m *delegate.Manifest)
		field string
		rule  string
	}{
		{"relative", f, func(m *delegate.Manifest) { m.Workspace.Dir = "calc" }, "manifest.workspace.dir", "must be an absolute path"},
		{"no roots", noRoots, nil, "manifest.workspace.dir", "DELEGATE_WORKSPACE_ROOTS"},
		{"outside the roots", f, func(m *delegate.Manifest) { m.Workspace.Dir = outside }, "manifest.workspace.dir", "not under an allowed root"},
		{"missing", f, func(m *delegate.Manifest) { m.Workspace.Dir = filepath.Join(root, "nope") }, "manifest.workspace.dir", "does not exist"},
		{"not a directory", f, func(m *delegate.Manifest) { m.Workspace.Dir = notDir }, "manifest.workspace.dir", "not a directory"},
		{"a link", f, func(m *delegate.Manifest) { m.Workspace.Dir = link }, "manifest.workspace.dir", "symbolic link"},
		{"a link loop", f, func(m *delegate.Manifest) { m.Workspace.Dir = loop }, "manifest.workspace.dir", "symbolic link"},
		{"unreadable", f, func(m *delegate.Manifest) { m.Workspace.Dir = locked }, "manifest.workspace.dir", "cannot be read by its owner"},
		{"too many files", f, func(m *delegate.Manifest) { m.Workspace.Dir = many }, "manifest.workspace.dir", "over the cap of 5"},
		{"over half the memory", f, func(m *delegate.Manifest) {
			m.Workspace.Dir, m.Resources = big, &delegate.Resources{Disk: "1G"}
		}, "manifest.workspace.dir", "40.0 MiB found, over the cap of 32.0 MiB (the cap is the least of the server's and half of resources.memory 64M)"},
		{"over the disk", f, func(m *delegate.Manifest) { m.Workspace.Dir = big }, "manifest.workspace.dir", "the least of the server's and resources.disk 16M"},
		{"dir and git", f, func(m *delegate.Manifest) { m.Workspace.Git = "https://example.com/x.git" }, "manifest.workspace", "not both"},
		{"not https", f, func(m *delegate.Manifest) { m.Workspace = &delegate.WorkspaceSource{Git: "http://example.com/x.git"} }, "manifest.workspace.git", "https"},
		{"a private address", f, func(m *delegate.Manifest) { m.Workspace = &delegate.WorkspaceSource{Git: "https://127.0.0.1:1/x.git"} }, "manifest.workspace.git", "refused"},
		{"a ref for a dir", f, func(m *delegate.Manifest) { m.Workspace.Ref = "main" }, "manifest.workspace.ref", "git source"},
		{"an unknown cache", f, func(m *delegate.Manifest) { m.Caches = []string{"maven"} }, "manifest.caches[0]", "one of go, npm, pip, cargo"},
		{"caches not kept", f, func(m *delegate.Manifest) { m.Caches = []string{"go"} }, "manifest.caches", "not kept on the mock backend"},
		{"caches without a source", f, func(m *delegate.Manifest) { m.Workspace, m.Caches = nil, []string{"go"} }, "manifest.caches", "needs manifest.workspace"},
		{"a file over the project's", f, func(m *delegate.Manifest) { m.Files = []delegate.File{{Path: "c/d.txt", Content: "eA=="}} }, "manifest.files[0].path", "also in the workspace source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := script("true")
			m.Workspace = &delegate.WorkspaceSource{Dir: dir}
			if tc.m != nil {
				tc.m(&m)
			}
			_, err := tc.f.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Rule, tc.rule) {
				t.Fatalf("Submit: %v; want %s: …%s…", err, tc.field, tc.rule)
			}
			if jobs, _, _ := tc.f.store.ListJobs(context.Background(), delegate.JobFilter{}); len(jobs) != 0 {
				t.Errorf("a job was stored: %+v", jobs[0])
			}
		})
	}
}

// TestWorkspaceKeptSandbox: a persistent job's workspace stays in its
// kept sandbox; each command run there later gets the changes since the
// import (against the baseline of the job that made the sandbox) and the
// same environment (HOME out of the workspace).
func TestWorkspaceKeptSandbox(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := project(t, root, "p", map[string]string{"a.txt": "one\n"})
	ctx := context.Background()
	f := newFixture(t, engine.Config{WorkspaceRoots: []string{root}})
	m := script("true")
	m.Workspace, m.Lifecycle = &delegate.WorkspaceSource{Dir: dir}, delegate.LifecyclePersistent
	maker := f.submit(m)
	f.started().Finish(sandbox.Exit{})
	j := f.wait(f.eng, maker.ID)
	if j.Sandbox == "" {
		t.Fatalf("no kept sandbox: %+v", j)
	}
	if r, err := f.eng.Result(ctx, maker.ID, delegate.ResultOptions{}); err != nil || r.Changes == nil || len(r.Changes.Files) != 0 {
		t.Fatalf("the maker's changes: %+v %v", r, err)
	}
	for i, content := range []string{"two\n", "three\n"} {
		c := script("edit")
		c.Sandbox = j.Sandbox
		cmd := f.submit(c)
		p := f.started()
		if !slices.Contains(p.Cmd.Env, "HOME=/tmp") {
			t.Errorf("command %d: HOME %q", i, p.Cmd.Env)
		}
		p.Sandbox.WriteFile(ctx, "/workspace/a.txt", []byte(content), 0o644)
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, cmd.ID)
		page, err := f.eng.Diff(ctx, cmd.ID, delegate.DiffOptions{})
		if err != nil || !strings.Contains(page.Text, "-one\n+"+content) {
			t.Errorf("command %d: diff %+v %v; want the change since the import", i, page, err)
		}
	}
}
