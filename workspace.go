package delegate

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
)

// WorkspaceSource is where a job's /workspace comes from, besides (or
// instead of) manifest.files: a directory on the server's machine, or a
// git repository cloned on the server's side. The engine copies it in
// while the sandbox is provisioned and, after the job, keeps what the job
// changed in it (JobResult.Changes, WorkspaceService).
type WorkspaceSource struct {
	// Dir is an absolute path under one of the roots the operator allows
	// (DELEGATE_WORKSPACE_ROOTS). A git work tree comes as git sees it.
	Dir string `json:"dir,omitempty"`
	// Git is an https URL, or the absolute path of a repository under
	// one of the allowed roots (a work tree or a bare repository: cloned,
	// never mounted); Ref a branch, tag or commit (default: the remote's
	// default branch).
	Git string `json:"git,omitempty"`
	Ref string `json:"ref,omitempty"`
	// IncludeIgnored takes the files git ignores too (build outputs,
	// node_modules).
	IncludeIgnored bool `json:"includeIgnored,omitempty"`
}

// Caches a job may ask for (manifest.caches), each mounted at
// /cache/NAME with the variables its tools read set.
var Caches = []string{"go", "npm", "pip", "cargo"}

// CacheDir is where caches are mounted in a sandbox.
const CacheDir = "/cache"

// Bounds of a workspace source's fields.
const (
	maxWorkspacePath = 4096
	maxGitURL        = 2048
	maxGitRef        = 256
)

// validateWorkspace checks the workspace source's and the caches' syntax;
// what the source holds (and whether it may be read) is the engine's to
// check at submission.
func (m *Manifest) validateWorkspace() error {
	if w := m.Workspace; w != nil {
		switch {
		case w.Dir == "" && w.Git == "":
			return fieldErr("manifest.workspace", "needs dir (a directory on the server) or git (an https URL)")
		case w.Dir != "" && w.Git != "":
			return fieldErr("manifest.workspace", "takes dir or git, not both")
		case w.Dir != "":
			if rule := TextRule(w.Dir, maxWorkspacePath); rule != "" {
				return fieldErr("manifest.workspace.dir", "%s", rule)
			}
			if !path.IsAbs(w.Dir) {
				return fieldErr("manifest.workspace.dir", "must be an absolute path: %q is not", w.Dir)
			}
			if w.Ref != "" {
				return fieldErr("manifest.workspace.ref", "is for a git source: a dir comes as it is on disk")
			}
		default:
			if rule := TextRule(w.Git, maxGitURL); rule != "" {
				return fieldErr("manifest.workspace.git", "%s", rule)
			}
			if !strings.HasPrefix(w.Git, "https://") && !path.IsAbs(w.Git) {
				return fieldErr("manifest.workspace.git", "must be an https URL or the absolute path of a repository under an allowed root (DELEGATE_WORKSPACE_ROOTS): %q is neither", w.Git)
			}
			if len(w.Ref) > maxGitRef || strings.ContainsAny(w.Ref, "\x00 \t\n~^:?*[\\") || strings.HasPrefix(w.Ref, "-") {
				return fieldErr("manifest.workspace.ref", "must be a branch, tag or commit id (at most %d bytes, no spaces or ~^:?*[\\)", maxGitRef)
			}
		}
		if m.Sandbox != "" {
			return fieldErr("manifest.workspace", "is the kept sandbox's own (imported by the job that made it): leave it out for a command in sandbox %s", m.Sandbox)
		}
	}
	for i, c := range m.Caches {
		field := fmt.Sprintf("manifest.caches[%d]", i)
		if !slices.Contains(Caches, c) {
			return fieldErr(field, "must be one of %s: %q is not", strings.Join(Caches, ", "), c)
		}
		if slices.Index(m.Caches, c) != i {
			return fieldErr(field, "%q is named twice", c)
		}
	}
	if len(m.Caches) > 0 && m.Workspace == nil {
		return fieldErr("manifest.caches", "needs manifest.workspace: a cache is kept per project (its workspace source)")
	}
	return nil
}

// WorkspaceChanges is what a job changed in its imported workspace, as a
// result shows it: counts, and the first paths.
type WorkspaceChanges struct {
	Added    int   `json:"added"`
	Modified int   `json:"modified"`
	Deleted  int   `json:"deleted"`
	Bytes    int64 `json:"bytes"` // of the new contents
	// Files are the first MaxChangedFiles changes, by path; More counts
	// the rest.
	Files []ChangedFile `json:"files"`
	More  int           `json:"more,omitempty"`
	// IgnoredAdded counts new files git ignores (build outputs), left out.
	IgnoredAdded int `json:"ignored_added,omitempty"`
	// Skipped counts special files (sockets, fifos) left out.
	Skipped int `json:"skipped,omitempty"`
	// Error says why the changes could not be kept (over a cap, the
	// sandbox lost); the counts are then zero.
	Error string `json:"error,omitempty"`
}

