package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/delegate-dev/delegate"
)

// testWorkspaces: a job's baseline is kept with where it was read from,
// its changes and their summary come later (also for a job that has no
// baseline of its own: a command in a kept sandbox), another handle (a
// restarted server) reads them, and a job without a workspace, or no job,
// is ErrNotFound.
func testWorkspaces(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("w"), NewJob("cmd"), NewJob("plain"))
	if _, err := s.JobWorkspace(ctx, "w"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("before the baseline: %v, want ErrNotFound", err)
	}
	base := []byte(`{"version":1,"kind":"git","files":[]}`)
	if err := s.SaveBaseline(ctx, "w", "/src/project", base); err != nil {
		t.Fatal(err)
	}
	w, err := s.JobWorkspace(ctx, "w")
	if err != nil || w.Source != "/src/project" || !bytes.Equal(w.Baseline, base) || w.Changes != nil || w.Summary != nil {
		t.Fatalf("after the baseline: %+v %v", w, err)
	}
	changes := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1<<16) // binary: the engine may compress them
	sum := delegate.WorkspaceChanges{Added: 1, Modified: 2, Bytes: 10, Files: []delegate.ChangedFile{{Path: "a.go", Kind: "modified", Size: 3}}, More: 2}
	if err := s.SaveChanges(ctx, "w", sum, changes); err != nil {
		t.Fatal(err)
	}
	w, err = open().JobWorkspace(ctx, "w")
	if err != nil || w.Source != "/src/project" || !bytes.Equal(w.Baseline, base) || !bytes.Equal(w.Changes, changes) ||
		w.Summary == nil || w.Summary.Modified != 2 || len(w.Summary.Files) != 1 || w.Summary.Files[0].Path != "a.go" || w.Summary.More != 2 {
		t.Fatalf("after the changes, from another handle: %+v %v", w.Summary, err)
	}
	if err := s.SaveChanges(ctx, "cmd", delegate.WorkspaceChanges{Error: "over the cap"}, nil); err != nil {
		t.Fatal(err)
	}
	if w, err := s.JobWorkspace(ctx, "cmd"); err != nil || w.Baseline != nil || w.Summary == nil || w.Summary.Error != "over the cap" {
		t.Fatalf("changes without a baseline: %+v %v", w, err)
	}
	if _, err := s.JobWorkspace(ctx, "plain"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("a job without a workspace: %v, want ErrNotFound", err)
	}
	if err := s.SaveBaseline(ctx, "nope", "/x", base); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("SaveBaseline of no job: %v, want ErrNotFound", err)
	}
	if err := s.SaveChanges(ctx, "nope", sum, nil); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("SaveChanges of no job: %v, want ErrNotFound", err)
	}
	// Applies (issue 40): per chain and target, the last job whose
	// changes were written there, read by another handle; another target
	// or chain has none; a job that is none is ErrNotFound.
	if id, err := s.LastApply(ctx, "sbx-a", "/src/project"); err != nil || id != "" {
		t.Fatalf("before any apply: %q %v, want none", id, err)
	}
	create(t, s, NewJob("later"))
	for _, a := range []struct{ chain, target, job string }{
		{"sbx-a", "/src/project", "w"}, {"sbx-a", "/src/copy", "cmd"}, {"sbx-a", "/src/project", "later"}, {"w", "/src/project", "w"},
	} {
		if err := s.SaveApply(ctx, a.chain, a.target, a.job); err != nil {
			t.Fatalf("SaveApply %+v: %v", a, err)
		}
	}
	for _, a := range []struct{ chain, target, want string }{
		{"sbx-a", "/src/project", "later"}, {"sbx-a", "/src/copy", "cmd"}, {"w", "/src/project", "w"}, {"sbx-b", "/src/project", ""}, {"sbx-a", "/src", ""},
	} {
		if id, err := open().LastApply(ctx, a.chain, a.target); err != nil || id != a.want {
			t.Errorf("LastApply(%s, %s) = %q, %v; want %q", a.chain, a.target, id, err, a.want)
		}
	}
	if err := s.SaveApply(ctx, "sbx-a", "/src/project", "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("SaveApply of no job: %v, want ErrNotFound", err)
	}
	if id, _ := s.LastApply(ctx, "sbx-a", "/src/project"); id != "later" {
		t.Errorf("a refused SaveApply replaced the last apply: %q", id)
	}
	// A store may keep them in any form (compressed: see the sqlite
	// store), as long as they read back as given: a large baseline, and
	// values that look compressed already.
	create(t, s, NewJob("big"), NewJob("gz"))
	big := []byte(`{"version":1,"kind":"dir","files":[`)
	for i := range 20000 {
		big = fmt.Appendf(big, `{"path":"d/f%06d","type":"file","mode":"0644","size":1,"mtime":%d},`, i, 1700000000000000000+i)
	}
	big = append(big[:len(big)-1], "]}"...)
	gz := []byte{0x1f, 0x8b, 8, 0, 'n', 'o', 't', ' ', 'g', 'z', 'i', 'p'}
	if err := s.SaveBaseline(ctx, "big", "/src", big); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBaseline(ctx, "gz", "/src", gz); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveChanges(ctx, "gz", sum, gz); err != nil {
		t.Fatal(err)
	}
	if w, err := open().JobWorkspace(ctx, "big"); err != nil || !bytes.Equal(w.Baseline, big) {
		t.Errorf("a large baseline does not read back as given (%v)", err)
	}
	if w, err := open().JobWorkspace(ctx, "gz"); err != nil || !bytes.Equal(w.Baseline, gz) || !bytes.Equal(w.Changes, gz) {
		t.Errorf("values that look gzipped do not read back as given: %+v, %v", w, err)
	}
}
