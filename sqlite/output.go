package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
)

// OutputStore keeps what jobs write: each append is one row of
// job_output, its bytes in order with their streams (see streams.go). It
// implements delegate.OutputStore on a DB.
type OutputStore struct {
	db   *DB
	stmt struct {
		outputEnd, readOutput, stdoutTail, stderrTail, stderrKept *readStmt  // readers
		wOutputEnd, wInsertOutput, wOutputDone                    *writeStmt // writer
	}
}

var _ delegate.OutputStore = (*OutputStore)(nil)

// outputEnd is where the next output chunk of a job goes (the primary key
// finds the last chunk; no scan of the others).
const outputEnd = `SELECT offset + length(data) FROM job_output WHERE job_id = ? ORDER BY offset DESC LIMIT 1`

func newOutputStore(ctx context.Context, db *DB) (*OutputStore, error) {
	s := &OutputStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.outputEnd, outputEnd},
		{db.rdb, &s.stmt.readOutput, `SELECT offset, data, stream, runs FROM job_output WHERE job_id = ? AND offset + length(data) > ? ORDER BY offset`},
		// The rows with some of a stream, from the end (see the migration).
		{db.rdb, &s.stmt.stdoutTail, `SELECT data, stream, runs FROM job_output WHERE job_id = ? AND stream != 2 ORDER BY offset DESC`},
		{db.rdb, &s.stmt.stderrTail, `SELECT data, stream, runs FROM job_output WHERE job_id = ? AND stream >= 2 ORDER BY offset DESC`},
		{db.rdb, &s.stmt.stderrKept, `SELECT stderr_kept FROM jobs WHERE id = ?`},
		{db.wdb, &s.stmt.wOutputEnd, outputEnd},
		{db.wdb, &s.stmt.wInsertOutput, `INSERT INTO job_output (job_id, offset, data, stream, runs) VALUES (?, ?, ?, ?, ?)`},
		{db.wdb, &s.stmt.wOutputDone, `UPDATE jobs SET output_read = ?2, output_bytes = max(output_bytes, ?3), updated_at = ?4,
			stderr_kept = stderr_kept + ?5 WHERE id = ?1`},
	})
}

// AppendOutput adds a chunk after the output kept so far and records how
// far the backend's output was consumed, in one transaction (a restarted
// engine then reads on from exactly there). The chunk is one row, however
// many times it changes streams.
func (s *OutputStore) AppendOutput(ctx context.Context, id string, chunk []delegate.Output, read int64) error {
	data, stream, runs, stderr := encodeChunk(chunk)
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, id); err != nil {
			return err
		}
		end, err := scanEnd(s.stmt.wOutputEnd.in(tx).QueryRow(id))
		if err != nil {
			return err
		}
		if len(data) > 0 {
			if _, err := s.stmt.wInsertOutput.in(tx).Exec(id, end, data, stream, runs); err != nil {
				return err
			}
		}
		_, err = s.stmt.wOutputDone.in(tx).Exec(id, read, end+int64(len(data)), time.Now().UTC().UnixNano(), stderr)
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
func (s *OutputStore) ReadOutput(ctx context.Context, id string, offset int64, max int) ([]delegate.Output, error) {
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
func (s *OutputStore) OutputSize(ctx context.Context, id string) (int64, error) {
	n, err := scanEnd(s.stmt.outputEnd.QueryRowContext(ctx, id))
	if err != nil {
		return 0, fmt.Errorf("output size of job %s: %w", id, err)
	}
	return n, nil
}

// StreamTail returns the last max bytes kept of one stream and how many
// are kept in all. The rows are read from the end; stderr's through its
// index.
func (s *OutputStore) StreamTail(ctx context.Context, id string, stream delegate.Stream, max int) ([]byte, int64, error) {
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