// MaxChangedFiles is how many changed paths a result lists.
const MaxChangedFiles = 100

// ChangedFile is one path a job added, modified or deleted.
type ChangedFile struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"` // added, modified, deleted
	Size   int64  `json:"size"` // the new size (0 when deleted)
	Binary bool   `json:"binary,omitempty"`
}

// DiffOptions choose a page of a job's diff.
type DiffOptions struct {
	// Offset is where the page starts: 0, or the Next of the page before.
	Offset int64
	// Limit is the page's bytes (0: 64 KiB; at most MaxDiffPage).
	Limit int
}

// MaxDiffPage bounds a page of a diff.
const MaxDiffPage = 1 << 20

// DiffPage is part of the unified diff of a job's changes.
type DiffPage struct {
	Text   string `json:"text"`
	Offset int64  `json:"offset"`
	// Next is where the next page starts, 0 after the last.
	Next  int64 `json:"next,omitempty"`
	Total int64 `json:"total"`
	// Omitted counts files past the diff's cap, named and not shown.
	Omitted int `json:"omitted,omitempty"`
}

// ChangeSet is everything needed to apply a job's changes elsewhere: the
// source it was imported from, and the baseline of the import and the
// changes as the workspace package writes them (JSON).
type ChangeSet struct {
	JobID string
	// Sandbox is the kept sandbox the job ran in or made ("" for none).
	Sandbox  string
	Source   WorkspaceSource
	Baseline []byte
	Changes  []byte
}

// WorkspaceService gives a job's changes to its workspace. The engine
// implements it beside JobService; ErrNotFound for a job without a
// workspace source, ErrNotFinished before its changes are known. Where a
// job's id is asked for, a kept sandbox's id means its latest command
// that has ended (its changes are all of the sandbox's since the import).
type WorkspaceService interface {
	// Changes summarises them (what a result shows).
	Changes(ctx context.Context, id string) (*WorkspaceChanges, error)
	// Diff is one page of the unified diff (binary files named).
	Diff(ctx context.Context, id string, opts DiffOptions) (*DiffPage, error)
	// Patch is the whole change as a patch `git apply` takes.
	Patch(ctx context.Context, id string) ([]byte, error)
	// ChangeSet returns them whole, for Apply and branches.
	ChangeSet(ctx context.Context, id string) (*ChangeSet, error)
	// LastApplied is the change set written last into target (an
	// absolute directory) from the same kept sandbox as job id (or from
	// id itself, for a job that kept none), nil when none was: a later
	// apply there starts from the state it left (workspace's Since), so
	// that only what someone else changed there since is a conflict.
	LastApplied(ctx context.Context, id, target string) (*ChangeSet, error)
	// RecordApplied records that job id's changes were written into
	// target.
	RecordApplied(ctx context.Context, id, target string) error
}

// JobWorkspace is what the store keeps of a job's workspace: the
// baseline of its import (JSON, written at provisioning) and, once the
// job has ended, its changes (JSON, perhaps compressed: the engine's
// business) and their summary.
type JobWorkspace struct {
	// Source is where the import was read from on the server: the source
	// directory, or the clone of a git source (the old side of a diff).
	Source   string
	Baseline []byte
	Changes  []byte
	Summary  *WorkspaceChanges
}

// WorkspaceStore keeps jobs' workspaces. SaveBaseline comes first;
// SaveChanges on a job without one is ErrNotFound.
type WorkspaceStore interface {
	SaveBaseline(ctx context.Context, id, source string, baseline []byte) error
	SaveChanges(ctx context.Context, id string, summary WorkspaceChanges, changes []byte) error
	// JobWorkspace returns a job's (ErrNotFound when it has none).
	JobWorkspace(ctx context.Context, id string) (*JobWorkspace, error)
	// SaveApply records that job's changes were written into target, the
	// last from chain (a kept sandbox's id, or the job's own), replacing
	// the one before; ErrNotFound when job is none. It goes with the job.
	SaveApply(ctx context.Context, chain, target, job string) error
	// LastApply is the job whose changes were written last into target
	// from chain ("" when none was).
	LastApply(ctx context.Context, chain, target string) (string, error)
}

// WorkspaceNotFound is the error for a job that has no workspace (it was
// submitted without one).
func WorkspaceNotFound(id string) *NotFoundError {
	return &NotFoundError{Resource: "job", ID: id, Reason: "has no workspace: it was submitted without manifest.workspace"}
}
