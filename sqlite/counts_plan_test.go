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
	rows, err := s.rdb.Query("EXPLAIN QUERY PLAN " + countQuery)
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
	if p := strings.Join(plan, "; "); !strings.Contains(p, "COVERING INDEX jobs_status") {
		t.Errorf("query plan %q does not read the status index alone", p)
	}
}
