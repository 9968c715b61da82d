package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/storetest"
)

// stmtsOf are the statements of type T of db's stores, found in their
// statement structs (no pointer is followed below a store: they point
// back to db).
func stmtsOf[T any](db *DB) []*T {
	var out []*T
	want := reflect.TypeFor[*T]()
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch {
		case v.Type() == want:
			if !v.IsNil() {
				out = append(out, (*T)(v.UnsafePointer()))
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
	reads := stmtsOf[readStmt](db)
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
	// The write statements: none prepared at open, nor after a first
	// use (a CLI command uses most of the few it needs once); prepared
	// after their second, between transactions.
	writes := append(stmtsOf[writeStmt](db), db.w.savepoint, db.w.rollbackTo, db.w.release)
	if len(writes) < 28 {
		t.Fatalf("found %d write statements, want the ~31 there are", len(writes))
	}
	unprepared := func(when string) {
		t.Helper()
		for _, w := range writes {
			if w.st != nil && w != db.JobStore.stmt.wInsertJob && w != db.JobStore.stmt.wInsertManifest {
				t.Errorf("%s: prepared: %q", when, w.text)
			}
		}
	}
	unprepared("at open")
	insert := db.JobStore.stmt.wInsertJob
	if err := db.CreateJob(ctx, storetest.NewJob("job-1")); err != nil {
		t.Fatal(err)
	}
	if insert.st != nil || insert.uses != 1 {
		t.Fatalf("after one insert: the insert's statement prepared %v, used %d times", insert.st != nil, insert.uses)
	}
	unprepared("after one write")
	if err := db.CreateJob(ctx, storetest.NewJob("job-2")); err != nil {
		t.Fatal(err)
	}
	if insert.st == nil || db.JobStore.stmt.wInsertManifest.st == nil {
		t.Fatal("used twice, the insert's statements are not prepared")
	}
	unprepared("after two inserts")
	if err := db.CreateJob(ctx, storetest.NewJob("job-3")); err != nil {
		t.Fatal(err)
	}
	if j, err := db.GetJob(ctx, "job-3"); err != nil || j.ID != "job-3" {
		t.Fatalf("a job written with the prepared statement: %v, %v", j, err)
	}
	// Every one is valid against the schema.
	for _, w := range writes {
		st, err := db.wdb.PrepareContext(ctx, w.text)
		if err != nil {
			t.Errorf("prepare %q: %v", w.text, err)
			continue
		}
		st.Close()
	}
}

// TestListJobsUsesIndexes: a sandbox's jobs and a token's are found
// through their indexes, not by reading every job (the engine's sweep
// asks for each live sandbox's job at every start, a CLI command's too).
func TestListJobsUsesIndexes(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// As a store in use: many jobs, each with its sandbox, and SQLite
	// has its statistics (without either, it took the index here).
	for i := range 500 {
		j := storetest.NewJob(fmt.Sprintf("job-%d", i))
		j.SandboxID = fmt.Sprintf("sb-%d", i)
		if err := db.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.wdb.ExecContext(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		f     delegate.JobFilter
		index string
	}{
		{"sandbox id", delegate.JobFilter{SandboxID: "sb-1", Limit: 1}, "jobs_sandbox"},
		{"token", delegate.JobFilter{TokenHash: "abc", Limit: 1}, "jobs_token"},
		{"kept sandbox", delegate.JobFilter{Sandbox: "sbx-1", Limit: 1}, "jobs_kept"},
	} {
		query, args, err := listQuery(ctx, tc.f, 1)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if p := strings.Join(plan, "; "); !strings.Contains(p, "INDEX "+tc.index) {
			t.Errorf("%s: the plan is %q, not through %s", tc.name, p, tc.index)
		}
	}
	// And the filters still find what they filter on.
	j := storetest.NewJob("job-t")
	j.SandboxID, j.TokenHash = "sb-t", "abc"
	if err := db.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	for _, f := range []delegate.JobFilter{{SandboxID: "sb-t"}, {TokenHash: "abc"}} {
		if jobs, _, err := db.ListJobs(ctx, f); err != nil || len(jobs) != 1 || jobs[0].ID != "job-t" {
			t.Errorf("%+v: %v, %v", f, jobs, err)
		}
	}
}
