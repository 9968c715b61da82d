package engine

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// Workspaces (issue 18): a manifest's workspace source is checked at
// submission (nothing is stored when it is bad), copied into the sandbox
// by a provisioning step after the sandbox is made (importWorkspace), and
// what the job changed there is computed before the sandbox goes and kept
// with the job (collectChanges), against the baseline of the import that
// the store keeps, so that a restarted server can still do it. The
// workspace package does the reading and writing; the sandbox contract's
// Archiver moves the streams.

// workspaces is the part that moves a job's workspace: its source
// copied into the new sandbox (a git source cloned on this host first),
// what the job changed read back before the sandbox goes, and the clone
// removed once it is no longer needed. It keeps no state of its own: the
// baseline of each import is in the store.
type workspaces struct {
	cfg      Config
	log      *slog.Logger
	store    delegate.Store
	progress *progressWriter
}

// maxChangesBytes caps the new content of a job's changes that is kept.
const maxChangesBytes = 64 << 20

// rootOf is the allowed root a directory lies under, or "".
func rootOf(roots []string, dir string) string {
	dir = filepath.Clean(dir)
	for _, r := range roots {
		if dir == r || strings.HasPrefix(dir, r+"/") || r == "/" {
			return r
		}
	}
	return ""
}

// dirErr is a scan's error as the field error of manifest.workspace.dir.
func dirErr(err error, capWhy string) error {
	var ce *workspace.CapError
	switch {
	case errors.As(err, &ce) && ce.What == "bytes":
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("%v (the cap is the least of the server's and %s)", err, capWhy)}
	case errors.As(err, &ce):
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("%v (DELEGATE_WORKSPACE_MAX_FILES)", err)}
	case errors.Is(err, fs.ErrNotExist):
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("does not exist: %v", err)}
	case errors.Is(err, fs.ErrPermission):
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("cannot be read by its owner: %v", err)}
	case errors.Is(err, workspace.ErrNotAbsolute), errors.Is(err, workspace.ErrNotDirectory), errors.Is(err, workspace.ErrOutside),
		errors.Is(err, workspace.ErrSymlink), errors.Is(err, workspace.ErrOtherFilesystem), errors.Is(err, workspace.ErrChanged), errors.Is(err, workspace.ErrGitDir),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.ENOTDIR):
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: err.Error()}
	}
	return fmt.Errorf("manifest.workspace.dir: %w", err)
}

// gitErr is a git source's error as a field error.
func gitErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, workspace.ErrUnknownRef):
		return &delegate.FieldError{Field: "manifest.workspace.ref", Rule: err.Error()}
	case errors.Is(err, workspace.ErrBadURL), errors.Is(err, workspace.ErrAddressRefused):
		return &delegate.FieldError{Field: "manifest.workspace.git", Rule: err.Error()}
	}
	var ce *workspace.CapError
	if errors.As(err, &ce) {
		return &delegate.FieldError{Field: "manifest.workspace.git", Rule: err.Error()}
	}
	return &delegate.FieldError{Field: "manifest.workspace.git", Rule: fmt.Sprintf("could not be read: %v", err)}
}

// CacheKey is the key of a principal's caches of a source: a directory by
// its path, a git source by its URL and ref (a branch's dependencies are
// not another's). Two principals never share a cache, nor two sources
// (issue 34, item 5: a cache keyed by the source alone let any client
// naming it leave files the next job of the project ran); a principal's
// jobs of one source do, and trust each other. Jobs stored before
// principals existed are the local user's.
func CacheKey(principal string, w *delegate.WorkspaceSource) string {
	if principal == "" {
		principal = delegate.LocalPrincipal
	}
	src := "dir\x00" + filepath.Clean(w.Dir)
	if w.Git != "" {
		src = "git\x00" + w.Git + "\x00" + w.Ref
	}
	sum := sha256.Sum256([]byte(principal + "\x00" + src))
	return hex.EncodeToString(sum[:16])
}

// cacheEnv are the variables that point each cache's tools at it.
var cacheEnv = map[string][][2]string{
	"go":    {{"GOCACHE", delegate.CacheDir + "/go/build"}, {"GOMODCACHE", delegate.CacheDir + "/go/mod"}},
	"npm":   {{"npm_config_cache", delegate.CacheDir + "/npm"}},
	"pip":   {{"PIP_CACHE_DIR", delegate.CacheDir + "/pip"}},
	"cargo": {{"CARGO_HOME", delegate.CacheDir + "/cargo"}},
}

