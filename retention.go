package delegate

import (
	"context"
	"time"
)

// DefaultRetention is how long a finished job (its output, timeline,
// artifacts, workspace and network log) and an ended kept sandbox are
// kept before they are pruned (DELEGATE_RETENTION).
const DefaultRetention = 30 * 24 * time.Hour

// RetentionStore forgets what has been kept long enough. Every store
// implements it (storetest holds them to it), so that `delegate gc` and
// the engine's background prune work whatever keeps the jobs.
type RetentionStore interface {
	// Prune removes what ended before before: each finished job with
	// everything the store keeps of it (output, timeline, artifacts'
	// records, questions, workspace), each kept sandbox released or gone
	// whose jobs are all gone, and each ended network no job or sandbox
	// names. It keeps a job whose kept sandbox still exists (the
	// sandbox's activity and baseline are read from it) and a persistent
	// job whose sandbox was never released. With opts.DryRun it counts
	// the same and removes nothing. It works in batches, so that other
	// writes are not held up behind it.
	Prune(ctx context.Context, before time.Time, opts PruneOptions) (*Pruned, error)
}

// PruneOptions tune a Prune.
type PruneOptions struct {
	// DryRun counts what would go and removes nothing.
	DryRun bool
}

// Pruned is what a Prune removed (or, dry, would remove).
type Pruned struct {
	Jobs      int `json:"jobs"`
	Sandboxes int `json:"sandboxes"`
	Networks  int `json:"networks"`
	// OutputBytes and WorkspaceBytes are the stored output and imported
	// workspaces (baselines and changes) of the jobs; Bytes is all the
	// store freed of them, those included (rows' overhead left out).
	OutputBytes    int64 `json:"output_bytes"`
	WorkspaceBytes int64 `json:"workspace_bytes"`
	Bytes          int64 `json:"bytes"`
	// Artifacts are the artifact contents (by sha256) that no job left
	// in the store names any more: their files, outside the store, can go.
	Artifacts []string `json:"-"`
	// ArtifactFiles and ArtifactBytes are the artifact files removed (or,
	// dry, that would be) from the server's artifact directory.
	ArtifactFiles int   `json:"artifact_files"`
	ArtifactBytes int64 `json:"artifact_bytes"`
	// Before is the cutoff: what ended before it goes (zero: retention
	// is off, and nothing does).
	Before time.Time `json:"before,omitzero"`
}

// RetentionService prunes what is past its retention: the engine does it
// in the background, and `delegate gc` when asked.
type RetentionService interface {
	// GC removes what ended more than the retention ago (RetentionStore's
	// Prune) and the artifact files no job left names; opts.DryRun only
	// counts them.
	GC(ctx context.Context, opts PruneOptions) (*Pruned, error)
}
