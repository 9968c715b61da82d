package mock

import (
	"context"

	"github.com/delegate-dev/delegate"
)

// QuestionService is a delegate.QuestionService whose every method calls
// the function field of the same name with Fn appended (the adapters'
// test double for questions). Calling a method whose function is not set
// panics: the test did not expect it.
type QuestionService struct {
	AskFn         func(ctx context.Context, jobID string, q delegate.Question) (*delegate.Question, error)
	QuestionsFn   func(ctx context.Context, jobID string) ([]delegate.Question, error)
	AwaitAnswerFn func(ctx context.Context, jobID, id string) (*delegate.Question, error)
	AnswerFn      func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error)
}

var _ delegate.QuestionService = (*QuestionService)(nil)

func unexpectedQuestion(method string) {
	panic("mock.QuestionService: unexpected call to " + method + " (set " + method + "Fn)")
}

func (s *QuestionService) Ask(ctx context.Context, jobID string, q delegate.Question) (*delegate.Question, error) {
	if s.AskFn == nil {
		unexpectedQuestion("Ask")
	}
	return s.AskFn(ctx, jobID, q)
}

func (s *QuestionService) Questions(ctx context.Context, jobID string) ([]delegate.Question, error) {
	if s.QuestionsFn == nil {
		unexpectedQuestion("Questions")
	}
	return s.QuestionsFn(ctx, jobID)
}

func (s *QuestionService) AwaitAnswer(ctx context.Context, jobID, id string) (*delegate.Question, error) {
	if s.AwaitAnswerFn == nil {
		unexpectedQuestion("AwaitAnswer")
	}
	return s.AwaitAnswerFn(ctx, jobID, id)
}

func (s *QuestionService) Answer(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
	if s.AnswerFn == nil {
		unexpectedQuestion("Answer")
	}
	return s.AnswerFn(ctx, jobID, id, a)
}