// workspaceEnv sets what a job with a workspace source needs: HOME out of
// /workspace (nothing a tool keeps there shows in the changes), and the
// caches' variables.
func workspaceEnv(env map[string]string, w *delegate.WorkspaceSource, caches []string) {
	if w == nil {
		return
	}
	env["HOME"] = "/tmp"
	for _, c := range caches {
		for _, kv := range cacheEnv[c] {
			env[kv[0]] = kv[1]
		}
	}
}

// cloneDir is where a job's git source is cloned on this host (a dir
// source is read where it is).
func (r *workspaces) cloneDir(id string) string { return filepath.Join(r.cfg.CloneDir, id) }

// importWorkspace is the provisioning step that copies the job's source
// into its new sandbox (a git source cloned first), lists what was
// skipped in the timeline, and stores the baseline of the copy.
func (r *workspaces) importWorkspace(ctx context.Context, a *attempt, step func(msg string)) error {
	m := a.job.Manifest
	w := m.Workspace
	if w == nil {
		return nil
	}
	ar, ok := a.sb.(sandbox.Archiver)
	if !ok {
		return errors.New("the sandbox cannot take a workspace (the backend has no Archiver)")
	}
	maxBytes, maxFiles, why := r.cfg.workspaceLimits(&m)
	dir, root := w.Dir, rootOf(r.cfg.WorkspaceRoots, w.Dir)
	if w.Git != "" {
		ref := w.Ref
		if ref == "" {
			ref = "the default branch"
		}
		step(fmt.Sprintf("cloning %s at %s", w.Git, ref))
		var err error
		if dir, err = r.clone(ctx, a.job.ID, w, maxBytes, maxFiles); err != nil {
			return err
		}
		root = ""
	} else if root == "" {
		return fmt.Errorf("manifest.workspace.dir: %s is no longer under an allowed root (DELEGATE_WORKSPACE_ROOTS)", w.Dir)
	}
	opts := workspace.ScanOptions{IncludeIgnored: w.IncludeIgnored, MaxBytes: maxBytes, MaxFiles: maxFiles, Within: root}
	var tree *workspace.Tree
	var err error
	if s := a.scanned; s != nil && w.Git == "" && s.Root == filepath.Clean(dir) {
		a.scanned = nil // not held while the job runs
		// The submission's scan, if a scan now would find the same.
		if tree, err = s.Rescan(ctx, opts); tree == s {
			r.log.Debug("workspace: the submission's scan is current", "job", a.job.ID)
		}
	} else {
		tree, err = workspace.Scan(ctx, dir, opts)
	}
	if err != nil {
		return fmt.Errorf("workspace: %w", dirErr(err, why))
	}
	step(fmt.Sprintf("copying workspace (%d files, %.1f MB)", tree.Files, float64(tree.Bytes)/1e6))
	_, local := a.sb.(sandbox.HostWorkspace)
	// The archive as a stream, which the local backend has write itself
	// straight into its helper's pipe.
	src := tree.Stream(ctx, workspace.ArchiveOptions{Gzip: !local})
	unpacked, err := ar.PutArchive(ctx, src)
	src.Close()
	base, aerr := src.Result()
	switch {
	case aerr != nil && errors.Is(aerr, workspace.ErrChanged):
		return fmt.Errorf("the workspace source changed while it was copied (%v): submit the job again", aerr)
	case err != nil:
		return fmt.Errorf("copy the workspace: %w", err)
	case aerr != nil:
		return fmt.Errorf("copy the workspace: %w", aerr)
	}
	if m.StatusMode != delegate.StatusModeSimple {
		now := time.Now().UTC()
		for i, sk := range tree.Skipped {
			if i == 20 {
				r.progress.event(a.job.ID, fmt.Sprintf("workspace: %d more special files skipped", tree.SkippedCount-20), now)
				break
			}
			r.progress.event(a.job.ID, fmt.Sprintf("workspace: skipped %s (%s)", sk.Path, sk.Reason), now)
		}
		for _, sk := range unpacked.Skipped {
			r.progress.event(a.job.ID, "workspace: skipped "+sk, now)
		}
	}
	data := base.JSON()
	if err := r.store.SaveBaseline(ctx, a.job.ID, dir, data); err != nil {
		return err
	}
	if len(data) <= maxKeptBaseline {
		a.imported = &delegate.JobWorkspace{Source: dir, Baseline: data}
	}
	return nil
}

