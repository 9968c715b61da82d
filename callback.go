package delegate

import "context"

// CallbackService takes the reports jobs send from inside their sandboxes
// (progress, heartbeats, their own verdict), each authenticated by the
// job's token. The engine implements it; the callback endpoints (httpapi)
// use nothing else.
type CallbackService interface {
	// Callback authenticates a report a job sent with its token and
	// applies it (ErrUnauthenticated, ErrForbidden, ErrTerminal once the
	// job has finished).
	Callback(ctx context.Context, id, token string, r Report) (*Job, error)
	// Authenticate checks a job's token as Callback does, without a
	// report: an adapter calls it before it reads a report's body, so
	// that a stranger gets ErrUnauthenticated (or ErrForbidden, another
	// job's token) before sending anything more.
	Authenticate(ctx context.Context, id, token string) error
}

// ReportKind is what a job says through a callback.
type ReportKind string

const (
	ReportStatus    ReportKind = "status"    // a progress message
	ReportHeartbeat ReportKind = "heartbeat" // a sign of life
	ReportComplete  ReportKind = "complete"  // the job's own verdict
)

// Report is what a job sends to a callback endpoint.
type Report struct {
	Kind     ReportKind
	Progress string
	// For ReportComplete:
	Success  bool
	Result   string
	Error    string
	ExitCode *int
}
