package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/delegate-dev/delegate"
)

// readStmts are the read statements of db's stores, found in their
// statement structs (no pointer is followed below a store: they point
// back to db).
func readStmts(t *testing.T, db *DB) []*readStmt {
	t.Helper()
	var out []*readStmt
	want := reflect.TypeFor[*readStmt]()
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch {
		case v.Type() == want:
			if !v.IsNil() {
				out = append(out, (*readStmt)(v.UnsafePointer()))
			}
		case v.Kind() == reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		}
	}
	st := reflect.ValueOf(db).Elem()
	for i := range st.NumField() {
		if f := st.Field(i); f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct && !f.IsNil() {
			walk(f.Elem())
		}
	}
	return out
}

// TestStatementsPreparedWhenUsed: opening the store prepares none of its
// statements (SQLite's parsing of them all was a tenth of a CLI
// command's CPU, issue 41); a read prepares its own, once; the first
// write prepares the write statements; every one is valid against the
// schema.
func TestStatementsPreparedWhenUsed(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reads := readStmts(t, db)
	if len(reads) < 25 {
		t.Fatalf("found %d read statements in the stores, want the ~29 there are", len(reads))
	}
	for _, r := range reads {
		if r.st.Load() != nil {
			t.Errorf("prepared at open: %q", r.text)
		}
	}
	if _, err := db.GetJob(ctx, "job-none"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("GetJob of a job that is not there: %v", err)
	}
	first := db.JobStore.stmt.getJob.st.Load()
	if first == nil {
		t.Fatal("GetJob did not prepare its statement")
	}
	db.GetJob(ctx, "job-none")
	if db.JobStore.stmt.getJob.st.Load() != first {
		t.Error("a second GetJob prepared its statement again")
	}
	for _, r := range reads {
		if _, err := r.stmt(ctx); err != nil {
			t.Errorf("%v", err)
		}
	}
	// The write statements: prepared before the first write's
	// transaction, every one (the write connection is free then).
	if n := len(db.w.pending); n < 25 || db.w.savepoint != nil || db.JobStore.stmt.wInsertJob != nil {
		t.Fatalf("at open: %d write statements pending, the savepoint's %v, the job insert's %v", n, db.w.savepoint, db.JobStore.stmt.wInsertJob)
	}
	if err := db.w.do(ctx, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n := len(db.w.pending); n != 0 || db.w.savepoint == nil || db.JobStore.stmt.wInsertJob == nil {
		t.Fatalf("after a write: %d write statements pending", n)
	}
}
