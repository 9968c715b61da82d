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
	"net"
	"net/netip"
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

// maxChangesBytes caps the new content of a job's changes that is kept.
const maxChangesBytes = 64 << 20

// workspaceLimits are the caps of a job's source: the operator's, and
// never more than half the job's memory (the workspace is memory on the
// local backend, and on a VM the copy passes through it), nor more than
// its disk.
func (c *Config) workspaceLimits(m *delegate.Manifest) (maxBytes int64, maxFiles int, why string) {
	maxBytes, why = c.WorkspaceMaxBytes, "DELEGATE_WORKSPACE_MAX_BYTES"
	if mem, err := delegate.ParseSize(m.Resources.Memory); err == nil && mem/2 < maxBytes {
		maxBytes, why = mem/2, fmt.Sprintf("half of resources.memory %s", m.Resources.Memory)
	}
	if disk, err := delegate.ParseSize(m.Resources.Disk); err == nil && disk < maxBytes {
		maxBytes, why = disk, fmt.Sprintf("resources.disk %s", m.Resources.Disk)
	}
	return maxBytes, c.WorkspaceMaxFiles, why
}

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

// checkWorkspace checks a submission's workspace source and caches (m has
// its defaults): the source is scanned (or the git ref asked for), so
// that what cannot be copied is a field error now.
func (e *Engine) checkWorkspace(ctx context.Context, m *delegate.Manifest, caps sandbox.Capabilities, backend string) error {
	w := m.Workspace
	if w == nil {
		return nil
	}
	if !caps.Workspaces {
		return &delegate.FieldError{Field: "manifest.workspace", Rule: fmt.Sprintf("the %s backend cannot copy a workspace in", backend)}
	}
	if len(m.Caches) > 0 && !caps.Caches {
		return &delegate.FieldError{Field: "manifest.caches", Rule: fmt.Sprintf("caches are not kept on the %s backend: leave it out", backend)}
	}
	maxBytes, maxFiles, why := e.cfg.workspaceLimits(m)
	if w.Git != "" {
		_, _, err := workspace.CheckRef(ctx, workspace.CloneOptions{URL: w.Git, Ref: w.Ref, Dial: e.cfg.gitDial()})
		return gitErr(err)
	}
	root := rootOf(e.cfg.WorkspaceRoots, w.Dir)
	if root == "" {
		if len(e.cfg.WorkspaceRoots) == 0 {
			return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: "directories are not allowed on this server: the operator allows them with DELEGATE_WORKSPACE_ROOTS (a list of directories)"}
		}
		return &delegate.FieldError{Field: "manifest.workspace.dir", Rule: fmt.Sprintf("%s is not under an allowed root (DELEGATE_WORKSPACE_ROOTS: %s)", w.Dir, strings.Join(e.cfg.WorkspaceRoots, ", "))}
	}
	tree, err := workspace.Scan(ctx, w.Dir, workspace.ScanOptions{IncludeIgnored: w.IncludeIgnored, MaxBytes: maxBytes, MaxFiles: maxFiles, Within: root})
	if err != nil {
		return dirErr(err, why)
	}
	// The manifest's files are the job's input, not the project's: they
	// must not shadow a file of it (and never show as changes).
	entries := make(map[string]bool, len(tree.Entries))
	for _, en := range tree.Entries {
		entries[en.Path] = true
	}
	for i, f := range m.Files {
		if p, err := delegate.WorkspacePath(f.Path); err == nil && entries[strings.TrimPrefix(p, delegate.Workspace+"/")] {
			return &delegate.FieldError{Field: fmt.Sprintf("manifest.files[%d].path", i), Rule: fmt.Sprintf("%s is also in the workspace source: change it there, or name another path", f.Path)}
		}
	}
	return nil
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

// gitDial is the address policy of clones: public addresses, and those
// the operator allows besides (DELEGATE_WORKSPACE_GIT_ALLOW), checked on
// the address connected to, after DNS.
func (c *Config) gitDial() workspace.DialFunc {
	if len(c.GitAllow) == 0 {
		return workspace.PublicDial
	}
	allow := c.GitAllow
	d := &net.Dialer{Timeout: 30 * time.Second, Control: func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %s", workspace.ErrAddressRefused, address)
		}
		ip := ap.Addr().Unmap()
		for _, p := range allow {
			if p.Contains(ip) {
				return nil
			}
		}
		return workspace.CheckAddress(ip)
	}}
	return d.DialContext
}

