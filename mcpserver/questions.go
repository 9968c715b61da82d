package mcpserver

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The plain path to a job's questions, for clients without the Tasks
// extension: wait_job returns as soon as the job waits for answers, with
// its open questions, and answer_job answers them. Answering is a tool of
// its own, not a field of wait_job: wait_job stays read-only, and a
// client that asks its person before a tool that changes something runs
// asks before an answer goes (an egress approval, say), not before every
// wait.

// AnswerIn is an answer to a question (an elicitation's result).
type AnswerIn struct {
	Action  delegate.AnswerAction `json:"action"`
	Content map[string]any        `json:"content,omitempty"`
}

// QuestionOut is an open question, with the form of its answer (MCP's
// requestedSchema).
type QuestionOut struct {
	ID      string `json:"id"`
	Message string `json:"message"`
	Form    any    `json:"requested_schema"`
}

// AnswerJobIn is answer_job's input.
type AnswerJobIn struct {
	JobID   string              `json:"job_id"`
	Answers map[string]AnswerIn `json:"answers"`
}

// AnswerJobOut says what answer_job did.
type AnswerJobOut struct {
	// Answered names the questions answered now; the others were not
	// open (answered already, by a retry of this call say, or closed).
	Answered []string `json:"answered"`
}

func addAnswerTool(ts *Tools, h *handlers) {
	if h.qs == nil {
		return
	}
	addTool(ts, &mcp.Tool{
		Name:         "answer_job",
		Description:  "Answer wait_job's questions: {id: {action: accept|decline|cancel, content}}.",
		InputSchema:  answerSchema(),
		Annotations:  annotations(false, false, true, false),
		OutputSchema: outputSchema[AnswerJobOut](),
	}, h.answer)
}

// answerSchema is AnswerJobIn's with answers an open object: the
// description shows its shape in fewer bytes than its nested schema, and
// the decoder refuses a wrong one naming the field all the same.
func answerSchema() *jsonschema.Schema {
	s := inputSchema[AnswerJobIn]()
	*at(s, "answers") = jsonschema.Schema{Type: "object"}
	return s
}

// answer gives answers to a job's questions. Answers to questions that
// are not open are ignored, as tasks/update ignores them; one that does
// not fit its question's form is an error naming it (those before it in
// the order of ids are kept).
func (h *handlers) answer(ctx context.Context, _ *mcp.CallToolRequest, in *AnswerJobIn) (AnswerJobOut, error) {
	qs := h.qs // addAnswerTool checked
	if len(in.Answers) == 0 {
		return AnswerJobOut{}, &delegate.FieldError{Field: "answers", Rule: "required: {question id: {action, content}}"}
	}
	if _, err := h.svc.Get(ctx, in.JobID); err != nil {
		return AnswerJobOut{}, err
	}
	out := AnswerJobOut{Answered: []string{}}
	for _, id := range slices.Sorted(maps.Keys(in.Answers)) {
		a := in.Answers[id]
		_, err := qs.Answer(ctx, in.JobID, id, delegate.Answer{Action: a.Action, Content: a.Content, By: "answer_job"})
		var fe *delegate.FieldError
		switch kind := delegate.ErrorKind(err); {
		case err == nil:
			out.Answered = append(out.Answered, id)
		case kind == delegate.KindConflict, kind == delegate.KindTerminal:
		case errors.As(err, &fe):
			return out, &delegate.FieldError{Field: "answers." + id + "." + fe.Field, Rule: fe.Rule}
		case kind == delegate.KindNotFound:
			return out, &delegate.FieldError{Field: "answers." + id, Rule: "the job has no question " + id}
		default:
			return out, err
		}
	}
	return out, nil
}

// waitOrAsk waits until the job ends, asks a question, or ctx is done, and
// returns the job then and its open questions. Questions are looked for
// every second while the service waits (another process may take them).
func (h *handlers) waitOrAsk(ctx context.Context, id string) (*delegate.Job, []QuestionOut, error) {
	qs := h.qs
	if qs == nil {
		j, err := h.svc.Wait(ctx, id)
		return j, nil, err
	}
	asked := func() (*delegate.Job, []QuestionOut, error) {
		open, err := openQuestions(ctx, qs, id)
		if err != nil || len(open) == 0 {
			return nil, nil, err
		}
		j, err := h.svc.Get(context.WithoutCancel(ctx), id)
		return j, open, err
	}
	if j, open, err := asked(); err != nil || open != nil {
		return j, open, err
	}
	wctx, stop := context.WithCancel(ctx)
	// The look-out ends with the wait, which waits for it.
	var lookout sync.WaitGroup
	defer lookout.Wait()
	defer stop()
	found := make(chan []QuestionOut, 1)
	lookout.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			if open, _ := openQuestions(wctx, qs, id); len(open) > 0 {
				found <- open
				stop()
				return
			}
		}
	})
	j, err := h.svc.Wait(wctx, id)
	select {
	case open := <-found:
		j, err := h.svc.Get(context.WithoutCancel(ctx), id)
		return j, open, err
	default:
		return j, nil, err
	}
}

func openQuestions(ctx context.Context, qs delegate.QuestionService, id string) ([]QuestionOut, error) {
	all, err := qs.Questions(ctx, id)
	if err != nil {
		return nil, err
	}
	var open []QuestionOut
	for _, q := range all {
		if q.State == delegate.QuestionOpen {
			open = append(open, QuestionOut{ID: q.ID, Message: q.Message, Form: q.Form})
		}
	}
	return open, nil
}
