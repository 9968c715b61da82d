package delegate

import (
	"context"
	"time"
)

// The audit trail records who did what that changes something: submitted
// or cancelled a job, released a sandbox, answered a question, widened an
// allowlist, applied a job's changes, made or revoked a token. Each entry
// has its time and principal, and lives in the store, so that every
// server sharing it writes to one trail.

// AuditAction is what an entry records.
type AuditAction string

const (
	AuditSubmitted    AuditAction = "submitted"
	AuditCancelled    AuditAction = "cancelled"
	AuditReleased     AuditAction = "released"
	AuditOpened       AuditAction = "opened" // a kept sandbox, empty
	AuditAnswered     AuditAction = "answered"
	AuditWidened      AuditAction = "widened"
	AuditApplied      AuditAction = "applied"
	AuditTokenCreated AuditAction = "token_created"
	AuditTokenRevoked AuditAction = "token_revoked"
)

// AuditEntry is one action.
type AuditEntry struct {
	Seq       int64       `json:"seq"`
	Time      time.Time   `json:"time"`
	Principal string      `json:"principal"`
	Action    AuditAction `json:"action"`
	// Target is what it was done to: a job, sandbox or token id.
	Target string `json:"target"`
	// Detail is more in words (the question answered, the rules added).
	Detail string `json:"detail,omitempty"`
}

// AuditedJobStore is a store that inserts a job and the audit entry of
// its submission in one statement and one commit (PostgreSQL: a commit
// waits for its WAL's flush, and a second commit per submit would double
// that wait). Where the store is not one, the entry is appended apart.
type AuditedJobStore interface {
	// CreateJobAudited is CreateJobAdmitted with e appended to the trail
	// in the same transaction (nil: none), its Seq set: both are stored,
	// or neither.
	CreateJobAudited(ctx context.Context, job *Job, admit Admit, e *AuditEntry) error
}

// AuditFilter selects entries, newest first.
type AuditFilter struct {
	Principal string    // "" every principal
	Since     time.Time // zero: from the start
	// Before continues a listing: entries with a Seq below it (0: from
	// the newest).
	Before int64
	Limit  int // 0: DefaultPageSize, at most MaxPageSize
}

// MaxAuditDetail bounds an entry's detail, in bytes.
const MaxAuditDetail = 2000

// AuditStore keeps the trail. Reads under a principal without ScopeAdmin
// see that principal's entries only.
type AuditStore interface {
	// AddAudit appends e (its Seq is set by the store).
	AddAudit(ctx context.Context, e *AuditEntry) error
	// Audit lists entries newest first.
	Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
}

// Recorder appends an entry for what ctx's principal did (a nil Recorder
// records nothing). The services call it once an action has succeeded.
type Recorder interface {
	Record(ctx context.Context, action AuditAction, target, detail string)
}
