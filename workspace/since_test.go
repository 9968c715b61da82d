package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// roundTrip is cs as the engine keeps it (JSON).
func roundTrip(t *testing.T, cs *Changes) *Changes {
	t.Helper()
	js, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	var back Changes
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	return &back
}

// A kept sandbox's changes applied twice (issue 40, item 1): the second
// command's changes (since the import, like every command's) conflict
// with what the first apply wrote; from that state (Since) they go in,
// and only what someone else changed in the target is a conflict.
func TestApplySince(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a\n", "b": "b\n", "c": "c\n", "d": "d\n", "mine": "mine\n"})
	sandbox, base := importTree(t, src, ScanOptions{})
	read := func() *Changes {
		cs := roundTrip(t, readBack(t, sandbox, base, ChangesOptions{}))
		if err := cs.ReadOld(ctx, src, ""); err != nil {
			t.Fatal(err)
		}
		return roundTrip(t, cs)
	}
	// The first command: a and b edited, c deleted, n added.
	writeFiles(t, sandbox, map[string]string{"a": "a1\n", "b": "b1\n", "n": "n1\n"})
	os.Remove(filepath.Join(sandbox, "c"))
	first := read()
	if _, err := Apply(ctx, src, first, ApplyOptions{}); err != nil {
		t.Fatalf("the first apply: %v", err)
	}
	// The second: a edited again, b back as imported, c back, d deleted,
	// n deleted again, m added.
	writeFiles(t, sandbox, map[string]string{"a": "a2\n", "b": "b\n", "c": "c\n", "m": "m\n"})
	os.Remove(filepath.Join(sandbox, "d"))
	os.Remove(filepath.Join(sandbox, "n"))
	second := read()
	var ce *ConflictError
	if _, err := Apply(ctx, src, second, ApplyOptions{}); !errors.As(err, &ce) {
		t.Fatalf("the second command's changes since the import, applied over the first's: %v, want the conflict the issue reports", err)
	}
	delta, err := second.Since(first)
	if err != nil {
		t.Fatal(err)
	}
	if delta.Added != 2 || delta.Modified != 2 || delta.Deleted != 2 {
		t.Errorf("since the first: %d added, %d modified, %d deleted; want c and m added, a and b modified, d and n deleted", delta.Added, delta.Modified, delta.Deleted)
	}
	if _, err := Apply(ctx, src, roundTrip(t, delta), ApplyOptions{}); err != nil {
		t.Fatalf("the second apply, from the first's state: %v", err)
	}
	want := map[string]string{"a": "a2\n", "b": "b\n", "c": "c\n", "m": "m\n", "mine": "mine\n"}
	for _, p := range []string{"a", "b", "c", "d", "m", "mine", "n"} {
		data, err := os.ReadFile(filepath.Join(src, p))
		if w, ok := want[p]; ok != (err == nil) || string(data) != w {
			t.Errorf("%s after both applies: %q (%v), want %q", p, data, err, w)
		}
	}
	// Someone else edits a; the third command edits it too and touches
	// mine: a conflicts, nothing written.
	writeFiles(t, src, map[string]string{"a": "theirs\n"})
	writeFiles(t, sandbox, map[string]string{"a": "a3\n", "mine": "mine, edited\n"})
	third := read()
	delta, err = third.Since(second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Apply(ctx, src, delta, ApplyOptions{})
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Path != "a" {
		t.Fatalf("someone else's edit: %v, want a conflict on a alone", err)
	}
	if data, _ := os.ReadFile(filepath.Join(src, "mine")); string(data) != "mine\n" {
		t.Errorf("a conflicting apply wrote mine: %q", data)
	}
	// Nothing changed since: nothing to write.
	if d, err := second.Since(second); err != nil || len(d.Changes) != 0 {
		t.Errorf("changes since themselves: %+v %v", d, err)
	}
}
