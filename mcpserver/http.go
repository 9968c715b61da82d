package mcpserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/delegate-dev/delegate/internal/jsonin"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"golang.org/x/sync/semaphore"
)

// limitBodies reads each POSTed message before the SDK's Streamable HTTP
// handler does, so that a message up to lim.MaxMessage passes (the SDK's
// own cap, 4 MiB, answers a plain-text 413), a larger one gets a JSON-RPC
// error naming the limit, a malformed one or one with a duplicate key a
// JSON-RPC error saying what is wrong, and the bodies being read or
// handled never total more than lim.InFlight bytes.
func limitBodies(next http.Handler, lim Limits, log *slog.Logger) http.Handler {
	lim = lim.withDefaults()
	budget := semaphore.NewWeighted(lim.InFlight)
	dec := new(jsonin.Decoder)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > lim.MaxMessage {
			log.Warn("MCP message over the size limit refused", "bytes", r.ContentLength, "limit", lim.MaxMessage)
			var ids idScanner
			refuse(w, http.StatusRequestEntityTooLarge, scanID(&ids, r.Body, lim), lim.tooLarge(strconv.FormatInt(r.ContentLength, 10)+" bytes"))
			return
		}
		// Without a length, the largest message's worth, until it is read.
		weight := r.ContentLength
		if weight < 0 {
			weight = lim.MaxMessage
		}
		if err := budget.Acquire(r.Context(), weight); err != nil {
			return // the client went away while waiting
		}
		defer func() { budget.Release(weight) }()
		var body bytes.Buffer
		if r.ContentLength > 0 {
			body.Grow(int(r.ContentLength))
		}
		orig := r.Body
		_, err := body.ReadFrom(http.MaxBytesReader(w, r.Body, lim.MaxMessage))
		if r.ContentLength < 0 {
			budget.Release(weight - int64(body.Len()))
			weight = int64(body.Len())
		}
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			log.Warn("MCP message over the size limit refused", "limit", lim.MaxMessage)
			var ids idScanner
			ids.write(body.Bytes())
			body = bytes.Buffer{} // not needed any more
			refuse(w, http.StatusRequestEntityTooLarge, scanID(&ids, orig, lim), lim.tooLarge(fmt.Sprintf("more than %d bytes", lim.MaxMessage)))
			return
		case err != nil:
			return // the client went away
		}
		if jerr, id := checkBody(dec, body.Bytes()); jerr != nil {
			refuse(w, http.StatusBadRequest, id, jerr)
			return
		}
		r.Body = io.NopCloser(&body)
		r.ContentLength = int64(body.Len())
		next.ServeHTTP(w, r)
	})
}

// scanID reads what is left of a body too large to keep, finding its
// top-level id on the way (some clients write it last), so that the error
// response can carry it. It reads on to the end, up to a few times the
// limit, because a client still sending when the answer comes may see a
// reset connection instead of the answer.
func scanID(s *idScanner, r io.Reader, lim Limits) []byte {
	buf := make([]byte, 32<<10)
	for n := int64(0); n < 4*lim.MaxMessage; {
		k, err := r.Read(buf)
		s.write(buf[:k])
		n += int64(k)
		if err != nil {
			break
		}
	}
	return s.id()
}

// checkBody checks a POSTed message (or batch) by the rules of
// decodeMessage, which the SDK's reader does not have.
func checkBody(dec *jsonin.Decoder, data []byte) (*jsonrpc.Error, []byte) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		var batch []wireMessage
		if err := dec.Decode(data, &batch, ""); err != nil {
			return messageError(err), nil
		}
		return nil, nil
	}
	if _, id, jerr := decodeMessage(dec, data); jerr != nil {
		return jerr, id
	}
	return nil, nil
}

// refuse answers a message the SDK will not see with a JSON-RPC error,
// which clients show (the Go and TypeScript SDKs read it from the body of
// an HTTP error).
func refuse(w http.ResponseWriter, status int, id []byte, e *jsonrpc.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(errorResponse(id, e))
}

// byProtocol sends the requests of protocol 2026-07-28 and later to
// modern, everything else to legacy. A 2026-07-28 client names its
// version in the MCP-Protocol-Version header of every POST, server/discover
// included, and has no session; a client of an older protocol sends none
// before it has initialized, then its session's version and id (and GETs
// and DELETEs of its session).
func byProtocol(modern, legacy http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= modernProtocol && r.Header.Get("Mcp-Session-Id") == "" {
			modern.ServeHTTP(w, r)
			return
		}
		legacy.ServeHTTP(w, r)
	})
}