// maxKeptBaseline bounds the baseline a run keeps from its import to its
// end (10,000 files make 1.7 MB): the changes are then computed without
// reading it back from the store and gunzipping it (8 ms of those
// 10,000 files' job; issue 41, item 3). A larger one is read back.
const maxKeptBaseline = 4 << 20

// clone fetches a git source into a directory of the job's own, owned by
// nobody when the server runs as root: the clone runs as that directory's
// owner, with none of the server's credentials.
func (r *workspaces) clone(ctx context.Context, id string, w *delegate.WorkspaceSource, maxBytes int64, maxFiles int) (string, error) {
	if err := os.MkdirAll(r.cfg.CloneDir, 0o700); err != nil {
		return "", fmt.Errorf("clone: %w", err)
	}
	dir := r.cloneDir(id)
	os.RemoveAll(dir) // a provisioning attempt before a restart
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("clone: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, nobody, nobody); err != nil {
			return "", fmt.Errorf("clone: %w", err)
		}
	}
	_, err := workspace.Clone(ctx, workspace.CloneOptions{URL: w.Git, Ref: w.Ref, Dir: dir, Dial: r.cfg.gitDial(), MaxBytes: maxBytes, MaxFiles: maxFiles})
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("clone %s: %w", w.Git, gitErr(err))
	}
	return dir, nil
}

// nobody owns clones (the overflow uid of Linux).
const nobody = 65534

