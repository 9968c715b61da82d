package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// notFoundHints say, by what was not found, where the agent finds what
// there is. A job tool's not-found error without a resource is about its
// job_id (every job tool takes one).
var notFoundHints = map[string]string{
	"job":      "list_jobs shows existing jobs",
	"artifact": "get_job_result lists the job's artifacts",
}

// toolError is the one table from a service error to what the agent reads.
// Errors of a kind of ours carry our own words (the field and its rule,
// the job's state) and reach the agent with a hint of what to do next.
// Any other error (KindInternal: SQL, the Proxmox API, a bug) is logged
// in full, and the agent is told only which call failed and what to do:
// text from a database or a hypervisor is no use to it, and may say more
// about the server than it should.
//
// A tool of another toolset (pvetools) gives its errors the kinds of
// this package's sentinels: the Proxmox API's own answers, which the
// agent administering it acts on, are errors of a kind (invalid,
// forbidden, a conflict with the guest's state), and reach it.
func (ts *Tools) toolError(ctx context.Context, tool string, err error) error {
	log := ts.log
	if e := sandboxError(tool, err); e != nil {
		return e
	}
	switch delegate.ErrorKind(err) {
	case delegate.KindNotFound:
		var nf *delegate.NotFoundError
		if errors.As(err, &nf) && nf.Resource != "job" {
			if hint, ok := notFoundHints[nf.Resource]; ok && nf.There == "" {
				return fmt.Errorf("%w (%s)", err, hint)
			}
			return err
		}
		return fmt.Errorf("job_id: %w (%s)", err, notFoundHints["job"])
	case delegate.KindNotFinished:
		return fmt.Errorf("%w (wait_job waits for it)", err)
	case delegate.KindInvalid, delegate.KindTerminal, delegate.KindConflict,
		delegate.KindUnauthenticated, delegate.KindForbidden:
		return err
	case delegate.KindUnavailable:
		var full *delegate.NoSpaceError
		if errors.As(err, &full) {
			log.Warn("tool call: no space on the server", "tool", tool, "err", err, "cause", full.Err)
			return full // says where, how much is free, and what to do
		}
		log.Warn("tool call: a dependency is unavailable", "tool", tool, "err", err)
		return fmt.Errorf("%s could not be completed: %s does not answer now; "+
			"call %s again in a minute", tool, ts.deps, tool)
	}
	if ctx.Err() != nil {
		// The client gave up on the call; nobody reads the answer.
		log.Debug("tool call ended with its request", "tool", tool, "err", err)
	} else {
		log.Error("tool call failed", "tool", tool, "err", err)
	}
	return fmt.Errorf("%s failed on the server (the server's log says why); call it again, and if it fails again, "+
		"tell the user that delegate's operator can find the cause in the server's log", tool)
}

// resourceError is toolError for a resource read (job://...), always a
// JSON-RPC error with a code (an error of another type would go out with
// code 0, which no client reads as anything): what is missing is the
// protocol's resource-not-found, in words that name it (a missing
// artifact of a job that is there says so, not "Resource not found"); an
// error the client can correct, or that passes (a job that has not ended)
// is invalid params in the table's words; an error of unknown kind is
// logged and answered in a few words.
func resourceError(ctx context.Context, log *slog.Logger, uri string, err error) error {
	var wire *jsonrpc.Error
	if errors.As(err, &wire) {
		return err // already the protocol's answer
	}
	data, _ := json.Marshal(map[string]string{"uri": uri})
	switch delegate.ErrorKind(err) {
	case delegate.KindNotFound:
		return &jsonrpc.Error{Code: mcp.CodeResourceNotFound, Message: err.Error(), Data: data}
	case delegate.KindInternal, delegate.KindUnavailable:
		if ctx.Err() == nil {
			log.Error("resource read failed", "uri", uri, "err", err)
		}
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("reading %s failed on the server (the server's log says why); try again later", uri), Data: data}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error(), Data: data}
}

// taskError is toolError for a tasks/* request: the JSON-RPC error the
// client reads, failed ("Failed to retrieve task") and the table's words.
// A job that is not there is SEP-2663's task not found; an error of a
// kind of ours is the client's to correct (invalid params) in our words;
// any other is logged in full and answered in a few words.
func taskError(ctx context.Context, log *slog.Logger, failed, id string, err error) error {
	var wire *jsonrpc.Error
	if errors.As(err, &wire) {
		return err // already the protocol's answer
	}
	switch delegate.ErrorKind(err) {
	case delegate.KindNotFound:
		var nf *delegate.NotFoundError
		if !errors.As(err, &nf) || nf.Resource == "job" {
			return errTaskNotFound(id)
		}
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: failed + ": " + err.Error()}
	case delegate.KindInvalid, delegate.KindTerminal, delegate.KindConflict, delegate.KindNotFinished,
		delegate.KindUnauthenticated, delegate.KindForbidden:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: failed + ": " + err.Error()}
	case delegate.KindUnavailable:
		log.Warn("tasks: a dependency is unavailable", "task", id, "err", err)
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
			Message: failed + ": the sandbox backend or the job store does not answer now; try again in a minute"}
	}
	if ctx.Err() != nil {
		log.Debug("tasks request ended with its request", "task", id, "err", err)
	} else {
		log.Error("tasks request failed", "task", id, "what", failed, "err", err)
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
		Message: failed + ": the server failed (its log says why); try again, and if it fails again, " +
			"tell the user that delegate's operator can find the cause in the server's log"}
}

// messageError is the JSON-RPC error for a message jsonin refused:
// not JSON is a parse error, something wrong in params invalid params,
// anything else an invalid request. An error that names no field is the
// decoder's own failure (a bug), not the message's: not shown.
func messageError(err error) *jsonrpc.Error {
	var fe *delegate.FieldError
	if !errors.As(err, &fe) {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "the server could not read the message"}
	}
	where := fe.Field
	if where == "" {
		where = "message"
	}
	code := int64(jsonrpc.CodeInvalidRequest)
	switch {
	case strings.HasPrefix(fe.Rule, "not valid JSON"), strings.HasPrefix(fe.Rule, "not valid UTF-8"):
		code = jsonrpc.CodeParseError
	case where == "params" || strings.HasPrefix(where, "params."):
		code = jsonrpc.CodeInvalidParams
	}
	return &jsonrpc.Error{Code: code, Message: where + ": " + fe.Rule}
}
