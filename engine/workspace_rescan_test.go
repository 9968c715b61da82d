//go:build linux

package engine_test

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// TestWorkspaceScannedOnce: a job that starts at once imports the tree
// its submission scanned when nothing changed since (the log says so),
// and its changes are computed against the baseline its run kept,
// and a tree changed between the submission and the start — a file's
// content of the same size, a mode, a file removed and one added, a
// link's target — is imported as it is then, exactly: the sandbox holds
// the source as it is, and the job that changes nothing has no changes
// (its baseline is what was imported).
func TestWorkspaceScannedOnce(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := project(t, root, "proj", map[string]string{
		"a.go":     "package a\n",
		"b.txt":    "bee\n",
		"sub/c.go": "package sub\n",
		"sub/d.sh": "#!/bin/sh\n",
	})
	if err := os.Symlink("a.go", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// The submission's tree is taken again only when every time in it is
	// 2 s older than its scan (a change in the same tick of the clock
	// would not show): wait until the clock that stamps files is past.
	newest := newestChange(t, dir)
	probe := filepath.Join(root, "probe")
	os.WriteFile(probe, nil, 0o600)
	mode := fs.FileMode(0o600)
	testkit.Eventually(t, 20*time.Second, "the clock 2.5 s past the tree's times", func() bool {
		mode ^= 0o100
		os.Chmod(probe, mode)
		return newestChange(t, probe) > newest+int64(2500*time.Millisecond)
	})

	logged := &testkit.Log{}
	f := newFixture(t, engine.Config{WorkspaceRoots: []string{root}, OwnerAlive: func(string) bool { return false },
		Logger: slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	run := func(change func()) (*delegate.Job, *sandboxtest.Process) {
		t.Helper()
		var once sync.Once
		f.backend.CreateHook = func(context.Context, sandbox.Spec) error {
			if change != nil {
				once.Do(change) // after the submission's scan, before the import
			}
			return nil
		}
		m := script("true")
		m.Workspace = &delegate.WorkspaceSource{Dir: dir}
		job := f.submit(m)
		return job, f.started()
	}
	finish := func(job *delegate.Job, p *sandboxtest.Process) {
		t.Helper()
		p.Finish(sandbox.Exit{})
		if j := f.wait(f.eng, job.ID); j.Status != delegate.StatusSuccess {
			t.Fatalf("job %s: %s", j.Status, j.Error)
		}
		res, err := f.eng.Result(context.Background(), job.ID, delegate.ResultOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := res.Changes; c == nil || c.Added+c.Modified+c.Deleted != 0 || c.Error != "" {
			t.Errorf("job %s changed nothing, yet has changes %+v", job.ID, c)
		}
	}
	reused := func(id string) bool {
		for _, line := range strings.Split(logged.String(), "\n") {
			if strings.Contains(line, "the submission's scan is current") && strings.Contains(line, "job="+id) {
				return true
			}
		}
		return false
	}

	job, p := run(nil)
	if got, want := sandboxView(t, p.Sandbox), sourceView(t, dir); got != want {
		t.Fatalf("the sandbox holds\n%s\nthe source is\n%s", got, want)
	}
	if !reused(job.ID) {
		t.Errorf("an unchanged tree was scanned again at the start: %s", logged)
	}
	// The run keeps the baseline it stored for the job's end: a stored
	// one made empty now (every file would be added) is not read.
	if err := f.store.SaveBaseline(context.Background(), job.ID, dir, []byte(`{"version":1,"kind":"dir","files":[]}`)); err != nil {
		t.Fatal(err)
	}
	finish(job, p)

	job, p = run(func() {
		os.WriteFile(filepath.Join(dir, "b.txt"), []byte("BEE\n"), 0o644)
		os.Chmod(filepath.Join(dir, "sub/d.sh"), 0o755)
		os.Remove(filepath.Join(dir, "sub/c.go"))
		os.WriteFile(filepath.Join(dir, "sub/new.go"), []byte("package sub\n"), 0o644)
		os.Remove(filepath.Join(dir, "link"))
		os.Symlink("b.txt", filepath.Join(dir, "link"))
	})
	if got, want := sandboxView(t, p.Sandbox), sourceView(t, dir); got != want {
		t.Fatalf("after a change between submission and start, the sandbox holds\n%s\nthe source is\n%s", got, want)
	}
	if !strings.Contains(sourceView(t, dir), "sub/new.go") {
		t.Fatal("the change was not made")
	}
	if reused(job.ID) {
		t.Error("a tree changed since the submission was taken as it was scanned then")
	}
	finish(job, p)
}

// newestChange is the latest change time under p.
func newestChange(t *testing.T, p string) int64 {
	var newest int64
	filepath.WalkDir(p, func(p string, _ fs.DirEntry, err error) error {
		var st syscall.Stat_t
		if err == nil && syscall.Lstat(p, &st) == nil {
			newest = max(newest, st.Ctim.Nano())
		}
		return nil
	})
	return newest
}

// sourceView lists a directory as "path mode size mtime content-or-target"
// lines, sorted, for comparing with sandboxView.
func sourceView(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		body := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			body, _ = os.Readlink(p)
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			body = string(data)
		}
		lines = append(lines, fmt.Sprintf("%s %v %d %d %q", rel, fi.Mode(), size(fi), fi.ModTime().UnixNano(), body))
		return nil
	})
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func size(fi fs.FileInfo) int64 {
	if fi.Mode().IsRegular() {
		return fi.Size()
	}
	return 0
}

// sandboxView is sourceView of the fake sandbox's /workspace.
func sandboxView(t *testing.T, sb *sandboxtest.FakeInstance) string {
	t.Helper()
	files, err := sb.ListFiles(context.Background(), sandbox.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, fi := range files {
		body := fi.Link
		if fi.Mode.IsRegular() {
			data, _ := sb.File(fi.Path)
			body = string(data)
		}
		n := fi.Size
		if !fi.Mode.IsRegular() {
			n = 0
		}
		lines = append(lines, fmt.Sprintf("%s %v %d %d %q", strings.TrimPrefix(fi.Path, delegate.Workspace+"/"), fi.Mode, n, fi.ModTime.UnixNano(), body))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
