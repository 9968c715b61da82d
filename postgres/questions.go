package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// QuestionStore keeps the questions jobs ask, each written before the ask
// is acknowledged, so that an open question survives the server. It
// implements delegate.QuestionStore on a DB.
type QuestionStore struct{ db *DB }

var _ delegate.QuestionStore = (*QuestionStore)(nil)

const questionColumns = `id, origin, message, form, asked_at, expires_at, answer`

// AddQuestion stores a question unless its job has one with its id; see
// delegate.QuestionStore. A racing insert of the same id waits for the
// first to commit and inserts nothing; the read after it (a statement of
// its own, so a snapshot of its own) sees the first one.
func (s *QuestionStore) AddQuestion(ctx context.Context, q *delegate.Question) (*delegate.Question, bool, error) {
	form, err := json.Marshal(q.Form)
	if err != nil {
		return nil, false, fmt.Errorf("question %s of job %s: %w", q.ID, q.JobID, err)
	}
	var (
		stored *delegate.Question
		added  bool
	)
	err = s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO job_questions (job_id, `+questionColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)
			ON CONFLICT (job_id, id) DO NOTHING`, q.JobID, q.ID, clean(q.From), clean(q.Message), string(form), toTS(q.AskedAt), toTS(q.Expires))
		if isForeignKey(err) {
			return delegate.JobNotFound(q.JobID)
		}
		if err != nil {
			return err
		}
		added = tag.RowsAffected() == 1
		stored, err = scanQuestion(q.JobID, tx.QueryRow(ctx, `SELECT `+questionColumns+` FROM job_questions WHERE job_id = $1 AND id = $2`, q.JobID, q.ID))
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("add question %s to job %s: %w", q.ID, q.JobID, err)
	}
	return stored, added, nil
}

// Questions returns a job's questions, oldest first.
func (s *QuestionStore) Questions(ctx context.Context, jobID string) ([]delegate.Question, error) {
	rows, err := s.db.pool.Query(ctx, `SELECT `+questionColumns+` FROM job_questions WHERE job_id = $1`+jobIsMine+` ORDER BY seq`,
		jobID, delegate.ReaderOf(ctx))
	if err != nil {
		return nil, fmt.Errorf("questions of job %s: %w", jobID, err)
	}
	defer rows.Close()
	qs := []delegate.Question{}
	for rows.Next() {
		q, err := scanQuestion(jobID, rows)
		if err != nil {
			return nil, fmt.Errorf("questions of job %s: %w", jobID, err)
		}
		qs = append(qs, *q)
	}
	return qs, rows.Err()
}

// AnswerQuestion records the answer to an unanswered question; see
// delegate.QuestionStore. The UPDATE's condition (no answer yet) is
// checked again on the row as the racing answer left it: one wins.
func (s *QuestionStore) AnswerQuestion(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
	answer, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("answer question %s of job %s: %w", id, jobID, err)
	}
	var (
		stored   *delegate.Question
		answered bool
	)
	reader := delegate.ReaderOf(ctx)
	err = s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE job_questions SET answer = $3 WHERE job_id = $1 AND id = $2 AND answer IS NULL
			AND ($4 = '' OR EXISTS (SELECT 1 FROM jobs o WHERE o.id = $1 AND o.principal = $4))`, jobID, id, string(answer), reader)
		if err != nil {
			return err
		}
		answered = tag.RowsAffected() == 1
		stored, err = scanQuestion(jobID, tx.QueryRow(ctx, `SELECT `+questionColumns+` FROM job_questions WHERE job_id = $1 AND id = $3`+jobIsMine,
			jobID, reader, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return delegate.QuestionNotFound(jobID, id)
		}
		return err
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("answer question %s of job %s: %w", id, jobID, err)
	case !answered:
		return stored, fmt.Errorf("question %s of job %s was answered already (%s): %w", id, jobID, stored.Answer.Action, delegate.ErrConflict)
	}
	return stored, nil
}

func scanQuestion(jobID string, row pgx.Row) (*delegate.Question, error) {
	q := delegate.Question{JobID: jobID}
	var (
		form           string
		answer         *string
		asked, expires ts
	)
	if err := row.Scan(&q.ID, &q.From, &q.Message, &form, &asked, &expires, &answer); err != nil {
		return nil, err
	}
	q.AskedAt, q.Expires = asked.time(), expires.time()
	if err := json.Unmarshal([]byte(form), &q.Form); err != nil {
		return nil, fmt.Errorf("question %s: stored form: %w", q.ID, err)
	}
	if answer != nil {
		q.Answer = new(delegate.Answer)
		if err := json.Unmarshal([]byte(*answer), q.Answer); err != nil {
			return nil, fmt.Errorf("question %s: stored answer: %w", q.ID, err)
		}
	}
	return &q, nil
}
