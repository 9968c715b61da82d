package delegate

import (
	"context"
	"time"
)

// Event is one entry in a job's timeline (kept in statusMode detailed and
// streaming).
type Event struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
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

// ProgressStore keeps what running jobs report: their latest progress,
// result and sign of life (on the job), and their timelines.
type ProgressStore interface {
	// SaveProgress stores the coalesced progress of many jobs in one
	// transaction. A job that has finished keeps its progress, result and
	// heartbeat; its events are still added to its timeline, which keeps
	// the newest MaxTimeline entries. An unknown job is skipped.
	SaveProgress(ctx context.Context, batch []JobProgress) error
	// AddEvent appends one entry to a job's timeline, keeping the newest
	// max (at most MaxTimeline) and counting those it drops.
	AddEvent(ctx context.Context, id string, ev Event, max int) error
	// Events returns a job's timeline, oldest first.
	Events(ctx context.Context, id string) ([]Event, error)
}
