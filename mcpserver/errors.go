package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
func toolError(ctx context.Context, log *slog.Logger, tool string, err error) error {
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
		log.Warn("tool call: a dependency is unavailable", "tool", tool, "err", err)
		return fmt.Errorf("%s could not be completed: the sandbox backend or the job store does not answer now; "+
			"call %s again in a minute", tool, tool)
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

// resourceError is toolError for a resource read (job://...): a missing
// job or artifact is the protocol's resource-not-found error, an error of
// unknown kind is logged and answered in a few words.
func resourceError(ctx context.Context, log *slog.Logger, uri string, err error) error {
	var wire *jsonrpc.Error
	if errors.As(err, &wire) {
		return err // already the protocol's answer
	}
	switch delegate.ErrorKind(err) {
	case delegate.KindNotFound:
		var nf *delegate.NotFoundError
		if errors.As(err, &nf) && nf.Reason != "" {
			return err // there, but not readable: the reason says why
		}
		return mcp.ResourceNotFoundError(uri)
	case delegate.KindInternal, delegate.KindUnavailable:
		if ctx.Err() == nil {
			log.Error("resource read failed", "uri", uri, "err", err)
		}
		return fmt.Errorf("reading %s failed on the server (the server's log says why); try again later", uri)
	}
	return err
}
