package sqlite

import (
	"context"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// countQuery reads only the status index (jobs_status covers it): no job
// row is loaded, whatever their size (TestCountJobsUsesTheStatusIndex).
const countQuery = `SELECT status, COUNT(*) FROM jobs GROUP BY status`

// CountJobs counts the stored jobs in each status, for metrics. Every
// status is in the map, zero or not.
func (s *JobStore) CountJobs(ctx context.Context) (map[delegate.Status]int, error) {
	counts := make(map[delegate.Status]int, len(delegate.Statuses))
	for _, st := range delegate.Statuses {
		counts[st] = 0
	}
	rows, err := s.db.rdb.QueryContext(ctx, countQuery)
	if err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			st delegate.Status
			n  int
		)
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("count jobs: %w", err)
		}
		counts[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	return counts, nil
}