// CacheKey is the key of a source's caches: two sources never share one.
func CacheKey(w *delegate.WorkspaceSource) string {
	src := "dir\x00" + filepath.Clean(w.Dir)
	if w.Git != "" {
		src = "git\x00" + w.Git
	}
	sum := sha256.Sum256([]byte(src))
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

// sourceDir is where a job's source is read on this host: the directory,
// or the clone of a git source.
func (r *runner) cloneDir(id string) string { return filepath.Join(r.cfg.CloneDir, id) }

// importWorkspace is the provisioning step that copies the job's source
// into its new sandbox (a git source cloned first), lists what was
// skipped in the timeline, and stores the baseline of the copy.
func (r *runner) importWorkspace(ctx context.Context, a *attempt) error {
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
		r.step(ctx, a, fmt.Sprintf("cloning %s at %s", w.Git, ref))
		var err error
		if dir, err = r.clone(ctx, a.job.ID, w, maxBytes, maxFiles); err != nil {
			return err
		}
		root = ""
	} else if root == "" {
		return fmt.Errorf("manifest.workspace.dir: %s is no longer under an allowed root (DELEGATE_WORKSPACE_ROOTS)", w.Dir)
	}
	tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{IncludeIgnored: w.IncludeIgnored, MaxBytes: maxBytes, MaxFiles: maxFiles, Within: root})
	if err != nil {
		return fmt.Errorf("workspace: %w", dirErr(err, why))
	}
	r.step(ctx, a, fmt.Sprintf("copying workspace (%d files, %.1f MB)", tree.Files, float64(tree.Bytes)/1e6))
	_, local := a.sb.(sandbox.HostWorkspace)
	pr, pw := io.Pipe()
	var base *workspace.Baseline
	archived := make(chan error, 1)
	go func() {
		var err error
		base, err = tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: !local})
		pw.CloseWithError(err)
		archived <- err
	}()
	unpacked, err := ar.PutArchive(ctx, pr)
	pr.CloseWithError(errors.New("the sandbox stopped reading"))
	if aerr := <-archived; aerr != nil {
		if errors.Is(aerr, workspace.ErrChanged) {
			return fmt.Errorf("the workspace source changed while it was copied (%v): submit the job again", aerr)
		}
		return fmt.Errorf("copy the workspace: %w", aerr)
	}
	if err != nil {
		return fmt.Errorf("copy the workspace: %w", err)
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
	data, err := json.Marshal(base)
	if err != nil {
		return err
	}
	return r.store.SaveBaseline(ctx, a.job.ID, dir, data)
}

