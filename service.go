package delegate

import (
	"context"
	"time"
)

// JobService runs jobs and answers for them. The engine implements it; the
// adapters (MCP tools, HTTP callbacks, the CLI, the dashboard) use nothing
// else, so every rule about what a reader may see, and when, lives behind
// it once: a result only when the job has finished, output while it runs
// only in statusMode streaming, a timeline only in detailed or streaming,
// page sizes and output sizes with their defaults and bounds.
//
// Errors wrap the sentinels of this package (ErrorKind classifies them):
// ErrNotFound (a *NotFoundError says what was not found), ErrInvalid (a
// *FieldError names the option at fault), ErrNotFinished and ErrTerminal.
//
// The services are small, one per resource, each in its own file: jobs
// here, the callbacks jobs send in callback.go. Resources that later work
// adds (kept sandboxes, questions waiting for a person's answer, leases
// of jobs to servers) get services of their own beside these, which the
// engine implements too.
type JobService interface {
	// Submit validates m, stores the job as pending and queues it. It
	// returns at once.
	Submit(ctx context.Context, m Manifest, opts SubmitOptions) (*Job, error)
	// Get returns a job.
	Get(ctx context.Context, id string) (*Job, error)
	// List returns one page of jobs, newest first.
	List(ctx context.Context, opts ListOptions) (*JobPage, error)
	// Wait blocks until the job has finished or ctx is done, and returns
	// the job as it is then (finished or not). It sees changes made by
	// other processes sharing the store.
	Wait(ctx context.Context, id string) (*Job, error)
	// Cancel ends a job that has not finished. cancelled is false when it
	// had already finished (the job is returned unchanged).
	Cancel(ctx context.Context, id string) (job *Job, cancelled bool, err error)
	// Release destroys the sandbox a finished persistent job kept.
	// released is false when nothing was left to destroy.
	Release(ctx context.Context, id string) (job *Job, released bool, err error)

	// Result is a finished job's outcome; ErrNotFinished before it ends.
	Result(ctx context.Context, id string, opts ResultOptions) (*JobResult, error)
	// Logs reads a job's output from a cursor: once it has finished, or
	// while it runs if it was submitted in statusMode streaming
	// (ErrNotFinished otherwise).
	Logs(ctx context.Context, id string, opts LogOptions) (*LogPage, error)
	// Timeline is a job's progress history, oldest first; empty for a job
	// in statusMode simple, which keeps none.
	Timeline(ctx context.Context, id string) ([]Event, error)
	// Artifacts lists the files kept from a job's workspace.
	Artifacts(ctx context.Context, id string) ([]Artifact, error)
	// ReadArtifact returns one artifact and its content, checked against
	// its sha256 (ErrNotFound when the job has no such artifact).
	ReadArtifact(ctx context.Context, id, name string) (Artifact, []byte, error)

	// Watch delivers the id of every job this service changes until ctx
	// ends, then closes the channel. A slow reader misses wake-ups, never
	// state: on each id, read the job again.
	Watch(ctx context.Context) <-chan string
}

// SubmitOptions tune a submission.
type SubmitOptions struct {
	// IdempotencyKey: a second submission with the same key returns the
	// first job instead of running the work twice.
	IdempotencyKey string
}

