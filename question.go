package delegate

import (
	"context"
	"time"
)

// A job can wait for a person's answer. It asks a question (a status line
// or a callback, see docs/manifest.md), which is stored on the job before the
// ask is acknowledged and carried to the person as an MCP elicitation:
// a message and a form of flat primitive fields (Form). The person
// answers through the QuestionService (an MCP client's tasks/update, the
// CLI, the dashboard); the job finds the answer in a file of its
// workspace, or asks the callback server for it. Nothing stops the job's
// clock meanwhile: a job that waits past its timeout ends as timeout, and
// its unanswered questions close with it.
//
// A part of delegate may ask on a job's behalf too (the egress proxy, when
// a job's network policy says to ask before it reaches a name the
// allowlist does not hold): such a question has a From of its own, an id
// delegate makes, an expiry, and its answer goes to that part, not into
// the job's workspace.

// QuestionFromJob is the From of a question the job itself asked.
const QuestionFromJob = "job"

// Question is one question on a job.
type Question struct {
	JobID string `json:"job_id"`
	// ID names the question within its job, for ever: asking again with
	// the same id and the same question is the same question (a retry),
	// with anything else a conflict. A job chooses its ids (see
	// ValidQuestionID); delegate makes the ids of questions it asks on a
	// job's behalf (they hold a colon, which a job's cannot).
	ID string `json:"id"`
	// From is who asked: QuestionFromJob, or the part of delegate that
	// asked on the job's behalf ("egress").
	From    string `json:"from"`
	Message string `json:"message"`
	// Form is what the answer holds (MCP's requestedSchema).
	Form    Form      `json:"requested_schema"`
	AskedAt time.Time `json:"asked_at"`
	// Expires, if set, is when the question closes unanswered (a stored
	// time, not a timer, so that a restart keeps it). Zero: it stays open
	// until the job ends.
	Expires time.Time `json:"expires_at,omitzero"`
	// Answer is nil while the question is unanswered.
	Answer *Answer `json:"answer,omitempty"`
	// State is where the question stands, as the service read it (not
	// stored: it follows from the answer, the expiry and the job's status).
	State QuestionState `json:"state"`
}

// QuestionState is where a question stands.
type QuestionState string

const (
	// QuestionOpen waits for an answer.
	QuestionOpen QuestionState = "open"
	// QuestionAnswered has its answer.
	QuestionAnswered QuestionState = "answered"
	// QuestionClosed was never answered: it expired, or its job ended.
	QuestionClosed QuestionState = "closed"
)

// StateAt is where q stands at now, for a job whose status is st.
func (q *Question) StateAt(st Status, now time.Time) QuestionState {
	switch {
	case q.Answer != nil:
		return QuestionAnswered
	case st.Terminal(), !q.Expires.IsZero() && !now.Before(q.Expires):
		return QuestionClosed
	}
	return QuestionOpen
}

// AnswerAction is what the person did with the form (MCP's elicitation
// actions): accept it (with its content), decline it, or dismiss it.
type AnswerAction string

const (
	AnswerAccept  AnswerAction = "accept"
	AnswerDecline AnswerAction = "decline"
	AnswerCancel  AnswerAction = "cancel"
)

// Answer is a person's answer to a question.
type Answer struct {
	Action AnswerAction `json:"action"`
	// Content holds the form's values by field name, for AnswerAccept
	// only: a string, a float64 (number and integer fields) or a bool.
	Content map[string]any `json:"content,omitempty"`
	// At is when it was recorded (set by the service).
	At time.Time `json:"answered_at"`
	// By says through what it came ("tasks/update", "cli"...), for the
	// record.
	By string `json:"by,omitempty"`
}

// Bounds of what a question may hold: a question is read by a person, and
// a job that asks many must not flood them (nor the store).
const (
	MaxQuestionMessage = 4000 // bytes
	// MaxOpenQuestions a job may have waiting at once; MaxQuestions it
	// may ask in all.
	MaxOpenQuestions = 16
	MaxQuestions     = 200
	// MaxAnswerString caps one string value of an answer (a field's own
	// maxLength may say less).
	MaxAnswerString = 8000 // bytes
)

// QuestionStore keeps the questions asked on jobs, durably: an open
// question survives a restart of the server.
type QuestionStore interface {
	// AddQuestion stores q, unless its job already has a question with
	// its id: either way it returns the question stored under that id,
	// and whether this call added it. A job that does not exist is a
	// *NotFoundError.
	AddQuestion(ctx context.Context, q *Question) (stored *Question, added bool, err error)
	// Questions returns a job's questions, oldest first (none for a job
	// that has none, or does not exist). State is not set.
	Questions(ctx context.Context, jobID string) ([]Question, error)
	// AnswerQuestion records the answer to a question that has none, and
	// returns the question with it. A question that has an answer keeps
	// it: the error wraps ErrConflict, and the question is returned as
	// stored. No such question: a *NotFoundError.
	AnswerQuestion(ctx context.Context, jobID, id string, a Answer) (*Question, error)
}

// QuestionService puts questions on jobs and takes their answers. The
// engine implements it; the adapters use it: the callback endpoints for
// a job's questions (after CallbackService.Authenticate), MCP Tasks, the
// CLI and the dashboard for the person's side.
//
// Errors wrap the sentinels of this package: ErrNotFound (no such job or
// question), ErrInvalid (a *FieldError names the field of the question or
// the answer at fault), ErrTerminal (the job has ended: its questions
// are closed), ErrConflict (an id asked again with another question; a
// question answered already, or expired).
type QuestionService interface {
	// Ask puts a question on a running job and stores it before it
	// returns. q.From is QuestionFromJob when empty; a question from
	// elsewhere may leave ID empty for the service to make one. Asking
	// again what was asked (the same id, message and form) returns the
	// stored question.
	Ask(ctx context.Context, jobID string, q Question) (*Question, error)
	// Questions returns a job's questions, oldest first, with their State.
	Questions(ctx context.Context, jobID string) ([]Question, error)
	// AwaitAnswer blocks until a question is no longer open (answered,
	// expired, or its job ended) or ctx is done, and returns it as it is
	// then. It sees answers given in other processes sharing the store.
	AwaitAnswer(ctx context.Context, jobID, id string) (*Question, error)
	// Answer answers an open question: the answer is checked against the
	// question's form (defaults filled in), stored, and delivered.
	Answer(ctx context.Context, jobID, id string, a Answer) (*Question, error)
}

// QuestionNotFound is the error for an id that names no question of job.
func QuestionNotFound(job, id string) *NotFoundError {
	return &NotFoundError{Resource: "question", ID: id, Of: "job " + job}
}
