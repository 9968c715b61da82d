// Package httpapi serves the callback endpoints through which a job
// reports progress, heartbeats and completion, and a health check. It is an
// adapter over delegate.CallbackService: parse, call the service, answer in
// small JSON. The service authenticates the job's token.
//
// It also holds what bounds delegate's HTTP servers: the cap on live MCP
// sessions (SessionLimiter), the body read limits (BodyTimeout) and the
// refusal of foreign host names on loopback (LoopbackOnly).
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
)

// DefaultBodyLimit caps a callback body.
const DefaultBodyLimit = 1 << 20

// Options tune the handler.
type Options struct {
	BodyLimit int64
	Logger    *slog.Logger
	// Answered, if set, hears the HTTP status of every callback answered
	// (delegate_callbacks_total).
	Answered func(code int)
	// MaxUnauthenticated caps the connections of a CallbackServer that
	// have not (yet) sent a job's valid token; past it the oldest of them
	// is closed. Default DefaultMaxUnauthenticated.
	MaxUnauthenticated int
	// MaxConnsPerJob caps the connections one job keeps open; past it an
	// answer closes its connection. Default DefaultMaxConnsPerJob.
	MaxConnsPerJob int
	// Rate and Burst bound one job's callbacks: Rate a second, Burst at
	// once; past them a callback gets 429. Defaults DefaultRate and
	// DefaultBurst.
	Rate  float64
	Burst int
}

// Services are the services the callback endpoints use, each by name:
// cmd/ wires them (the engine is both), so that a service the engine
// stops implementing fails the build instead of an endpoint at run time.
type Services struct {
	Callbacks delegate.CallbackService
	// Questions: a job's questions and its long poll for their answers
	// (questions.go); nil: those endpoints answer 404.
	Questions delegate.QuestionService
	// Transfers: bulk files between the server and jobs' sandboxes
	// (transfers.go); nil: GET and PUT /transfer/{id} answer 404.
	Transfers Transfers
}

// Handler serves POST /callback/{job_id}/{complete,status,heartbeat},
// the questions of questions.go, and GET /health.
func Handler(svc Services, opts Options) http.Handler {
	return newHandler(svc, opts).mux
}

func newHandler(svc Services, opts Options) *handler {
	if opts.BodyLimit <= 0 {
		opts.BodyLimit = DefaultBodyLimit
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{svc: svc.Callbacks, qs: svc.Questions, transfers: svc.Transfers, opts: opts, conns: newConnGuard(opts), rate: newRateLimit(opts)}
	mux := http.NewServeMux()
	mux.Handle("POST /callback/{job_id}/{kind}", h.counted(http.HandlerFunc(h.callback)))
	mux.Handle("POST /callback/{job_id}/question", h.counted(http.HandlerFunc(h.ask)))
	mux.Handle("GET /callback/{job_id}/answer/{question_id}", h.counted(http.HandlerFunc(h.awaitAnswer)))
	if svc.Transfers != nil {
		mux.Handle("GET /transfer/{id}", h.counted(http.HandlerFunc(h.transfer)))
		mux.Handle("PUT /transfer/{id}", h.counted(http.HandlerFunc(h.transfer)))
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// Anything else gets a JSON 404/405, never the default HTML-ish text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/callback/") {
			writeError(w, http.StatusMethodNotAllowed, "callbacks are POST /callback/{job_id}/complete|status|heartbeat|question and GET /callback/{job_id}/answer/{question_id}")
			return
		}
		writeError(w, http.StatusNotFound, "no such endpoint")
	})
	h.mux = mux
	return h
}

type handler struct {
	svc       delegate.CallbackService
	qs        delegate.QuestionService // nil: takes no questions
	transfers Transfers                // nil: serves none
	opts      Options
	mux       *http.ServeMux
	conns     *connGuard
	rate      *rateLimit
}

// body is what a job may send; fields that do not apply are ignored so
// that runners written for the original server keep working.
type body struct {
	JobID    *string  `json:"job_id"`
	Status   string   `json:"status"`
	Progress string   `json:"progress"`
	Message  string   `json:"message"`
	Percent  *float64 `json:"percent"`
	Result   string   `json:"result"`
	Output   string   `json:"output"`
	Error    string   `json:"error"`
	ExitCode *int     `json:"exit_code"`
}