// ListOptions select a page of jobs.
type ListOptions struct {
	Status Status // empty: any
	// Limit is the page size: 0 for DefaultPageSize, at most MaxPageSize.
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

// JobPage is one page of jobs, newest first.
type JobPage struct {
	Jobs []JobSummary `json:"jobs"`
	// NextCursor continues the listing; "" on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// JobSummary is a job as a list shows it.
type JobSummary struct {
	ID        string    `json:"job_id"`
	Status    Status    `json:"status"`
	AgentType AgentType `json:"agent_type"`
	// Task is the start of the task (or the agent command), one line's worth.
	Task       string    `json:"task"`
	Progress   string    `json:"progress,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	// ExitReason says why a finished job's process ended (exit.go).
	ExitReason ExitReason `json:"exit_reason,omitempty"`
	// SandboxKept: a finished persistent job's sandbox is still there
	// (Release destroys it).
	SandboxKept bool `json:"sandbox_kept,omitempty"`
	// Sandbox is the kept sandbox the job ran in or made (Job.Sandbox).
	Sandbox string `json:"sandbox_id,omitempty"`
	// Principal is whose job it is (principal.go).
	Principal string `json:"principal,omitempty"`
}

// ResultOptions tune a result.
type ResultOptions struct {
	// OutputTail is how many bytes of the end of the kept stdout, and of
	// the kept stderr, to include: 0 for DefaultOutputTail. More than is
	// kept returns it all.
	OutputTail int
}

// JobResult is a finished job's outcome.
//
// Its output is the job's stdout and, apart, its stderr, as a program's
// caller sees them: stdout stays data a caller can parse, errors are
// beside it, no byte is sent twice, and each stream's end is there
// however much the other wrote. The two interleaved, in the order they
// were written, are the job's log (JobService.Logs).
type JobResult struct {
	JobID    string `json:"job_id"`
	Status   Status `json:"status"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// ExitReason says why the process ended (exit.go): exit_code is how.
	ExitReason ExitReason `json:"exit_reason,omitempty"`
	// Output is the end of the kept stdout, from OutputOffset (bytes of
	// kept stdout before it) on, never starting inside a UTF-8 sequence.
	// Output kept before delegate told the streams apart is stdout and
	// stderr together, and is here. It is raw bytes: renderers that need
	// text replace what is not UTF-8.
	Output       []byte `json:"-"`
	OutputOffset int64  `json:"output_offset"`
	// Stderr is the end of the kept stderr, from StderrOffset on, as
	// Output is of stdout.
	Stderr       []byte `json:"-"`
	StderrOffset int64  `json:"stderr_offset"`
	// OutputBytes counts all the job wrote, to both streams;
	// OutputTruncated says that only the first part was kept.
	OutputBytes     int64 `json:"output_bytes"`
	OutputTruncated bool  `json:"output_truncated"`
	// OutputLostBytes of the output within the limit could not be stored,
	// OutputLost says why (Job's); Error says so too, for a reader of it
	// alone.
	OutputLostBytes int64  `json:"output_lost_bytes,omitempty"`
	OutputLost      string `json:"output_lost,omitempty"`
	// CacheMissed names the caches the job had an empty one of, and why
	// (Job's): its result says so, not only its timeline.
	CacheMissed string     `json:"cache_missed,omitempty"`
	Error       string     `json:"error,omitempty"`
	Result      string     `json:"result,omitempty"`
	OOMKilled   bool       `json:"oom_killed,omitempty"`
	Artifacts   []Artifact `json:"artifacts"`
	// Changes are what the job changed in its imported workspace (nil
	// without a workspace source); WorkspaceService has the diff.
	Changes    *WorkspaceChanges `json:"changes,omitempty"`
	StartedAt  time.Time         `json:"started_at,omitzero"`
	FinishedAt time.Time         `json:"finished_at,omitzero"`
	// Duration is how long the job ran.
	Duration time.Duration `json:"-"`
	// Sandbox is the kept sandbox the job ran in or made (Job.Sandbox).
	Sandbox string `json:"sandbox_id,omitempty"`
	// Network is set for a job whose network went through the egress
	// proxy (NetworkService has its whole log).
	Network *NetworkResult `json:"network,omitempty"`
}

// LogOptions say which part of a job's output to read.
type LogOptions struct {
	// Cursor is the NextCursor of the previous page ("" from the start).
	Cursor string
	// MaxBytes is the most to return: 0 for DefaultLogBytes, at most
	// MaxLogBytes.
	MaxBytes int
	// Tail reads the last MaxBytes kept instead (Cursor is not used).
	Tail bool
}

// LogPage is a piece of a job's log: its stdout and stderr interleaved,
// in the order they were written.
type LogPage struct {
	JobID  string `json:"job_id"`
	Status Status `json:"status"`
	// Output is raw bytes that never end inside a UTF-8 sequence (an
	// incomplete one is held for the next page).
	Output []byte `json:"-"`
	// Streams are Output's bytes (the same memory) as pieces of one
	// stream each, in order.
	Streams []Output `json:"-"`
	// Offset is where Output starts in the kept output.
	Offset int64 `json:"-"`
	// NextCursor continues from the end of Output.
	NextCursor string `json:"next_cursor"`
	// Done: the job has finished and there is nothing after NextCursor.
	Done bool `json:"done"`
}
