package httpapi

import (
	"net/http"
)

// Transfers are files that travel between the server and a job's
// sandbox over HTTP, in bulk, each opened by a token of its own: the
// Proxmox backend's workspace archives (proxmox.Transfers), which a job
// VM fetches (GET) and sends back (PUT) from the callback server it
// already reaches, instead of through the guest agent's small calls.
type Transfers interface {
	// Claim takes transfer id for a request of this method with its
	// token, before a byte of its body is read or of the answer sent:
	// the job it is for and what carries it. A transfer is claimed once;
	// an unknown, used or closed one, another method or another token
	// is delegate.ErrUnauthenticated.
	Claim(id, method, token string) (job string, serve http.HandlerFunc, err error)
}

// transfer serves GET and PUT /transfer/{id}: the token from the header
// first (a stranger's body is never read), then the transfer's own
// handler, which streams. Transfers are not rate-limited (one request
// each), but count as their job's connections.
func (h *handler) transfer(w http.ResponseWriter, r *http.Request) {
	token, ok := bearer(r)
	if !ok {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusUnauthorized, "missing token: send Authorization: Bearer with the transfer's token")
		return
	}
	job, serve, err := h.transfers.Claim(r.PathValue("id"), r.Method, token)
	if err != nil {
		code, msg := callbackError(err)
		if code >= http.StatusInternalServerError {
			h.opts.Logger.Error("transfer", "err", err)
		}
		w.Header().Set("Connection", "close")
		writeError(w, code, msg)
		return
	}
	if !h.conns.authenticated(r.Context(), job) {
		w.Header().Set("Connection", "close") // this job keeps enough open
	}
	serve(w, r)
}
