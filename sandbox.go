package delegate

import (
	"context"
	"io"
	"io/fs"
	"time"
)

// A Sandbox is a kept sandbox: a machine (a namespace set, a VM) that
// outlives the command that made it, for an agent to work in: more
// commands (each a job, submitted with manifest.sandbox), its files, and
// processes left in the background. It is made by a job with lifecycle
// persistent, or opened empty (SandboxService.OpenSandbox). It pauses
// when idle, and goes when it has been paused too long, when its lifetime
// ends, or when it is released.
type Sandbox struct {
	ID    string       `json:"sandbox_id"`
	State SandboxState `json:"state"`
	// Backend made it; Instance is the backend's id of it (the job's
	// SandboxID of every command run in it).
	Backend  string `json:"backend"`
	Instance string `json:"-"`
	// JobID is the job that made it ("" for one opened empty).
	JobID string `json:"job_id,omitempty"`
	// Owner is the engine that keeps its timers (see Job.Owner).
	Owner string `json:"-"`
	// Principal is whose it is (principal.go).
	Principal string `json:"principal,omitempty"`

	Resources Resources `json:"resources"`
	Template  string    `json:"vm_template,omitempty"`
	Network   Network   `json:"network"`

	CreatedAt time.Time `json:"created_at"`
	// LastUsedAt is when a command ended or a file was read or written
	// last (or it was opened or resumed): the idle timer counts from it.
	LastUsedAt time.Time `json:"last_used_at"`
	PausedAt   time.Time `json:"paused_at,omitzero"`
	// ExpiresAt ends it whatever it does (its lifetime); EndedAt is when
	// it was released or went.
	ExpiresAt time.Time `json:"expires_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`

	// IdleTimeout: idle this long, it is paused (or, on a backend that
	// cannot pause, it goes). PauseTimeout: paused this long, it goes.
	IdleTimeout  time.Duration `json:"-"`
	PauseTimeout time.Duration `json:"-"`

	// Commands counts the commands submitted to it (the job that made it
	// included); Running those not ended. Both, and whether it is running
	// or idle, are its jobs' (see SandboxStore).
	Commands int `json:"commands"`
	Running  int `json:"running"`
	// Reason says why it was released or went.
	Reason string `json:"reason,omitempty"`
	// From is the checkpoint it was forked from (checkpoint.go).
	From string `json:"from,omitempty"`
	// Checkpoints are its checkpoints, oldest first; CheckpointSeq
	// numbers them (the last one's number).
	Checkpoints   []Checkpoint `json:"checkpoints,omitempty"`
	CheckpointSeq int          `json:"-"`
}

// SandboxState is where a kept sandbox is in its life.
type SandboxState string

const (
	SandboxRunning  SandboxState = "running"  // a command runs in it
	SandboxIdle     SandboxState = "idle"     // none runs; it waits, alive
	SandboxPaused   SandboxState = "paused"   // frozen, its memory kept
	SandboxReleased SandboxState = "released" // destroyed on request
	SandboxGone     SandboxState = "gone"     // destroyed by a timer or lost
)

// Terminal: the sandbox no longer exists.
func (s SandboxState) Terminal() bool { return s == SandboxReleased || s == SandboxGone }

// Limits of kept sandboxes; the engine's settings may lower them.
const (
	DefaultSandboxIdle     = 30 * time.Minute
	DefaultSandboxPause    = 24 * time.Hour
	DefaultSandboxLifetime = 24 * time.Hour
	MaxSandboxLifetime     = 30 * 24 * time.Hour
	// DefaultMaxSandboxes is how many kept sandboxes may exist at once.
	DefaultMaxSandboxes = 8
	// MaxSandboxCommands is how many commands may run at once in one
	// sandbox.
	MaxSandboxCommands = 8
	// MaxFileRead is the most a file read returns at once.
	MaxFileRead = 1 << 20
)

