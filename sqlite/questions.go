package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// QuestionStore keeps the questions jobs ask, each written before the ask
// is acknowledged, so that an open question survives the server being
// killed. It implements delegate.QuestionStore on a DB.
type QuestionStore struct {
	db   *DB
	stmt struct {
		questions              *readStmt  // reader
		wJob, wInsert, wAnswer *writeStmt // writer
		wQuestion              *writeStmt // writer: a question, in the write's transaction
	}
}

var _ delegate.QuestionStore = (*QuestionStore)(nil)

const questionColumns = `id, origin, message, form, asked_at, expires_at, answer`

func newQuestionStore(ctx context.Context, db *DB) (*QuestionStore, error) {
	s := &QuestionStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.questions, `SELECT ` + questionColumns + ` FROM job_questions WHERE job_id = ?1` + jobIsMine + ` ORDER BY rowid`},
		{db.wdb, &s.stmt.wJob, `SELECT 1 FROM jobs WHERE id = ?`},
		{db.wdb, &s.stmt.wInsert, `INSERT INTO job_questions (job_id, ` + questionColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)
			ON CONFLICT (job_id, id) DO NOTHING`},
		{db.wdb, &s.stmt.wAnswer, `UPDATE job_questions SET answer = ?3 WHERE job_id = ?1 AND id = ?2 AND answer IS NULL
			AND (?4 = '' OR EXISTS (SELECT 1 FROM jobs j WHERE j.id = ?1 AND j.principal = ?4))`},
		{db.wdb, &s.stmt.wQuestion, `SELECT ` + questionColumns + ` FROM job_questions WHERE job_id = ?1 AND id = ?3` + jobIsMine},
	})
}

// AddQuestion stores a question unless its job has one with its id; see
// delegate.QuestionStore.
func (s *QuestionStore) AddQuestion(ctx context.Context, q *delegate.Question) (*delegate.Question, bool, error) {
	form, err := json.Marshal(q.Form)
	if err != nil {
		return nil, false, fmt.Errorf("question %s of job %s: %w", q.ID, q.JobID, err)
	}
	var (
		stored *delegate.Question
		added  bool
	)
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		var one int
		if err := s.stmt.wJob.in(tx).QueryRow(q.JobID).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return delegate.JobNotFound(q.JobID)
		} else if err != nil {
			return err
		}
		res, err := s.stmt.wInsert.in(tx).Exec(q.JobID, q.ID, q.From, q.Message, string(form), toNanos(q.AskedAt), toNanos(q.Expires))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		added = n == 1
		stored, err = scanQuestion(q.JobID, s.stmt.wQuestion.in(tx).QueryRow(q.JobID, "", q.ID))
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("add question %s to job %s: %w", q.ID, q.JobID, err)
	}
	return stored, added, nil
}

// Questions returns a job's questions, oldest first.
func (s *QuestionStore) Questions(ctx context.Context, jobID string) ([]delegate.Question, error) {
	rows, err := s.stmt.questions.QueryContext(ctx, jobID, delegate.ReaderOf(ctx))
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
// delegate.QuestionStore.
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
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		res, err := s.stmt.wAnswer.in(tx).Exec(jobID, id, string(answer), reader)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		answered = n == 1
		stored, err = scanQuestion(jobID, s.stmt.wQuestion.in(tx).QueryRow(jobID, reader, id))
		if errors.Is(err, sql.ErrNoRows) {
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

func scanQuestion(jobID string, row scanner) (*delegate.Question, error) {
	q := delegate.Question{JobID: jobID}
	var (
		form           string
		answer         sql.NullString
		asked, expires int64
	)
	if err := row.Scan(&q.ID, &q.From, &q.Message, &form, &asked, &expires, &answer); err != nil {
		return nil, err
	}
	q.AskedAt, q.Expires = fromNanos(asked), fromNanos(expires)
	if err := json.Unmarshal([]byte(form), &q.Form); err != nil {
		return nil, fmt.Errorf("question %s: stored form: %w", q.ID, err)
	}
	if answer.Valid {
		q.Answer = new(delegate.Answer)
		if err := json.Unmarshal([]byte(answer.String), q.Answer); err != nil {
			return nil, fmt.Errorf("question %s: stored answer: %w", q.ID, err)
		}
	}
	return &q, nil
}
