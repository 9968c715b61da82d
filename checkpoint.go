package delegate

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// Checkpoints and forks of kept sandboxes (issue 38). A checkpoint is a
// kept sandbox's files at one instant (files only: its processes go on
// across it, and start again from a clean init in a rollback or a fork); it
// belongs to its sandbox, is kept with it (in the sandbox's record) and
// goes with it: releasing a sandbox deletes its checkpoints, while the
// forks made from them keep what they stand on. A fork is a new kept
// sandbox that starts from a checkpoint (or from a sandbox, checkpointed
// for it at once), with an identity of its own: its own machine, user
// ids, network (egress token, CA) and timers, the source's resources,
// template and network policy.
type Checkpoint struct {
	ID        string `json:"checkpoint_id"`
	Name      string `json:"name,omitempty"`
	SandboxID string `json:"sandbox_id"`
	// Instance is the backend's id of it.
	Instance string `json:"-"`
	// Bytes is what it holds that its sandbox had not saved in an
	// earlier one.
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Forks are the sandboxes made from it.
	Forks []string `json:"forks,omitempty"`
}

// Limits of checkpoints and forks; the engine's settings may lower them.
const (
	// MaxCheckpoints is how many checkpoints one sandbox keeps (each is
	// a layer its files are read through).
	MaxCheckpoints = 32
	// DefaultMaxForks is how many forks one call makes at most
	// (DELEGATE_MAX_FORKS).
	DefaultMaxForks = 8
	// MaxCheckpointName bounds a checkpoint's name.
	MaxCheckpointName = 64
)

// CheckpointOptions say how to checkpoint.
type CheckpointOptions struct {
	Name string
	// Memory asks for the sandbox's memory and processes too: refused
	// where the backend cannot (every backend today), naming what is
	// missing.
	Memory bool
}

// ForkSpec says what to fork: From is a sandbox id (it is checkpointed
// for the fork) or a checkpoint id; Count forks are made.
type ForkSpec struct {
	From   string
	Count  int
	Memory bool
}

// CheckpointService checkpoints kept sandboxes, rolls them back and
// forks them. Errors wrap the package's sentinels, naming the field.
type CheckpointService interface {
	// CheckpointSandbox saves a sandbox's files; its processes and
	// commands go on (paused for the cut). One with a process holding a
	// workspace file open for writing is refused (ErrConflict), nothing
	// changed.
	CheckpointSandbox(ctx context.Context, id string, opts CheckpointOptions) (*Checkpoint, error)
	// RollbackSandbox brings its files back to one of its checkpoints;
	// commands running in it end cancelled.
	RollbackSandbox(ctx context.Context, id, checkpoint string) (*Sandbox, error)
	// ListCheckpoints lists a sandbox's checkpoints, oldest first, with
	// the forks made from each.
	ListCheckpoints(ctx context.Context, id string) ([]Checkpoint, error)
	// DeleteCheckpoint deletes one.
	DeleteCheckpoint(ctx context.Context, checkpoint string) error
	// ForkSandbox makes spec.Count new kept sandboxes from spec.From.
	ForkSandbox(ctx context.Context, spec ForkSpec) ([]Sandbox, error)
}

// CheckpointPrefix starts every checkpoint id: "ckp-", then the id of
// its sandbox without its "sbx-", a dot, and a number of its own, so
// that a checkpoint is found through its sandbox (whose principal
// decides who sees it).
const CheckpointPrefix = "ckp-"

// CheckpointID names a sandbox's checkpoint number n.
func CheckpointID(sandboxID string, n int) string {
	return CheckpointPrefix + strings.TrimPrefix(sandboxID, "sbx-") + "." + strconv.Itoa(n)
}

// CheckpointSandbox returns the id of the sandbox a checkpoint id names,
// or a FieldError naming field.
func CheckpointSandbox(field, id string) (string, error) {
	rest, ok := strings.CutPrefix(id, CheckpointPrefix)
	sb, n, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || sb == "" || n == "" || len(id) > 80 {
		return "", fieldErr(field, "must be a checkpoint id like ckp-….1 (got %q)", id)
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return "", fieldErr(field, "must be a checkpoint id like ckp-….1 (got %q)", id)
		}
	}
	if err := CheckSandboxID(field, "sbx-"+sb); err != nil {
		return "", fieldErr(field, "must be a checkpoint id like ckp-….1 (got %q)", id)
	}
	return "sbx-" + sb, nil
}

// CheckpointNotFound is the error for a checkpoint id that names none.
func CheckpointNotFound(id string) *NotFoundError {
	return &NotFoundError{Resource: "checkpoint", ID: id}
}

// StoredCheckpoint is a checkpoint as the stores keep it, in its
// sandbox's record: with the backend's id, which the API leaves out.
type StoredCheckpoint struct {
	Checkpoint
	Instance string `json:"instance"`
}

// StoreCheckpoints is cs as the stores keep them (without their forks,
// which are read from the forks' own records).
func StoreCheckpoints(cs []Checkpoint) []StoredCheckpoint {
	if len(cs) == 0 {
		return nil
	}
	out := make([]StoredCheckpoint, len(cs))
	for i, c := range cs {
		c.Forks = nil
		out[i] = StoredCheckpoint{Checkpoint: c, Instance: c.Instance}
	}
	return out
}

// LoadCheckpoints is what StoreCheckpoints stored, of sandbox id.
func LoadCheckpoints(sc []StoredCheckpoint, id string) []Checkpoint {
	if len(sc) == 0 {
		return nil
	}
	out := make([]Checkpoint, len(sc))
	for i, s := range sc {
		out[i] = s.Checkpoint
		out[i].Instance, out[i].SandboxID = s.Instance, id
	}
	return out
}
