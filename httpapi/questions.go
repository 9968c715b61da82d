package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// A job that reaches the callback server may ask a question there, and
// wait there for its answer (a job without network asks in a status line
// and finds the answer in a file: see docs/manifest.md). Services.Questions
// takes them (the engine, as cmd/ wires it).
//
//	POST /callback/{job_id}/question   {"id","message","requestedSchema"}
//	GET  /callback/{job_id}/answer/{question_id}?wait=SECONDS
//
// The GET is a long poll: it answers 200 with the answer as soon as there
// is one, 204 when wait seconds (default DefaultAnswerWait, at most
// MaxAnswerWait) pass without one (ask again), 410 once the question is
// closed unanswered (the job's end; an expiry).
const (
	DefaultAnswerWait = 30 * time.Second
	MaxAnswerWait     = 60 * time.Second
)

// questionBody is what a job sends to ask.
type questionBody struct {
	JobID           *string         `json:"job_id"`
	ID              string          `json:"id"`
	Message         string          `json:"message"`
	RequestedSchema json.RawMessage `json:"requestedSchema"`
}

// answerBody is an answer as the job reads it: the same object as the
// answer file of docs/manifest.md's "Reporting from inside a job".
type answerBody struct {
	ID      string                `json:"id"`
	Action  delegate.AnswerAction `json:"action"`
	Content map[string]any        `json:"content,omitempty"`
	At      time.Time             `json:"answered_at"`
}

func (h *handler) questions(w http.ResponseWriter) (delegate.QuestionService, bool) {
	if h.qs == nil {
		writeError(w, http.StatusNotFound, "this server takes no questions")
	}
	return h.qs, h.qs != nil
}

// ask puts a job's question on it: stored before the answer.
func (h *handler) ask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("job_id")
	qs, ok := h.questions(w)
	if !ok {
		return
	}
	if _, ok := h.admit(w, r, id, "question"); !ok {
		return
	}
	raw, ok := h.readBody(w, r)
	if !ok {
		return
	}
	var b questionBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, `body must be a JSON object {"id","message","requestedSchema"}: `+strings.TrimPrefix(err.Error(), "json: "))
		return
	}
	if b.JobID != nil && *b.JobID != id {
		writeError(w, http.StatusBadRequest, "job_id in the body differs from the job in the path")
		return
	}
	q := delegate.Question{ID: b.ID, From: delegate.QuestionFromJob, Message: b.Message}
	if len(b.RequestedSchema) > 0 && string(b.RequestedSchema) != "null" {
		form, err := delegate.ParseForm(b.RequestedSchema)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		q.Form = form
	}
	// A request cut off by its client must not leave the ask half-made.
	stored, err := qs.Ask(context.WithoutCancel(r.Context()), id, q)
	if err != nil {
		h.questionError(w, id, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"job_id": id, "id": stored.ID, "state": string(stored.State)})
}

// awaitAnswer answers with a question's answer, waiting for it.
func (h *handler) awaitAnswer(w http.ResponseWriter, r *http.Request) {
	id, qid := r.PathValue("job_id"), r.PathValue("question_id")
	qs, ok := h.questions(w)
	if !ok {
		return
	}
	if _, ok := h.admit(w, r, id, "answer"); !ok {
		return
	}
	wait := DefaultAnswerWait
	if v := r.URL.Query().Get("wait"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || time.Duration(n)*time.Second > MaxAnswerWait {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("wait: must be whole seconds from 0 to %d (got %q)", int(MaxAnswerWait.Seconds()), v))
			return
		}
		wait = time.Duration(n) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	q, err := qs.AwaitAnswer(ctx, id, qid)
	switch {
	case err != nil:
		h.questionError(w, id, err)
	case r.Context().Err() != nil:
		// The job went away; nobody reads an answer.
	case q.State == delegate.QuestionAnswered:
		writeJSON(w, http.StatusOK, answerBody{ID: q.ID, Action: q.Answer.Action, Content: q.Answer.Content, At: q.Answer.At})
	case q.State == delegate.QuestionClosed:
		writeError(w, http.StatusGone, fmt.Sprintf("question %s closed unanswered", qid))
	default:
		w.WriteHeader(http.StatusNoContent) // not yet: ask again
	}
}

func (h *handler) questionError(w http.ResponseWriter, id string, err error) {
	var fe *delegate.FieldError
	if errors.As(err, &fe) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	code, msg := callbackError(err)
	if code >= http.StatusInternalServerError {
		h.opts.Logger.Error("question", "job", id, "err", err)
	}
	writeError(w, code, msg)
}
