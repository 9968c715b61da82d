package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/storetest"
	"github.com/jackc/pgx/v5"
)

// TestListJobsGenericPlanUsesIndexes: the filters by sandbox id, token
// hash and kept sandbox go through their partial indexes in the plan
// PostgreSQL keeps for a prepared statement after its fifth run (the
// generic plan, forced here), where nothing is known of $n. Before, the
// first two read every job (a seq scan, or the primary key backwards).
func TestListJobsGenericPlanUsesIndexes(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, pgtest.New(t))
	for i := range 500 {
		j := storetest.NewJob(fmt.Sprintf("job-%d", i))
		j.SandboxID, j.TokenHash = fmt.Sprintf("sb-%d", i), fmt.Sprintf("hash-%d", i)
		if err := db.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `ANALYZE jobs`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET plan_cache_mode`)
	for i, tc := range []struct {
		name  string
		f     delegate.JobFilter
		index string
	}{
		{"sandbox id", delegate.JobFilter{SandboxID: "sb-1", Limit: 1}, "jobs_sandbox"},
		{"token", delegate.JobFilter{TokenHash: "hash-1", Limit: 1}, "jobs_token"},
		{"kept sandbox", delegate.JobFilter{Sandbox: "sbx-1", Limit: 1}, "jobs_kept"},
	} {
		query, args, _, err := listJobsQuery(ctx, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("plan_%d", i)
		if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+query); err != nil {
			t.Fatal(err)
		}
		// EXPLAIN takes no parameters of its own: pgx puts the arguments
		// in the text (the simple protocol), as EXECUTE's.
		params := make([]string, len(args))
		for k := range args {
			params[k] = fmt.Sprintf("$%d", k+1)
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(params, ", ")+")", append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, strings.TrimSpace(line))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if p := strings.Join(plan, "; "); !strings.Contains(p, "using "+tc.index) {
			t.Errorf("%s: the generic plan is %q, not through %s", tc.name, p, tc.index)
		}
	}
	for _, f := range []delegate.JobFilter{{SandboxID: "sb-7"}, {TokenHash: "hash-7"}} {
		if jobs, _, err := db.ListJobs(ctx, f); err != nil || len(jobs) != 1 || jobs[0].ID != "job-7" {
			t.Errorf("%+v: %v, %v", f, jobs, err)
		}
	}
}
