package httpapi

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/delegate-dev/delegate"
)

// MaxForwardBody bounds a forwarded command's request: a manifest with
// its inline files, as an MCP message is bounded.
const MaxForwardBody = 96 << 20

// ForwardHandler serves POST delegate.ForwardPath on the --http listener:
// the commands another server of the shared store forwards to this one,
// which holds their kept sandbox. They carry no user's token: the service
// checks the request's key (before it reads the body, at most
// MaxForwardBody bytes) and signature (the store's secret), then the
// principal it names. The answer is a delegate.ForwardAnswer.
func ForwardHandler(svc delegate.ForwardService, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		job, err := svc.AcceptForward(r.Context(), r.Header.Get(delegate.ForwardKeyHeader), r.Header.Get(delegate.ForwardSignatureHeader),
			http.MaxBytesReader(w, r.Body, MaxForwardBody))
		if err == nil {
			writeForward(w, http.StatusOK, delegate.ForwardAnswer{JobID: job.ID})
			return
		}
		kind := delegate.ErrorKind(err)
		code, ok := forwardCodes[kind]
		if !ok {
			log.Error("forwarded command", "err", err)
			code = http.StatusInternalServerError
		}
		// The refusal's own words: the sending server hands them to its
		// client, as this server would to its own.
		writeForward(w, code, delegate.ForwardAnswer{Kind: kind.String(), Error: err.Error()})
	})
}

// forwardCodes is the one table from a forwarded command's refusal to its
// HTTP status (the sender reads the kind in the answer, not the status).
var forwardCodes = map[delegate.Kind]int{
	delegate.KindUnauthenticated: http.StatusUnauthorized,
	delegate.KindForbidden:       http.StatusForbidden,
	delegate.KindNotFound:        http.StatusNotFound,
	delegate.KindInvalid:         http.StatusBadRequest,
	delegate.KindConflict:        http.StatusConflict,
	delegate.KindTerminal:        http.StatusConflict,
	delegate.KindNotFinished:     http.StatusConflict,
	delegate.KindUnavailable:     http.StatusServiceUnavailable,
}

func writeForward(w http.ResponseWriter, code int, ans delegate.ForwardAnswer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(ans)
}