// clone fetches a git source into a directory of the job's own, owned by
// nobody when the server runs as root: the clone runs as that directory's
// owner, with none of the server's credentials.
func (r *runner) clone(ctx context.Context, id string, w *delegate.WorkspaceSource, maxBytes int64, maxFiles int) (string, error) {
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
// sandbox. It returns the job's manifest's workspace source too.
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
	if err != nil || sb.JobID == "" {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	maker, err := store.GetJob(ctx, sb.JobID)
	if err != nil {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	mw, err := store.JobWorkspace(ctx, sb.JobID)
	if err != nil || mw.Baseline == nil {
		return nil, nil, delegate.WorkspaceNotFound(j.ID)
	}
	return mw, maker.Manifest.Workspace, nil
}

// collectChanges computes what the job changed in its workspace, before
// its sandbox goes, and stores them with their summary (or why they
// could not be had).
func (r *runner) collectChanges(ctx context.Context, id string, inst sandbox.Instance) {
	j, err := r.store.GetJob(ctx, id)
	if err != nil || (j.Manifest.Workspace == nil && j.Manifest.Sandbox == "") {
		return
	}
	jw, src, err := baselineOf(ctx, r.store, j)
	if err != nil {
		return // no workspace was imported (or it failed before)
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

// step says what provisioning does now: the job's progress, and an entry
// of its timeline (statusMode detailed and streaming).
func (r *runner) step(ctx context.Context, a *attempt, msg string) {
	r.stepper(ctx, a.job.ID)(msg)
	if a.job.Manifest.StatusMode != delegate.StatusModeSimple {
		r.progress.event(a.job.ID, msg, time.Now().UTC())
	}
}

// changes reads the workspace back and compares it with the baseline: in
// place where the server reaches it, else through the archive.
func (r *runner) changes(ctx context.Context, j *delegate.Job, jw *delegate.JobWorkspace, src *delegate.WorkspaceSource, inst sandbox.Instance) (delegate.WorkspaceChanges, []byte, error) {
	var base workspace.Baseline
	if err := json.Unmarshal(jw.Baseline, &base); err != nil {
		return delegate.WorkspaceChanges{}, nil, fmt.Errorf("the stored baseline: %w", err)
	}
	opts := workspace.ChangesOptions{MaxBytes: maxChangesBytes}
	var cs *workspace.Changes
	var err error
	switch s := inst.(type) {
	case sandbox.HostWorkspace:
		cs, err = workspace.DirChanges(ctx, &base, s.WorkspaceDir(), opts)
	case sandbox.Archiver:
		var rc io.ReadCloser
		if rc, err = s.GetArchive(ctx); err == nil {
			cs, err = workspace.ReadChanges(ctx, &base, rc, opts)
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
func (r *runner) removeClone(id string, m delegate.Manifest) {
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

// The read side (WorkspaceService), over the store alone.

var _ delegate.WorkspaceService = (*Reader)(nil)

// Changes implements delegate.WorkspaceService.
func (rd *Reader) Changes(ctx context.Context, id string) (*delegate.WorkspaceChanges, error) {
	j, jw, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, err
	}
	return changesSummary(j, jw)
}

func changesSummary(j *delegate.Job, jw *delegate.JobWorkspace) (*delegate.WorkspaceChanges, error) {
	if jw.Summary != nil {
		return jw.Summary, nil
	}
	if !j.Status.Terminal() {
		return nil, fmt.Errorf("job %s is %s: %w: its changes are known when it ends", j.ID, j.Status, delegate.ErrNotFinished)
	}
	return &delegate.WorkspaceChanges{Files: []delegate.ChangedFile{}, Error: "not computed: the job ended before its workspace could be read back (" + j.Error + ")"}, nil
}

// workspaceOf reads a job and its stored workspace.
func (rd *Reader) workspaceOf(ctx context.Context, id string) (*delegate.Job, *delegate.JobWorkspace, error) {
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	jw, err := rd.store.JobWorkspace(ctx, id)
	if err != nil {
		return j, nil, err
	}
	return j, jw, nil
}

// changeSet reads a finished job's changes whole.
func (rd *Reader) changeSet(ctx context.Context, id string) (*workspace.Changes, []byte, error) {
	j, jw, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	sum, err := changesSummary(j, jw)
	if err != nil {
		return nil, nil, err
	}
	if jw.Changes == nil {
		return nil, nil, fmt.Errorf("job %s: no changes were kept: %s: %w", id, sum.Error, delegate.ErrNotFound)
	}
	raw, err := gunzipped(jw.Changes)
	if err != nil {
		return nil, nil, fmt.Errorf("job %s: the stored changes: %w", id, err)
	}
	var cs workspace.Changes
	if err := json.Unmarshal(raw, &cs); err != nil {
		return nil, nil, fmt.Errorf("job %s: the stored changes: %w", id, err)
	}
	return &cs, raw, nil
}

// Diff implements delegate.WorkspaceService.
func (rd *Reader) Diff(ctx context.Context, id string, opts delegate.DiffOptions) (*delegate.DiffPage, error) {
	if opts.Offset < 0 {
		return nil, &delegate.FieldError{Field: "offset", Rule: fmt.Sprintf("must be 0 or the next of the page before (got %d)", opts.Offset)}
	}
	if opts.Limit < 0 || opts.Limit > delegate.MaxDiffPage {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d bytes (got %d)", delegate.MaxDiffPage, opts.Limit)}
	}
	cs, _, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	p := cs.Diff(workspace.DiffOptions{Offset: opts.Offset, Limit: opts.Limit})
	return &delegate.DiffPage{Text: p.Text, Offset: p.Offset, Next: p.Next, Total: p.Total, Omitted: p.Omitted}, nil
}

// Patch implements delegate.WorkspaceService.
func (rd *Reader) Patch(ctx context.Context, id string) ([]byte, error) {
	cs, _, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	return cs.Patch(0)
}

// ChangeSet implements delegate.WorkspaceService.
func (rd *Reader) ChangeSet(ctx context.Context, id string) (*delegate.ChangeSet, error) {
	_, raw, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	jw, src, err := baselineOf(ctx, rd.store, j)
	if err != nil {
		return nil, err
	}
	out := &delegate.ChangeSet{JobID: id, Baseline: jw.Baseline, Changes: raw}
	if src != nil {
		out.Source = *src
	}
	return out, nil
}

// resultChanges is the changes a result shows: nil for a job without a
// workspace.
func (rd *Reader) resultChanges(ctx context.Context, j *delegate.Job) (*delegate.WorkspaceChanges, error) {
	if j.Manifest.Workspace == nil && j.Manifest.Sandbox == "" {
		return nil, nil
	}
	jw, err := rd.store.JobWorkspace(ctx, j.ID)
	if errors.Is(err, delegate.ErrNotFound) {
		if j.Manifest.Workspace == nil {
			return nil, nil // a command in a sandbox without a workspace
		}
		jw = &delegate.JobWorkspace{}
	} else if err != nil {
		return nil, err
	}
	return changesSummary(j, jw)
}