func (h *handler) callback(w http.ResponseWriter, r *http.Request) {
	id, kind := r.PathValue("job_id"), delegate.ReportKind(r.PathValue("kind"))
	if kind != delegate.ReportComplete && kind != delegate.ReportStatus && kind != delegate.ReportHeartbeat {
		writeError(w, http.StatusNotFound, "unknown callback "+string(kind)+": use complete, status or heartbeat")
		return
	}
	token, ok := h.admit(w, r, id, string(kind))
	if !ok {
		return
	}
	raw, ok := h.readBody(w, r)
	if !ok {
		return
	}
	var b body
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &b); err != nil {
			writeError(w, http.StatusBadRequest, "body must be a JSON object: "+strings.TrimPrefix(err.Error(), "json: "))
			return
		}
	} else if kind != delegate.ReportHeartbeat {
		writeError(w, http.StatusBadRequest, "body must be a JSON object")
		return
	}
	if b.JobID != nil && *b.JobID != id {
		writeError(w, http.StatusBadRequest, "job_id in the body differs from the job in the path")
		return
	}
	rep := delegate.Report{Kind: kind}
	switch kind {
	case delegate.ReportStatus:
		rep.Progress = firstOf(b.Progress, b.Message, b.Status)
		if b.Percent != nil {
			rep.Progress = strings.TrimSpace(fmt.Sprintf("%s (%.0f%%)", rep.Progress, *b.Percent))
		}
	case delegate.ReportComplete:
		switch b.Status {
		case "success", "succeeded", "completed", "":
			rep.Success = b.Error == "" && (b.ExitCode == nil || *b.ExitCode == 0)
		case "failed", "failure", "error":
		default:
			writeError(w, http.StatusBadRequest, `status must be "success" or "failed"`)
			return
		}
		rep.Result, rep.Error, rep.ExitCode = firstOf(b.Result, b.Output), b.Error, b.ExitCode
	}
	job, err := h.svc.Callback(r.Context(), id, token, rep)
	if err != nil {
		code, msg := callbackError(err)
		if code >= http.StatusInternalServerError {
			h.opts.Logger.Error("callback", "job", id, "kind", string(kind), "err", err)
		}
		writeError(w, code, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"job_id": job.ID, "status": string(job.Status)})
}

// admit authenticates a callback from its headers and applies the
// connection and rate bounds; it answers the request itself (and returns
// false) when the callback may not go on.
func (h *handler) admit(w http.ResponseWriter, r *http.Request, id, what string) (string, bool) {
	token, ok := bearer(r)
	if !ok {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusUnauthorized, "missing token: send Authorization: Bearer $DELEGATE_JOB_TOKEN")
		return "", false
	}
	// The token, from the header, before a byte of the body is read: a
	// stranger's body is never read (nor kept in memory), the answer
	// comes at once, and the connection closes with it.
	switch err := h.svc.Authenticate(r.Context(), id, token); {
	case errors.Is(err, delegate.ErrUnauthenticated):
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusUnauthorized, "unknown token for this job")
		return "", false
	case errors.Is(err, delegate.ErrForbidden):
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusForbidden, "this token belongs to another job")
		return "", false
	case err != nil:
		h.opts.Logger.Error("callback", "job", id, "kind", what, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
		return "", false
	}
	if !h.conns.authenticated(r.Context(), id) {
		w.Header().Set("Connection", "close") // this job keeps enough open
	}
	if wait, ok := h.rate.allow(id); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds()+0.999)))
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many callbacks from this job: at most %g a second (%d at once)", h.rate.rate, h.rate.burst))
		return "", false
	}
	return token, true
}

// readBody reads a callback's body, at most BodyLimit bytes.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.ContentLength > h.opts.BodyLimit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", h.opts.BodyLimit))
		return nil, false
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.BodyLimit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", h.opts.BodyLimit))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "could not read the body")
		return nil, false
	}
	return raw, true
}

// callbackErrors is the one table from a service error's kind to a
// callback's answer: its status, and its message ("" for the error's own
// words, which are ours for these kinds). A kind not here is the server's
// trouble (500, logged); the job is told no more.
var callbackErrors = map[delegate.Kind]struct {
	code int
	msg  string
}{
	delegate.KindUnauthenticated: {http.StatusUnauthorized, "unknown token for this job"},
	delegate.KindForbidden:       {http.StatusForbidden, "this token belongs to another job"},
	delegate.KindNotFound:        {http.StatusNotFound, ""},
	delegate.KindTerminal:        {http.StatusConflict, ""},
	delegate.KindConflict:        {http.StatusConflict, ""},
	delegate.KindInvalid:         {http.StatusConflict, ""},
	delegate.KindNotFinished:     {http.StatusConflict, ""},
	delegate.KindUnavailable:     {http.StatusServiceUnavailable, "the server cannot record this now; send it again later"},
}

func callbackError(err error) (int, string) {
	a, ok := callbackErrors[delegate.ErrorKind(err)]
	switch {
	case !ok:
		return http.StatusInternalServerError, "internal error"
	case a.msg == "":
		return a.code, err.Error()
	}
	return a.code, a.msg
}

// counted tells Options.Answered the status of each answer.
func (h *handler) counted(next http.Handler) http.Handler {
	if h.opts.Answered == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &codeWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(cw, r)
		h.opts.Answered(cw.code)
	})
}

// codeWriter remembers the status an answer was written with.
type codeWriter struct {
	http.ResponseWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *codeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	token = strings.TrimSpace(token)
	return token, ok && token != ""
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
