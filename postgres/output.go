package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// OutputStore keeps what jobs write: each append is one row of
// job_output, its bytes in order with their streams (see streams.go). It
// implements delegate.OutputStore on a DB.
type OutputStore struct{ db *DB }

var _ delegate.OutputStore = (*OutputStore)(nil)

// appendOutput moves the job's end of output on by the chunk ($2 bytes,
// $6 of them stderr) and records how far the backend's output was read,
// in its row (locked until the commit, so appends of one job take their
// turns), and inserts the chunk at the old end: one statement.
const appendOutput = `WITH j AS (
		UPDATE jobs SET output_kept = output_kept + $2, output_read = $3, output_bytes = greatest(output_bytes, output_kept + $2),
			stderr_kept = stderr_kept + $6, updated_at = $7
		WHERE id = $1 AND ($9::text IS NULL OR (owner = $9 AND epoch = $10)) RETURNING output_kept - $2 AS at
	), ins AS (
		INSERT INTO job_output (job_id, "offset", data, stream, runs) SELECT $1, at, $4, $5, $8 FROM j WHERE $2 > 0
	)
	SELECT at FROM j`

// AppendOutput adds a chunk after the output kept so far and records how
// far the backend's output was consumed, in one statement (a restarted
// engine then reads on from exactly there). The chunk is one row, however
// many times it changes streams.
func (s *OutputStore) AppendOutput(ctx context.Context, id string, chunk []delegate.Output, read int64) error {
	data, stream, runs, stderr := encodeChunk(chunk)
	if data == nil {
		data = []byte{}
	}
	var owner *string
	f, fenced := delegate.FenceOf(ctx)
	if fenced {
		owner = &f.Owner
	}
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var at int64
		err := tx.QueryRow(ctx, appendOutput, id, int64(len(data)), read, data, int16(stream), stderr, toTS(time.Now()), runs,
			owner, f.Epoch).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.db.refusal(ctx, tx, id, f)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("append output of job %s: %w", id, err)
	}
	return nil
}

// ReadOutput returns up to size kept bytes of output from offset, as pieces
// of one stream each.
func (s *OutputStore) ReadOutput(ctx context.Context, id string, offset int64, size int) ([]delegate.Output, error) {
	if offset < 0 || size < 0 {
		return nil, fmt.Errorf("read output of job %s: %w: negative offset or size", id, delegate.ErrInvalid)
	}
	// The rows that hold bytes from offset on, until size bytes: the row
	// where offset falls, and those after it that start before offset+size.
	rows, err := s.db.pool.Query(ctx, `SELECT "offset", data, stream, runs FROM job_output
		WHERE job_id = $1 AND "offset" + length(data) > $2 AND "offset" < $2 + $3 ORDER BY "offset"`, id, offset, int64(size))
	if err != nil {
		return nil, fmt.Errorf("read output of job %s: %w", id, err)
	}
	defer rows.Close()
	var (
		out  []delegate.Output
		left = size
	)
	for left > 0 && rows.Next() {
		var (
			at     int64
			data   []byte
			stream int16
			runs   []byte
		)
		if err := rows.Scan(&at, &data, &stream, &runs); err != nil {
			return nil, fmt.Errorf("read output of job %s: %w", id, err)
		}
		pieces, err := decodeChunk(data, int(stream), runs)
		if err != nil {
			return nil, fmt.Errorf("read output of job %s at %d: %w", id, at, err)
		}
		skip := max(offset-at, 0) // the part of the row before offset
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

// OutputSize is how many bytes of output are kept for the job (0 for a
// job that does not exist, as the SQLite store says).
func (s *OutputStore) OutputSize(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.db.pool.QueryRow(ctx, `SELECT output_kept FROM jobs WHERE id = $1`, id).Scan(&n)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("output size of job %s: %w", id, err)
	}
	return n, nil
}

// StreamTail returns the last size bytes kept of one stream and how many
// are kept in all. The rows are read from the end; stderr's through its
// index.
func (s *OutputStore) StreamTail(ctx context.Context, id string, stream delegate.Stream, size int) ([]byte, int64, error) {
	if size < 0 || (stream != delegate.StreamStdout && stream != delegate.StreamStderr) {
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w: stream %s, size %d", id, delegate.ErrInvalid, stream, size)
	}
	var outputKept, stderrKept int64
	if err := s.db.pool.QueryRow(ctx, `SELECT output_kept, stderr_kept FROM jobs WHERE id = $1`, id).Scan(&outputKept, &stderrKept); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, 0, delegate.JobNotFound(id)
		}
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
	}
	kept := stderrKept
	q := `SELECT data, stream, runs FROM job_output WHERE job_id = $1 AND stream >= 2 ORDER BY "offset" DESC`
	if stream == delegate.StreamStdout {
		kept = outputKept - stderrKept
		q = `SELECT data, stream, runs FROM job_output WHERE job_id = $1 AND stream <> 2 ORDER BY "offset" DESC`
	}
	if kept == 0 || size == 0 {
		return nil, kept, nil
	}
	rows, err := s.db.pool.Query(ctx, q, id)
	if err != nil {
		return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
	}
	defer rows.Close()
	var parts [][]byte // newest first
	n := 0
	for n < size && rows.Next() {
		var (
			data []byte
			st   int16
			runs []byte
		)
		if err := rows.Scan(&data, &st, &runs); err != nil {
			return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
		}
		pieces, err := decodeChunk(data, int(st), runs)
		if err != nil {
			return nil, 0, fmt.Errorf("tail of the output of job %s: %w", id, err)
		}
		for i := len(pieces) - 1; i >= 0 && n < size; i-- {
			p := pieces[i]
			if p.Stream == stream || (stream == delegate.StreamStdout && p.Stream == delegate.StreamCombined) {
				d := p.Data[max(len(p.Data)-(size-n), 0):]
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