// SandboxSpec is what a sandbox is opened with; zero fields get the
// server's defaults.
type SandboxSpec struct {
	Resources  *Resources `json:"resources,omitempty"`
	VMTemplate string     `json:"vmTemplate,omitempty"`
	Network    Network    `json:"network,omitzero"`
	// Timeouts in seconds: idle before it is paused, paused before it
	// goes, and its whole lifetime.
	IdleTimeout  int `json:"idle_timeout,omitempty" delegate:"seconds"`
	PauseTimeout int `json:"pause_timeout,omitempty" delegate:"seconds"`
	Lifetime     int `json:"lifetime,omitempty" delegate:"seconds"`
}

// Validate checks a spec's values, naming the field at fault.
func (s *SandboxSpec) Validate() error {
	m := Manifest{AgentType: AgentScript, Task: "true", Resources: s.Resources, VMTemplate: s.VMTemplate, Network: s.Network}
	if err := m.Validate(); err != nil {
		return err
	}
	for _, t := range []struct {
		field string
		v     int
	}{{"idle_timeout", s.IdleTimeout}, {"pause_timeout", s.PauseTimeout}, {"lifetime", s.Lifetime}} {
		if t.v < 0 || t.v > int(MaxSandboxLifetime/time.Second) {
			return fieldErr(t.field, "must be between 1 and %d seconds (got %d; leave it out for the default)", int(MaxSandboxLifetime/time.Second), t.v)
		}
	}
	return nil
}

// SandboxTimers sets a kept sandbox's timers after it was made: the
// sandbox of a persistent job (sandboxes open --workspace) is made with
// the server's. The engine implements it beside SandboxService.
type SandboxTimers interface {
	// SetSandboxTimers sets the spec's idle and pause timeouts and its
	// lifetime (counted from the sandbox's creation), in seconds, at most
	// the server's settings (idle_timeout, pause_timeout, lifetime are
	// the fields of an error); a zero one is left as it is. Its
	// Resources, VMTemplate and Network must be empty.
	SetSandboxTimers(ctx context.Context, id string, spec SandboxSpec) (*Sandbox, error)
}

// SandboxArchives copies trees into and out of a kept sandbox's
// workspace as tar streams (delegate cp -r). The engine implements it
// beside SandboxService, for the backends whose sandboxes take archives.
type SandboxArchives interface {
	// PutSandboxArchive unpacks a tar stream into /workspace: names
	// relative to it and clean, nothing written through a link,
	// permissions and times kept, parents made.
	PutSandboxArchive(ctx context.Context, id string, tar io.Reader) error
	// GetSandboxArchive returns /workspace as a tar stream (gzip or not;
	// links as links; git's objects may be left out), or only the tree of
	// its directory dir (relative to /workspace; "" for all of it) where
	// the backend can pack one directory, with names relative to
	// /workspace either way. The caller closes it.
	GetSandboxArchive(ctx context.Context, id, dir string) (io.ReadCloser, error)
}