// baselineOf finds the baseline a job's changes are computed against: its
// own, or for a command in a kept sandbox, that of the job that made the
// sandbox (or the sandbox it was forked from: makerOf). It returns the job's manifest's workspace source too.
func baselineOf(ctx context.Context, store delegate.Store, j *delegate.Job) (*delegate.JobWorkspace, *delegate.WorkspaceSource, error) {
	jw, err := store.JobWorkspace(ctx, j.ID)
	if err == nil && jw.Baseline != nil {
		return jw, j.Manifest.Workspace, nil
	}
	if err != nil && !errors.Is(err, delegate.ErrNotFound) {
		return nil, nil, err
	}
	if j.Manifest.Sandbox == "" {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	sb, err := store.GetSandbox(ctx, j.Manifest.Sandbox)
	if err != nil {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	made := makerOf(ctx, store, sb)
	if made == "" {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	maker, err := store.GetJob(ctx, made)
	if err != nil {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	mw, err := store.JobWorkspace(ctx, made)
	if err != nil || mw.Baseline == nil {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	return mw, maker.Manifest.Workspace, nil
}

// collectChanges computes what the job changed in its workspace, before
// its sandbox goes, and stores them with their summary (or why they
// could not be had). imported is the baseline of the job's own import
// as its run stored it, if the run kept it (nil: read from the store).
func (r *workspaces) collectChanges(ctx context.Context, id string, inst sandbox.Instance, imported *delegate.JobWorkspace) {
	j, err := r.store.GetJob(ctx, id)
	if err != nil || (j.Manifest.Workspace == nil && j.Manifest.Sandbox == "") {
		return
	}
	jw, src := imported, j.Manifest.Workspace
	if jw == nil || src == nil {
		if jw, src, err = baselineOf(ctx, r.store, j); err != nil {
			return // no workspace was imported (or it failed before)
		}
	}
	sum, data, err := r.changes(ctx, j, jw, src, inst)
	if err != nil {
		r.log.Warn("workspace changes", "job", id, "err", err)
		sum = delegate.WorkspaceChanges{Files: []delegate.ChangedFile{}, Error: err.Error()}
		data = nil
	}
	if err := r.store.SaveChanges(ctx, id, sum, data); err != nil {
		r.log.Error("store the workspace changes", "job", id, "err", err)
		return
	}
	msg := fmt.Sprintf("changes: %d added, %d modified, %d deleted", sum.Added, sum.Modified, sum.Deleted)
	if sum.Error != "" {
		msg = "changes not kept: " + sum.Error
	}
	if j.Manifest.StatusMode != delegate.StatusModeSimple {
		r.progress.event(id, msg, time.Now().UTC())
	}
}

// changes reads the workspace back and compares it with the baseline: in
// place where the server reaches it, else through the archive.
func (r *workspaces) changes(ctx context.Context, j *delegate.Job, jw *delegate.JobWorkspace, src *delegate.WorkspaceSource, inst sandbox.Instance) (delegate.WorkspaceChanges, []byte, error) {
	base, err := workspace.ParseBaseline(jw.Baseline)
	if err != nil {
		return delegate.WorkspaceChanges{}, nil, fmt.Errorf("the stored baseline: %w", err)
	}
	opts := workspace.ChangesOptions{MaxBytes: maxChangesBytes}
	var cs *workspace.Changes
	switch s := inst.(type) {
	case sandbox.HostWorkspace:
		cs, err = workspace.DirChanges(ctx, base, s.WorkspaceDir(), opts)
	case sandbox.Archiver:
		var rc io.ReadCloser
		if rc, err = s.GetArchive(ctx); err == nil {
			cs, err = workspace.ReadChanges(ctx, base, rc, opts)
			rc.Close()
		}
	default:
		err = errors.New("the sandbox cannot give its workspace back (the backend has no Archiver)")
	}
	if err != nil {
		var ce *workspace.CapError
		if errors.As(err, &ce) {
			return delegate.WorkspaceChanges{}, nil, fmt.Errorf("the changes are too large to keep: %w", err)
		}
		return delegate.WorkspaceChanges{}, nil, err
	}
	// The manifest's files are input, not changes.
	if files, ferr := r.store.JobFiles(ctx, j.ID); ferr == nil && len(files) > 0 {
		input := map[string]bool{}
		for _, f := range files {
			if p, err := delegate.WorkspacePath(f.Path); err == nil {
				input[strings.TrimPrefix(p, delegate.Workspace+"/")] = true
			}
		}
		cs.Changes = slices.DeleteFunc(cs.Changes, func(c workspace.Change) bool { return input[c.Path] })
		recount(cs)
	}
	// The old side, for the diff and the patch: the source as it is now
	// (a file changed there since gets OldMissing).
	within := ""
	if src != nil && src.Dir != "" {
		within = rootOf(r.cfg.WorkspaceRoots, src.Dir)
	}
	if err := cs.ReadOld(ctx, jw.Source, within); err != nil {
		r.log.Warn("workspace: read the old side", "job", j.ID, "source", jw.Source, "err", err)
	}
	data, err := json.Marshal(cs)
	if err != nil {
		return delegate.WorkspaceChanges{}, nil, err
	}
	return summarize(cs), gzipped(data), nil
}

// recount sets the counts of cs from its changes.
func recount(cs *workspace.Changes) {
	cs.Added, cs.Modified, cs.Deleted, cs.Bytes = 0, 0, 0, 0
	for _, c := range cs.Changes {
		switch c.Kind {
		case workspace.Added:
			cs.Added++
		case workspace.Modified:
			cs.Modified++
		case workspace.Deleted:
			cs.Deleted++
		}
		if c.New != nil && c.New.Data != nil {
			cs.Bytes += c.New.Size
		}
	}
}

// summarize is the changes as a result shows them.
func summarize(cs *workspace.Changes) delegate.WorkspaceChanges {
	s := delegate.WorkspaceChanges{Added: cs.Added, Modified: cs.Modified, Deleted: cs.Deleted, Bytes: cs.Bytes,
		IgnoredAdded: cs.IgnoredAdded, Skipped: len(cs.Skipped), Files: []delegate.ChangedFile{}}
	for i, c := range cs.Changes {
		if i == delegate.MaxChangedFiles {
			s.More = len(cs.Changes) - i
			break
		}
		f := delegate.ChangedFile{Path: c.Path, Kind: string(c.Kind), Binary: c.Binary}
		if c.New != nil {
			f.Size = c.New.Size
		}
		s.Files = append(s.Files, f)
	}
	return s
}

// removeClone removes a job's clone once its changes are kept (a kept
// sandbox's stays while the sandbox does: its commands' changes need it).
func (r *workspaces) removeClone(id string, m delegate.Manifest) {
	if m.Workspace == nil || m.Workspace.Git == "" || r.cfg.CloneDir == "" {
		return
	}
	if err := os.RemoveAll(r.cloneDir(id)); err != nil {
		r.log.Warn("remove the clone", "job", id, "err", err)
	}
}

func gzipped(data []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

func gunzipped(data []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}
