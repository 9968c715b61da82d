package mcpserver

import (
	"context"

	"github.com/delegate-dev/delegate"
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
	Status     delegate.Status `json:"status"`
	Output     string          `json:"output"`
	NextCursor string          `json:"next_cursor"`
	// Done: the job has finished and there is nothing after next_cursor.
	Done bool `json:"done"`
}

func (h *handlers) logs(ctx context.Context, _ *mcp.CallToolRequest, in *LogsIn) (LogsOut, error) {
	l, err := h.svc.Logs(ctx, in.JobID, delegate.LogOptions{Cursor: in.Cursor, MaxBytes: in.MaxBytes})
	if err != nil {
		return LogsOut{}, err
	}
	return LogsOut{Status: l.Status, Output: text(l.Output), NextCursor: l.NextCursor, Done: l.Done}, nil
}
