package delegate

import (
	"context"
	"time"
)

// Job is one submitted manifest and everything known about its run.
type Job struct {
	ID       string   `json:"job_id"`
	Manifest Manifest `json:"manifest"`
	Status   Status   `json:"status"`
	// Progress is the latest human-readable step ("provisioning sandbox").
	Progress string `json:"progress,omitempty"`
	// Error says why a job failed, timed out or was cancelled.
	Error    string `json:"error,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// OOMKilled is set when the kernel killed the job for its memory limit.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// OutputBytes counts every byte the job wrote; only the first
	// OutputLimit bytes are kept, and OutputTruncated says so.
	OutputBytes     int64 `json:"output_bytes"`
	OutputTruncated bool  `json:"output_truncated"`

	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`

	// Backend runs the job; SandboxID and ExecID let a restarted server find
	// the job's sandbox and process again.
	Backend   string `json:"backend,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	ExecID    string `json:"exec_id,omitempty"`
	// Owner is the engine instance driving the job (see Engine ownership).
	Owner string `json:"-"`

	// Result is the job's own summary: the text of a completion callback,
	// or the Claude CLI's final result.
	Result string `json:"result,omitempty"`
	// IdempotencyKey makes a retried submission return the same job.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// TokenHash is the SHA-256 of the job's callback token; the token
	// itself is only ever given to the sandbox.
	TokenHash string `json:"-"`
	// LastHeartbeat is the last sign of life from the job or its supervisor.
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	// OutputRead is how far the backend's output has been consumed; it
	// differs from the kept length when secrets were redacted.
	OutputRead int64 `json:"-"`
	// TimelineDropped counts the timeline entries dropped to keep the
	// newest MaxTimeline.
	TimelineDropped int64 `json:"timeline_dropped,omitempty"`
}

// Event is one entry in a job's timeline (kept in statusMode detailed and
// streaming).
type Event struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
}

// Artifact is a file collected from a job's workspace, stored by hash.
type Artifact struct {
	Name   string `json:"name"` // path relative to /workspace
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// Skipped says why the file was not kept (over a size cap...).
	Skipped string `json:"skipped,omitempty"`
}

// Duration is how long the job ran (from start to finish, or to now).
func (j *Job) Duration(now time.Time) time.Duration {
	if j.StartedAt.IsZero() {
		return 0
	}
	end := j.FinishedAt
	if end.IsZero() {
		end = now
	}
	return end.Sub(j.StartedAt)
}

// JobFilter selects jobs for listing, newest first.
type JobFilter struct {
	Status Status // empty: any
	Limit  int    // 0: a default page
	Cursor string // opaque, from the previous page
	Owner  string // empty: any
	// SandboxID selects the job that owns a sandbox.
	SandboxID string
	// TokenHash selects the job whose callback token has this hash.
	TokenHash string
	// Active selects jobs that are not terminal (pending, provisioning, running).
	Active bool
}

// MaxTimeline is how many entries a job's timeline keeps: the newest.
// Older ones are dropped and counted (Job.TimelineDropped).
const MaxTimeline = 200

// JobProgress is what a job reported since its progress was last stored,
// coalesced: the latest message, result and sign of life, and the
// timeline entries in between.
type JobProgress struct {
	ID string
	// Progress is the latest message ("": unchanged).
	Progress string
	// Result, when set, is the job's own summary so far.
	Result *string
	// Heartbeat is the latest sign of life (zero: unchanged).
	Heartbeat time.Time
	// Events are appended to the timeline, oldest first.
	Events []Event
	// Dropped counts timeline entries dropped before they were stored.
	Dropped int64
}

// JobStore keeps jobs durably. Implementations enforce the state machine in
// UpdateJob so that no caller can move a job in a way Transition forbids.
//
// A job's manifest is immutable once created. Its files are kept apart from
// the job (they are only needed to provision it): jobs returned by GetJob
// and ListJobs have no Manifest.Files; JobFiles reads them.
type JobStore interface {
	CreateJob(ctx context.Context, job *Job) error
	// GetJob returns the job (without its manifest's files).
	GetJob(ctx context.Context, id string) (*Job, error)
	// JobManifest returns the job's manifest (without its files): cheap,
	// for it never changes.
	JobManifest(ctx context.Context, id string) (Manifest, error)
	// JobFiles returns the files of the job's manifest.
	JobFiles(ctx context.Context, id string) ([]File, error)
	// ListJobs returns one page and the cursor of the next ("" at the end).
	ListJobs(ctx context.Context, f JobFilter) ([]*Job, string, error)
	// UpdateJob reads the job, lets fn change it and writes back the
	// fields fn changed (never the manifest), all in one transaction. A
	// status change fn makes is checked by Transition; the error from fn
	// or from the check is returned and nothing is written.
	UpdateJob(ctx context.Context, id string, fn func(*Job) error) (*Job, error)
	// SaveProgress stores the coalesced progress of many jobs in one
	// transaction. A job that has finished keeps its progress, result and
	// heartbeat; its events are still added to its timeline, which keeps
	// the newest MaxTimeline entries. An unknown job is skipped.
	SaveProgress(ctx context.Context, batch []JobProgress) error
	// AppendOutput stores a chunk of output (its pieces in the order
	// written, each of one stream) at the end of what is kept, and records
	// in the same transaction that the backend's output was consumed up to
	// read (Job.OutputRead).
	AppendOutput(ctx context.Context, id string, chunk []Output, read int64) error
	// ReadOutput returns up to max kept bytes from offset (offsets count
	// both streams together), as pieces in the order written.
	ReadOutput(ctx context.Context, id string, offset int64, max int) ([]Output, error)
	// OutputSize is how many bytes of output are kept.
	OutputSize(ctx context.Context, id string) (int64, error)
	// StreamTail returns the last max bytes kept of one stream, and how
	// many bytes of that stream are kept in all. StreamStdout includes
	// output kept before the streams were told apart (StreamCombined).
	StreamTail(ctx context.Context, id string, s Stream, max int) (tail []byte, kept int64, err error)
	// JobByIdempotencyKey finds the job submitted with key (ErrNotFound).
	JobByIdempotencyKey(ctx context.Context, key string) (*Job, error)
	// AddEvent appends one entry to a job's timeline, keeping the newest
	// max (at most MaxTimeline) and counting those it drops.
	AddEvent(ctx context.Context, id string, ev Event, max int) error
	// Events returns a job's timeline, oldest first.
	Events(ctx context.Context, id string) ([]Event, error)
	// AddArtifact records a collected artifact.
	AddArtifact(ctx context.Context, id string, a Artifact) error
	// Artifacts lists a job's artifacts by name.
	Artifacts(ctx context.Context, id string) ([]Artifact, error)
	// Finishes counts the jobs that have reached a terminal status, in
	// every process sharing the store: a cheap way to notice that one
	// did without reading every job.
	Finishes(ctx context.Context) (int64, error)
	Close() error
}
