package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// The count reads the status index only, never the job rows.
func TestCountJobsUsesTheStatusIndex(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p := queryPlan(t, s, countQuery); !strings.Contains(p, "COVERING INDEX jobs_status") {
		t.Errorf("query plan %q does not read the status index alone", p)
	}
}

// A kept sandbox's activity is read from the index of its jobs alone,
// never from the job rows (a sandbox may have thousands of commands),
// and so are the commands of a sandbox that are listed.
func TestSandboxActivityUsesTheIndex(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := queryPlan(t, s, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = 'sbx-a'`)
	if n := strings.Count(p, "COVERING INDEX jobs_kept (sandbox=?"); n != 3 {
		t.Errorf("query plan %q: %d of the 3 counts read the index jobs_kept alone", p, n)
	}
	if p := queryPlan(t, s, `SELECT seq FROM jobs WHERE 1 AND sandbox = 'sbx-a' AND sandbox != ''`); !strings.Contains(p, "INDEX jobs_kept") {
		t.Errorf("query plan %q: the commands of a sandbox are not found through the index jobs_kept", p)
	}
}

// queryPlan is SQLite's plan of query, its lines joined by "; ".
func queryPlan(t *testing.T, s *DB, query string) string {
	t.Helper()
	rows, err := s.rdb.Query("EXPLAIN QUERY PLAN " + query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	return strings.Join(plan, "; ")
}
