package mcpserver

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// LogsIn is get_job_logs' input.
type LogsIn struct {
	JobID    string `json:"job_id"`
	Cursor   string `json:"cursor,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// LogsOut is a piece of a job's output.
type LogsOut struct {
	JobID      string          `json:"job_id"`
	Status     delegate.Status `json:"status"`
	Output     string          `json:"output"`
	NextCursor string          `json:"next_cursor"`
	// Done: the job has finished and there is nothing after next_cursor.
	Done bool `json:"done"`
}

func (h *handlers) logs(ctx context.Context, _ *mcp.CallToolRequest, in LogsIn) (*mcp.CallToolResult, LogsOut, error) {
	out, err := Logs(ctx, h.eng, in)
	if err != nil {
		return nil, LogsOut{}, toolError(err)
	}
	return nil, out, nil
}

// Logs reads output from a cursor; the CLI uses it too.
func Logs(ctx context.Context, eng *engine.Engine, in LogsIn) (LogsOut, error) {
	max := in.MaxBytes
	if max < 0 || max > 1<<20 {
		return LogsOut{}, &delegate.FieldError{Field: "max_bytes", Rule: "must be between 1 and 1048576"}
	}
	if max == 0 {
		max = defaultResultBytes
	}
	var offset int64
	if in.Cursor != "" {
		n, err := strconv.ParseInt(in.Cursor, 10, 64)
		if err != nil || n < 0 {
			return LogsOut{}, &delegate.FieldError{Field: "cursor", Rule: "must be a next_cursor from a previous get_job_logs call"}
		}
		offset = n
	}
	j, err := eng.Get(ctx, in.JobID)
	if err != nil {
		return LogsOut{}, err
	}
	if !j.Status.Terminal() && j.Manifest.StatusMode != delegate.StatusModeStreaming {
		return LogsOut{}, fmt.Errorf("job %s is %s and was submitted with statusMode %s: its output is readable when it ends "+
			"(submit with statusMode streaming to read it while it runs): %w", j.ID, j.Status, j.Manifest.StatusMode, delegate.ErrNotFinished)
	}
	b, err := eng.Output(ctx, j.ID, offset, max)
	if err != nil {
		return LogsOut{}, err
	}
	// Never split a UTF-8 sequence: hold an incomplete tail for next time.
	b = trimIncompleteRune(b)
	kept, err := eng.OutputSize(ctx, j.ID)
	if err != nil {
		return LogsOut{}, err
	}
	next := offset + int64(len(b))
	return LogsOut{
		JobID: j.ID, Status: j.Status,
		Output:     strings.ToValidUTF8(string(b), "\uFFFD"),
		NextCursor: strconv.FormatInt(next, 10),
		Done:       j.Status.Terminal() && next >= kept,
	}, nil
}

// trimIncompleteRune drops a UTF-8 sequence cut off at the end of b.
func trimIncompleteRune(b []byte) []byte {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return b
		}
		if c >= 0xC0 { // a start byte: is its sequence complete?
			need := 2
			if c >= 0xE0 {
				need = 3
			}
			if c >= 0xF0 {
				need = 4
			}
			if i < need {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}
