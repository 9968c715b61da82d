package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// ProgressStore keeps what running jobs report: their progress, result
// and heartbeat (on the job's row) and their timelines. It implements
// delegate.ProgressStore on a DB.
type ProgressStore struct{ db *DB }

var _ delegate.ProgressStore = (*ProgressStore)(nil)

// progressUpdate writes a job's progress, result and heartbeat while it
// is active, and counts the timeline entries dropped ($5, plus what the
// expression more adds).
func progressUpdate(more string) string {
	return `UPDATE jobs SET
	progress = CASE WHEN $2 <> '' AND status IN ` + active + ` THEN $2 ELSE progress END,
	result = CASE WHEN $3::text IS NOT NULL AND status IN ` + active + ` THEN $3 ELSE result END,
	last_heartbeat = CASE WHEN $4::timestamptz IS NOT NULL AND ($4 > last_heartbeat OR last_heartbeat IS NULL)
		AND status IN ` + active + ` THEN $4 ELSE last_heartbeat END,
	updated_at = $6,
	timeline_dropped = timeline_dropped + $5` + more + `
	WHERE id = $1`
}

// progressOnly is progressUpdate for a job without new timeline entries.
var progressOnly = progressUpdate("")

// progressEvents is progressUpdate with new timeline entries ($7, $8:
// times and messages; $9 how many; $10 how many to keep): they are
// numbered on from the last (without gaps, so that the first and the
// last say how many there are), and the oldest beyond the newest $10 are
// deleted and counted. An unknown job gets none (and its UPDATE finds no
// row). Run with the job's row locked (lockJob) by a statement before:
// its snapshot then sees the entries the job's last writer added.
var progressEvents = `WITH span AS (
		SELECT coalesce(min(seq), 1) AS first, coalesce(max(seq), 0) AS last FROM job_events WHERE job_id = $1
	), trim AS (
		SELECT greatest(0, last - first + 1 + $9 - $10) AS n, last FROM span
	), upd AS (
		` + progressUpdate(` + (SELECT n FROM trim)`) + `
	), ins AS (
		INSERT INTO job_events (job_id, seq, time, message)
		SELECT $1, t.last + e.ord, e.time, e.message
		FROM trim t, unnest($7::timestamptz[], $8::text[]) WITH ORDINALITY AS e(time, message, ord)
		WHERE EXISTS (SELECT 1 FROM jobs WHERE id = $1)
	)
	DELETE FROM job_events WHERE job_id = $1 AND seq <= (SELECT last FROM trim) + $9 - $10`

// lockJob locks a job's row for a write that reads what the last writer
// of the job wrote (FOR NO KEY UPDATE: rows that refer to the job can
// still be added meanwhile).
const lockJob = `SELECT 1 FROM jobs WHERE id = $1 FOR NO KEY UPDATE`

// SaveProgress stores the coalesced progress of many jobs in one
// transaction and one round trip (the statements are sent as a batch);
// see delegate.ProgressStore. The jobs' rows are locked in the order of
// their ids, so that two servers' batches never wait on each other in a
// circle.
func (s *ProgressStore) SaveProgress(ctx context.Context, batch []delegate.JobProgress) error {
	if len(batch) == 0 {
		return nil
	}
	batch = slices.Clone(batch)
	slices.SortStableFunc(batch, func(a, b delegate.JobProgress) int { return strings.Compare(a.ID, b.ID) })
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		now := toTS(time.Now())
		var b pgx.Batch
		for _, p := range batch {
			queueProgress(&b, p, delegate.MaxTimeline, now)
		}
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return fmt.Errorf("save progress: %w", err)
	}
	return nil
}

// queueProgress adds to b the statements that write one job's progress
// (an unknown job's change nothing).
func queueProgress(b *pgx.Batch, p delegate.JobProgress, keep int, now ts) {
	keep = max(1, min(keep, delegate.MaxTimeline))
	events, dropped := p.Events, p.Dropped
	if len(events) > keep {
		dropped += int64(len(events) - keep)
		events = events[len(events)-keep:]
	}
	var result any
	if p.Result != nil {
		result = clean(*p.Result)
	}
	progress := clean(p.Progress)
	if len(events) == 0 {
		b.Queue(progressOnly, p.ID, progress, result, toTS(p.Heartbeat), dropped, now)
		return
	}
	times := make([]ts, len(events))
	msgs := make([]string, len(events))
	for i, ev := range events {
		times[i], msgs[i] = toTS(ev.Time), clean(ev.Message)
	}
	b.Queue(lockJob, p.ID)
	b.Queue(progressEvents, p.ID, progress, result, toTS(p.Heartbeat), dropped, now, times, msgs, len(events), keep)
}

// AddEvent appends to the job's timeline, keeping the newest max entries
// (at most delegate.MaxTimeline) and counting those it drops.
func (s *ProgressStore) AddEvent(ctx context.Context, id string, ev delegate.Event, max int) error {
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var b pgx.Batch
		queueProgress(&b, delegate.JobProgress{ID: id, Events: []delegate.Event{ev}}, max, toTS(time.Now()))
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	return nil
}

// Events returns the job's timeline, oldest first.
func (s *ProgressStore) Events(ctx context.Context, id string) ([]delegate.Event, error) {
	rows, err := s.db.pool.Query(ctx, `SELECT time, message FROM job_events WHERE job_id = $1`+jobIsMine+` ORDER BY seq`, id, delegate.ReaderOf(ctx))
	if err != nil {
		return nil, fmt.Errorf("events of job %s: %w", id, err)
	}
	defer rows.Close()
	var evs []delegate.Event
	for rows.Next() {
		var (
			at  ts
			msg string
		)
		if err := rows.Scan(&at, &msg); err != nil {
			return nil, fmt.Errorf("events of job %s: %w", id, err)
		}
		evs = append(evs, delegate.Event{Time: at.time(), Message: msg})
	}
	return evs, rows.Err()
}

// clean makes s storable as PostgreSQL text, which holds neither NUL nor
// invalid UTF-8 (SQLite's holds both): each becomes U+FFFD. A job's
// progress, result and errors may carry what its process wrote.
func clean(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
