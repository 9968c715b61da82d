package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
)

// SaveProgress stores the coalesced progress of many jobs in one
// transaction; see delegate.JobStore.
func (s *Store) SaveProgress(ctx context.Context, batch []delegate.JobProgress) error {
	if len(batch) == 0 {
		return nil
	}
	err := s.w.do(ctx, func(tx *sql.Tx) error {
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
func (s *Store) saveProgress(tx *sql.Tx, p delegate.JobProgress, keep int, now int64) error {
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
		if err := tx.Stmt(s.stmt.wEventsSpan).QueryRow(p.ID).Scan(&first, &last); err != nil {
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
	res, err := tx.Stmt(s.stmt.wProgress).Exec(p.ID, p.Progress, result, toNanos(p.Heartbeat), dropped+trim, now)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // an unknown job: nothing to add to
	}
	if len(events) == 0 {
		return nil
	}
	insert := tx.Stmt(s.stmt.wInsertEvent)
	for i, ev := range events {
		if _, err := insert.Exec(p.ID, last+1+int64(i), toNanos(ev.Time), ev.Message); err != nil {
			return err
		}
	}
	if trim > 0 {
		if _, err := tx.Stmt(s.stmt.wTrimEvents).Exec(p.ID, last+int64(len(events))-int64(keep)); err != nil {
			return err
		}
	}
	return nil
}

// AddEvent appends to the job's timeline, keeping the newest max entries
// (at most delegate.MaxTimeline) and counting those it drops.
func (s *Store) AddEvent(ctx context.Context, id string, ev delegate.Event, max int) error {
	err := s.w.do(ctx, func(tx *sql.Tx) error {
		return s.saveProgress(tx, delegate.JobProgress{ID: id, Events: []delegate.Event{ev}}, max, time.Now().UTC().UnixNano())
	})
	if err != nil {
		return fmt.Errorf("add event to job %s: %w", id, err)
	}
	return nil
}

// Events returns the job's timeline, oldest first.
func (s *Store) Events(ctx context.Context, id string) ([]delegate.Event, error) {
	rows, err := s.stmt.events.QueryContext(ctx, id)
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

// AppendOutput adds a chunk after the output kept so far and records how
// far the backend's output was consumed, in one transaction (a restarted
// engine then reads on from exactly there). The chunk is one row, however
// many times it changes streams.
func (s *Store) AppendOutput(ctx context.Context, id string, chunk []delegate.Output, read int64) error {
	data, stream, runs, stderr := encodeChunk(chunk)
	err := s.w.do(ctx, func(tx *sql.Tx) error {
		end, err := scanEnd(tx.Stmt(s.stmt.wOutputEnd).QueryRow(id))
		if err != nil {
			return err
		}
		if len(data) > 0 {
			if _, err := tx.Stmt(s.stmt.wInsertOutput).Exec(id, end, data, stream, runs); err != nil {
				return err
			}
		}
		_, err = tx.Stmt(s.stmt.wOutputDone).Exec(id, read, end+int64(len(data)), time.Now().UTC().UnixNano(), stderr)
		return err
	})
	if err != nil {
		return fmt.Errorf("append output of job %s: %w", id, err)
	}
	return nil
}

func scanEnd(row *sql.Row) (int64, error) {
	var end int64
	err := row.Scan(&end)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return end, err
}

// ReadOutput returns up to max kept bytes of output from offset, as pieces
// of one stream each.
func (s *Store) ReadOutput(ctx context.Context, id string, offset int64, max int) ([]delegate.Output, error) {
	if offset < 0 || max < 0 {
		return nil, fmt.Errorf("read output of job %s: %w: negative offset or size", id, delegate.ErrInvalid)
	}
	rows, err := s.stmt.readOutput.QueryContext(ctx, id, offset)
	if err != nil {
		return nil, fmt.Errorf("read output of job %s: %w", id, err)
	}
	defer rows.Close()
	var (
		out  []delegate.Output
		left = max
	)
	for left > 0 && rows.Next() {
		var (
			at     int64
			data   []byte
			stream int
			runs   []byte
		)
		if err := rows.Scan(&at, &data, &stream, &runs); err != nil {
			return nil, fmt.Errorf("read output of job %s: %w", id, err)
		}
		pieces, err := decodeChunk(data, stream, runs)
		if err != nil {
			return nil, fmt.Errorf("read output of job %s at %d: %w", id, at, err)
		}
		skip := max0(offset - at) // the part of the row before offset
		for _, p := range pieces {
			d := p.Data[min(int64(len(p.Data)), skip):]
			skip -= int64(len(p.Data)) - int64(len(d))
			d = d[:min(len(d), left)]
			out = delegate.AppendOutput(out, p.Stream, d)
			left -= len(d)
		}
	}
	return out, rows.Err()
}

func max0(n int64) int64 { return max(n, 0) }

// OutputSize is how many bytes of output are kept for the job.
func (s *Store) OutputSize(ctx context.Context, id string) (int64, error) {
	n, err := scanEnd(s.stmt.outputEnd.QueryRowContext(ctx, id))
	if err != nil {
		return 0, fmt.Errorf("output size of job %s: %w", id, err)
	}
	return n, nil
}

// StreamTail returns the last max bytes kept of one stream and how many
// are kept in all. The rows are read from the end; stderr's through its
// index.
func (s *Store) StreamTail(ctx context.Context, id string, stream delegate.Stream, max int) ([]byte, int64, error) {
	if max < 0 || (stream != delegate.StreamStdout && stream != delegate.StreamStderr) {
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w: stream %s, size %d", id, delegate.ErrInvalid, stream, max)
	}
	var stderrKept int64
	if err := s.stmt.stderrKept.QueryRowContext(ctx, id).Scan(&stderrKept); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, 0, delegate.JobNotFound(id)
		}
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
	}
	kept := stderrKept
	q := s.stmt.stderrTail
	if stream == delegate.StreamStdout {
		size, err := s.OutputSize(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		kept, q = size-stderrKept, s.stmt.stdoutTail
	}
	if kept == 0 || max == 0 {
		return nil, kept, nil
	}
	rows, err := q.QueryContext(ctx, id)
	if err != nil {
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
	}
	defer rows.Close()
	var parts [][]byte // newest first
	n := 0
	for n < max && rows.Next() {
		var (
			data []byte
			st   int
			runs []byte
		)
		if err := rows.Scan(&data, &st, &runs); err != nil {
			return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
		}
		pieces, err := decodeChunk(data, st, runs)
		if err != nil {
			return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
		}
		for i := len(pieces) - 1; i >= 0 && n < max; i-- {
			p := pieces[i]
			if p.Stream == stream || (stream == delegate.StreamStdout && p.Stream == delegate.StreamCombined) {
				d := p.Data[max0(int64(len(p.Data)-(max-n))):]
				parts = append(parts, d)
				n += len(d)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
	}
	tail := make([]byte, 0, n)
	for i := len(parts) - 1; i >= 0; i-- {
		tail = append(tail, parts[i]...)
	}
	return tail, kept, nil
}

// AddArtifact records (or replaces) a collected artifact.
func (s *Store) AddArtifact(ctx context.Context, id string, a delegate.Artifact) error {
	err := s.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Stmt(s.stmt.wArtifact).Exec(id, a.Name, a.Size, a.SHA256, a.Skipped)
		return err
	})
	if err != nil {
		return fmt.Errorf("add artifact to job %s: %w", id, err)
	}
	return nil
}

// Artifacts lists the job's artifacts by name.
func (s *Store) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	rows, err := s.stmt.artifacts.QueryContext(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("artifacts of job %s: %w", id, err)
	}
	defer rows.Close()
	arts := []delegate.Artifact{}
	for rows.Next() {
		var a delegate.Artifact
		if err := rows.Scan(&a.Name, &a.Size, &a.SHA256, &a.Skipped); err != nil {
			return nil, fmt.Errorf("artifacts of job %s: %w", id, err)
		}
		arts = append(arts, a)
	}
	return arts, rows.Err()
}

// Finishes counts the jobs that reached a terminal status, in every
// process sharing the database.
func (s *Store) Finishes(ctx context.Context) (int64, error) {
	var n int64
	if err := s.stmt.finishes.QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, fmt.Errorf("finished jobs: %w", err)
	}
	return n, nil
}
