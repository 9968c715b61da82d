package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
)

// ProgressStore keeps what running jobs report: their progress, result
// and heartbeat (on the job's row) and their timelines. It implements
// delegate.ProgressStore on a DB.
type ProgressStore struct {
	db   *DB
	stmt struct {
		events                                            *readStmt  // reader
		wProgress, wEventsSpan, wInsertEvent, wTrimEvents *writeStmt // writer
	}
}

var _ delegate.ProgressStore = (*ProgressStore)(nil)

func newProgressStore(ctx context.Context, db *DB) (*ProgressStore, error) {
	s := &ProgressStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.events, `SELECT time, message FROM job_events WHERE job_id = ?1` + jobIsMine + ` ORDER BY seq`},
		{db.wdb, &s.stmt.wProgress, `UPDATE jobs SET
			progress = CASE WHEN ?2 != '' AND status IN ` + active + ` THEN ?2 ELSE progress END,
			result = CASE WHEN ?3 IS NOT NULL AND status IN ` + active + ` THEN ?3 ELSE result END,
			last_heartbeat = CASE WHEN ?4 > last_heartbeat AND status IN ` + active + ` THEN ?4 ELSE last_heartbeat END,
			timeline_dropped = timeline_dropped + ?5,
			updated_at = ?6
			WHERE id = ?1`},
		{db.wdb, &s.stmt.wEventsSpan, `SELECT COALESCE((SELECT min(seq) FROM job_events WHERE job_id = ?1), 1), COALESCE((SELECT max(seq) FROM job_events WHERE job_id = ?1), 0)`},
		{db.wdb, &s.stmt.wInsertEvent, `INSERT INTO job_events (job_id, seq, time, message) VALUES (?, ?, ?, ?)`},
		{db.wdb, &s.stmt.wTrimEvents, `DELETE FROM job_events WHERE job_id = ? AND seq <= ?`},
	})
}

// SaveProgress stores the coalesced progress of many jobs in one
// transaction; see delegate.ProgressStore.
func (s *ProgressStore) SaveProgress(ctx context.Context, batch []delegate.JobProgress) error {
	if len(batch) == 0 {
		return nil
	}
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		now := time.Now().UTC().UnixNano()
		for _, p := range batch {
			if err := s.saveProgress(tx, p, delegate.MaxTimeline, now); err != nil {
				return fmt.Errorf("job %s: %w", p.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save progress: %w", err)
	}
	return nil
}

// saveProgress writes one job's progress: one UPDATE of its row, and its
// new timeline entries with the oldest beyond keep deleted (and counted).
func (s *ProgressStore) saveProgress(tx *sql.Tx, p delegate.JobProgress, keep int, now int64) error {
	keep = max(1, min(keep, delegate.MaxTimeline))
	events, dropped := p.Events, p.Dropped
	if len(events) > keep {
		dropped += int64(len(events) - keep)
		events = events[len(events)-keep:]
	}
	// Timeline entries are numbered without gaps: the first and the last
	// say how many there are, through the primary key (no scan).
	var first, last int64
	if len(events) > 0 {
		if err := s.stmt.wEventsSpan.in(tx).QueryRow(p.ID).Scan(&first, &last); err != nil {
			return err
		}
	}
	count := last - first + 1
	// What the insert below pushes out of the timeline.
	trim := max(0, count+int64(len(events))-int64(keep))
	var result any
	if p.Result != nil {
		result = *p.Result
	}
	res, err := s.stmt.wProgress.in(tx).Exec(p.ID, p.Progress, result, toNanos(p.Heartbeat), dropped+trim, now)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // an unknown job: nothing to add to
	}
	if len(events) == 0 {
		return nil
	}
	insert, err := s.stmt.wInsertEvent.in(tx).prepared()
	if err != nil {
		return err
	}
	for i, ev := range events {
		if _, err := insert.Exec(p.ID, last+1+int64(i), toNanos(ev.Time), ev.Message); err != nil {
			return err
		}
	}
	if trim > 0 {
		if _, err := s.stmt.wTrimEvents.in(tx).Exec(p.ID, last+int64(len(events))-int64(keep)); err != nil {
			return err
		}
	}
	return nil
}

// AddEvent appends to the job's timeline, keeping the newest max entries
// (at most delegate.MaxTimeline) and counting those it drops.
func (s *ProgressStore) AddEvent(ctx context.Context, id string, ev delegate.Event, max int) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		return s.saveProgress(tx, delegate.JobProgress{ID: id, Events: []delegate.Event{ev}}, max, time.Now().UTC().UnixNano())
	})
	if err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	return nil
}

// Events returns the job's timeline, oldest first.
func (s *ProgressStore) Events(ctx context.Context, id string) ([]delegate.Event, error) {
	rows, err := s.stmt.events.QueryContext(ctx, id, delegate.ReaderOf(ctx))
	if err != nil {
		return nil, fmt.Errorf("events of job %s: %w", id, err)
	}
	defer rows.Close()
	var evs []delegate.Event
	for rows.Next() {
		var (
			at  int64
			msg string
		)
		if err := rows.Scan(&at, &msg); err != nil {
			return nil, fmt.Errorf("events of job %s: %w", id, err)
		}
		evs = append(evs, delegate.Event{Time: fromNanos(at), Message: msg})
	}
	return evs, rows.Err()
}