// FileInfo is an entry of a sandbox's workspace.
type FileInfo struct {
	Path    string      `json:"path"`
	Type    string      `json:"type"` // file, dir, link, other
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"-"`
	ModTime time.Time   `json:"mtime"`
	Link    string      `json:"link,omitempty"`
}

// FileType names an entry's type for FileInfo.Type.
func FileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "link"
	}
	return "other"
}

// FileListing is what ListSandboxFiles found.
type FileListing struct {
	Entries []FileInfo `json:"entries"`
	// Truncated: the limit stopped the listing; list a directory below,
	// or raise the limit.
	Truncated bool `json:"truncated,omitempty"`
}

// FileContent is part of a file.
type FileContent struct {
	Data []byte `json:"-"`
	// Offset is where Data starts; Size the file's whole size; EOF says
	// Data reaches its end (else read on from Offset+len(Data)).
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
	EOF    bool  `json:"eof"`
}

// FileListOptions choose what ListSandboxFiles lists.
type FileListOptions struct {
	Path  string // inside /workspace; "" for /workspace
	Depth int    // levels: 1 the entries of Path, 0 the default (1)
	Limit int    // 0: DefaultFileLimit
}

// Listing bounds.
const (
	DefaultFileLimit = 1000
	MaxFileLimit     = 10000
	MaxFileDepth     = 32
)

// SandboxListOptions select kept sandboxes.
type SandboxListOptions struct {
	// All includes those released or gone (newest first); otherwise only
	// the ones that exist.
	All   bool
	Limit int // 0: DefaultPageSize
}

// SandboxService keeps sandboxes an agent works in. A command in a kept
// sandbox is a job (JobService.Submit with manifest.sandbox), so every
// job tool works on it unchanged. Errors wrap the package's sentinels: a
// *NotFoundError names the sandbox and how to list them.
type SandboxService interface {
	// OpenSandbox makes a kept sandbox with no command run yet.
	OpenSandbox(ctx context.Context, spec SandboxSpec) (*Sandbox, error)
	// GetSandbox describes one.
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// ListSandboxes lists them, newest first.
	ListSandboxes(ctx context.Context, opts SandboxListOptions) ([]Sandbox, error)
	// ReleaseSandbox destroys one; released is false when it was gone
	// already (it is returned as it is).
	ReleaseSandbox(ctx context.Context, id string) (sb *Sandbox, released bool, err error)
	// ReadSandboxFile reads part of a file of its workspace (at most
	// MaxFileRead bytes); a paused sandbox is resumed first.
	ReadSandboxFile(ctx context.Context, id, path string, offset, length int64) (*FileContent, error)
	// WriteSandboxFile writes a file of its workspace, making its parent
	// directories.
	WriteSandboxFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error
	// ListSandboxFiles lists a directory of its workspace.
	ListSandboxFiles(ctx context.Context, id string, opts FileListOptions) (*FileListing, error)
}

// SandboxStore keeps sandboxes. UpdateSandbox changes one in a
// transaction: a terminal state is final (ErrTerminal), as a job's is.
//
// A sandbox's activity is read from its jobs (those whose Sandbox is its
// id), never stored with it, so that a command costs its sandbox no
// write: Commands counts them, Running those not ended (FinishedAt zero),
// LastUsedAt is the later of its own and their last end, and a live
// sandbox not paused is SandboxRunning while Running > 0, SandboxIdle
// otherwise. What UpdateSandbox's fn sets for these is not kept (but
// LastUsedAt, when later).
type SandboxStore interface {
	CreateSandbox(ctx context.Context, sb *Sandbox) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// GetSandboxUncounted is GetSandbox without Commands (0), whose count
	// reads every job the sandbox had: a command's start reads this.
	GetSandboxUncounted(ctx context.Context, id string) (*Sandbox, error)
	// UpdateSandbox gives fn the sandbox uncounted, and returns it so.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (*Sandbox, error)
	// ListSandboxes lists newest first; live selects those not terminal.
	ListSandboxes(ctx context.Context, live bool, limit int) ([]Sandbox, error)
	// SandboxOfInstance finds the sandbox a backend instance is, or
	// ErrNotFound.
	SandboxOfInstance(ctx context.Context, backend, instance string) (*Sandbox, error)
}

// SandboxNotFound is the error for a sandbox id that names none (the
// adapters say how to list them).
func SandboxNotFound(id string) *NotFoundError { return &NotFoundError{Resource: "sandbox", ID: id} }

// CheckSandboxID refuses what cannot be a sandbox id, naming the field.
func CheckSandboxID(field, id string) error {
	if len(id) == 0 || len(id) > 64 {
		return fieldErr(field, "must be a sandbox id like sbx-… (got %q)", id)
	}
	for _, c := range id {
		if !(c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fieldErr(field, "must be a sandbox id like sbx-… (got %q)", id)
		}
	}
	return nil
}
