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
	// OutputLostBytes counts bytes of the output the job wrote within
	// OutputLimit that could not be stored (the server's disk was full, or
	// the sandbox could not keep them); OutputLost says why. The output
	// stored is then not the whole of it, whatever its status.
	OutputLostBytes int64  `json:"output_lost_bytes,omitempty"`
	OutputLost      string `json:"output_lost,omitempty"`
	// CacheMissed names the caches (manifest.caches) the job had an empty
	// one of instead of its project's, or had without the changes of the
	// run before (not saved: its principal's disk quota), and why ("go:
	// in use by sandbox sb-…: this job had an empty one of its own"; "; "
	// between two).
	CacheMissed string `json:"cache_missed,omitempty"`

	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`

	// Backend runs the job; SandboxID and ExecID let a restarted server find
	// the job's sandbox and process again.
	Backend   string `json:"backend,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	ExecID    string `json:"exec_id,omitempty"`
	// Owner is the engine instance driving the job (see Engine ownership),
	// at Epoch: the store raises it by one at each claim and adoption, and
	// refuses a write of the owner's that names an older one (see Fence).
	Owner string `json:"-"`
	Epoch int64  `json:"-"`
	// StartToken is recorded (by its owner, fenced) before the job's
	// command is started: a job caught provisioning without one provably
	// never started its command, and may be provisioned again; Attempts
	// counts its provisionings.
	StartToken string `json:"-"`
	Attempts   int    `json:"-"`
	// Principal is who submitted it (principal.go): it is theirs to read.
	Principal string `json:"principal,omitempty"`
	// Sandbox is the kept sandbox the job ran in (manifest.sandbox) or
	// made (lifecycle persistent); "" for a job whose sandbox went with it.
	Sandbox string `json:"sandbox,omitempty"`

	// Result is the job's own summary: the text of a completion callback,
	// or the Claude CLI's final result.
	Result string `json:"result,omitempty"`
	// IdempotencyKey makes a retried submission return the same job.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// IdempotencyDigest is the digest of the manifest as it was submitted
	// with the key (Manifest.Digest, before defaults): a later submission
	// with the key and another manifest is refused, not answered with this
	// job. "" for a job stored before digests were kept (it matches any).
	IdempotencyDigest string `json:"-"`
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

// Clone is a copy of the job that shares nothing a caller could change
// in place with it.
func (j *Job) Clone() *Job {
	c := *j
	if j.ExitCode != nil {
		code := *j.ExitCode
		c.ExitCode = &code
	}
	c.Manifest = j.Manifest.Clone()
	return &c
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
	// Principal selects the jobs of one principal ("" any); a read under
	// a principal without ScopeAdmin sees its own only, whatever this says.
	Principal string
	// SandboxID selects the job that owns a sandbox.
	SandboxID string
	// Sandbox selects the commands of a kept sandbox (and the job that
	// made it): the jobs whose Sandbox is this id.
	Sandbox string
	// TokenHash selects the job whose callback token has this hash.
	TokenHash string
	// Active selects jobs that are not terminal (pending, provisioning, running).
	Active bool
}

// JobStore keeps jobs durably. Implementations enforce the state machine in
// UpdateJob so that no caller can move a job in a way Transition forbids.
//
// A job's manifest is immutable once created. Its files are kept apart from
// the job (they are only needed to provision it): jobs returned by GetJob
// and ListJobs have no Manifest.Files; JobFiles reads them.
//
// A job that does not exist is a *NotFoundError (ErrNotFound).
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
	// JobByIdempotencyKey finds the job submitted with key (ErrNotFound).
	JobByIdempotencyKey(ctx context.Context, key string) (*Job, error)
	// Finishes counts the jobs that have reached a terminal status, in
	// every process sharing the store: a cheap way to notice that one
	// did without reading every job.
	Finishes(ctx context.Context) (int64, error)
}
