package delegate

import "context"

// Holdings is what one principal holds at once, as its quotas count it:
// its jobs not ended and its live kept sandboxes, with the CPU and memory
// they hold. A persistent job not ended whose sandbox is not kept yet
// counts as the sandbox it is about to keep, so that two such jobs cannot
// both pass a quota of one sandbox before either has one.
type Holdings struct {
	Jobs        int
	Sandboxes   int
	CPU         float64
	MemoryBytes int64
	// CheckpointBytes is what the checkpoints of its live kept
	// sandboxes hold (Checkpoint.Bytes): part of its disk, with its
	// caches (the backend's: sandbox.CacheMeter).
	CheckpointBytes int64
}

// AddJob counts a job not ended: sandbox is the kept sandbox it runs in
// ("" none yet), m its manifest. A command in a kept sandbox (or a
// persistent job once its sandbox is kept) uses the sandbox's resources,
// counted with the sandbox.
func (h *Holdings) AddJob(sandbox string, m *Manifest) {
	h.Jobs++
	if sandbox != "" {
		return
	}
	if m.Lifecycle == LifecyclePersistent {
		h.Sandboxes++
	}
	if m.Resources != nil {
		h.add(*m.Resources)
	}
}

// AddSandbox counts a live kept sandbox holding r, with its checkpoints.
func (h *Holdings) AddSandbox(r Resources, checkpoints []StoredCheckpoint) {
	h.Sandboxes++
	h.add(r)
	for _, c := range checkpoints {
		h.CheckpointBytes += c.Bytes
	}
}

func (h *Holdings) add(r Resources) {
	h.CPU += r.CPU
	if m, err := ParseSize(r.Memory); err == nil {
		h.MemoryBytes += m
	}
}

// Admit decides whether a principal holding h may have one more job or
// sandbox: nil, or the error that refuses it (a *QuotaError).
type Admit func(h Holdings) error

// QuotaStore stores a principal's new job or sandbox (or a sandbox's new
// checkpoint) only if its quotas admit it, deciding and writing in one
// transaction: the creations of one principal are serialised (on one server, or on several sharing the
// store), so that two at once never both pass a quota on the same
// holdings.
type QuotaStore interface {
	// Holdings reads what principal holds now (for a check ahead of a
	// costly step; only the creations below decide).
	Holdings(ctx context.Context, principal string) (Holdings, error)
	// CreateJobAdmitted is CreateJob, but first gives admit what the
	// job's principal holds (without the job), in the transaction that
	// inserts it: admit's error is returned as it is, and nothing stored.
	// A nil admit admits it (CreateJob).
	CreateJobAdmitted(ctx context.Context, job *Job, admit Admit) error
	// CreateSandboxAdmitted is CreateSandbox so admitted.
	CreateSandboxAdmitted(ctx context.Context, sb *Sandbox, admit Admit) error
	// UpdateSandboxAdmitted is UpdateSandbox, but first gives admit what
	// the sandbox's principal holds (the sandbox as it is, before fn), in
	// the transaction that writes it, serialised with that principal's
	// other admitted writes: admit's error is returned as it is, and
	// nothing changed. A checkpoint is recorded so, within the disk
	// quota: two at once never both pass it. A nil admit admits it.
	UpdateSandboxAdmitted(ctx context.Context, id string, fn func(*Sandbox) error, admit Admit) (*Sandbox, error)
}
