//go:build unix

package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"path"
	"sort"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"golang.org/x/sys/unix"
)

// ChangeKind says what happened to a path.
type ChangeKind string

const (
	Added    ChangeKind = "added"
	Modified ChangeKind = "modified"
	Deleted  ChangeKind = "deleted"
)

// State is a file or link on one side of a change.
type State struct {
	Type   Type   `json:"type"`
	Mode   Mode   `json:"mode"`
	Size   int64  `json:"size"`
	Target string `json:"target,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Data is a file's content: always on the new side; on the old side
	// once ReadOld has found it unchanged in the source.
	Data []byte `json:"data,omitempty"`
}

// Change is one path added, modified or deleted since the import.
type Change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
	Old  *State     `json:"old,omitempty"` // nil when added
	New  *State     `json:"new,omitempty"` // nil when deleted
	// Binary: either side holds a NUL byte in its first 8000 bytes
	// (git's test); it is named in a diff, not shown.
	Binary bool `json:"binary,omitempty"`
	// OldMissing says why ReadOld could not find the old content (the
	// source changed since the import); "" when found or not needed.
	OldMissing string `json:"oldMissing,omitempty"`
}

// Changes are what a job changed in its workspace, path by path, sorted
// by path. It is plain JSON (contents in base64) for the engine to keep.
type Changes struct {
	Changes  []Change  `json:"changes"`
	Added    int       `json:"added"`
	Modified int       `json:"modified"`
	Deleted  int       `json:"deleted"`
	Bytes    int64     `json:"bytes"` // new content held
	Skipped  []Skipped `json:"skipped,omitempty"`
	// IgnoredAdded counts new files left out because git ignores them
	// (build outputs, node_modules): a git source without ignored files.
	IgnoredAdded int `json:"ignoredAdded,omitempty"`
}

// ChangesOptions are ReadChanges' options; the zero value takes the
// defaults.
type ChangesOptions struct {
	// Verify reads and hashes every file. Without it, a file whose size,
	// modification time and mode are those of its baseline is taken as
	// unchanged, as git takes its index's (the stream must then keep
	// modification times, as Archive and Extract do).
	Verify bool
	// MaxBytes caps the new content held (DefaultMaxBytes when 0);
	// MaxEntries caps the entries read (4 × DefaultMaxFiles when 0).
	MaxBytes   int64
	MaxEntries int
}

// ReadChanges compares the tree in a tar stream (gzip or not: the first
// bytes tell), the workspace read back from the sandbox after the job,
// with the baseline of its import. Nothing under a .git directory is ever
// a change. For a git source imported without ignored files, new files
// that git would ignore (by the .gitignore files of the tree after the
// job and .git/info/exclude) are left out and counted. Special files
// are skipped and listed; a hard link is read as the file it links to.
func ReadChanges(ctx context.Context, base *Baseline, r io.Reader, opts ChangesOptions) (*Changes, error) {
	c, err := newCollector(base, opts)
	if err != nil {
		return nil, err
	}
	tr, err := tarReader(r)
	if err != nil {
		return nil, err
	}
	for {
		if err := c.tick(ctx); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		name, err := archiveName(hdr)
		if err != nil {
			return nil, err
		}
		if name == "" {
			continue
		}
		mode := Mode(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = c.entry(name, TypeDir, mode, 0, 0, "", nil)
		case tar.TypeSymlink:
			err = c.entry(name, TypeSymlink, mode, 0, 0, hdr.Linkname, nil)
		case tar.TypeReg, tar.TypeRegA:
			err = c.entry(name, TypeFile, mode, hdr.Size, hdr.ModTime.UnixNano(), "", func() (io.Reader, error) { return tr, nil })
		case tar.TypeLink:
			err = c.hardLink(name, hdr.Linkname)
		default:
			c.skip(name, fmt.Sprintf("a special file (tar type %q)", hdr.Typeflag))
		}
		if err != nil {
			return nil, err
		}
	}
	return c.finish()
}

// DirChanges is ReadChanges on a directory rather than a stream: for a
// backend that reaches the sandbox's workspace from the host. It reads it
// as its owner, beneath it, without following links, and reads only the
// files whose status differs from the baseline (all of them with Verify).
func DirChanges(ctx context.Context, base *Baseline, dir string, opts ChangesOptions) (*Changes, error) {
	c, err := newCollector(base, opts)
	if err != nil {
		return nil, err
	}
	rootfd, st, err := openRoot(dir, "")
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return nil, err
	}
	var cs *Changes
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		t := &Tree{Root: dir, IncludeIgnored: true, dev: int64(st.Dev)}
		s := &scanner{ctx: ctx, t: t, b: newBeneath(fd), skipGit: true,
			opts: ScanOptions{IncludeIgnored: true, MaxFiles: c.opts.MaxEntries, MaxBytes: math.MaxInt64}}
		defer s.b.close()
		if err := s.scan(fd); err != nil {
			return err
		}
		if c.useIgnore {
			if data, err := s.b.readFile(".git/info/exclude", 1<<20); err == nil {
				c.ignoreFiles["\x00"] = data
			}
		}
		for _, sk := range t.Skipped {
			c.skip(sk.Path, sk.Reason)
		}
		for i := range t.Entries {
			if err := c.tick(ctx); err != nil {
				return err
			}
			e := &t.Entries[i]
			ffd := -1
			open := func() (io.Reader, error) {
				f, st, err := s.b.open(e.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
				if err != nil {
					return nil, changedOr(e.Path, err)
				}
				ffd = f
				if what := differs(e, st); what != "" {
					return nil, &ChangedError{Path: e.Path, What: what}
				}
				return &fdReader{fd: f}, nil
			}
			err := c.entry(e.Path, e.Type, Mode(e.Perm), e.Size, e.MTime, e.Target, open)
			if ffd >= 0 {
				unix.Close(ffd)
			}
			if err != nil {
				return err
			}
		}
		cs, err = c.finish()
		return err
	})
	if err != nil {
		return nil, err
	}
	return cs, nil
}

type fdReader struct{ fd int }

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// collector compares a tree's entries, as they come, with the baseline.
type collector struct {
	opts        ChangesOptions
	old         map[string]*FileState
	seen        map[string]*seenFile
	ignoreFiles map[string][]byte // dir -> .gitignore; "\x00" for info/exclude
	useIgnore   bool
	cs          *Changes
	h           hash.Hash
	n           int
}

type seenFile struct {
	st        *State
	unchanged bool
}

func newCollector(base *Baseline, opts ChangesOptions) (*collector, error) {
	if err := base.Check(); err != nil {
		return nil, err
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxEntries == 0 {
		opts.MaxEntries = 4 * DefaultMaxFiles
	}
	return &collector{opts: opts, old: base.byPath(), seen: map[string]*seenFile{}, ignoreFiles: map[string][]byte{},
		useIgnore: base.Kind == KindGit && !base.IncludeIgnored, cs: &Changes{}, h: sha256.New()}, nil
}

func (c *collector) tick(ctx context.Context) error {
	if c.n&255 == 0 {
		return ctx.Err()
	}
	return nil
}

// entry takes one entry; content gives a regular file's data (size
// bytes), asked for only when the file must be read.
func (c *collector) entry(name string, typ Type, mode Mode, size, mtime int64, target string, content func() (io.Reader, error)) error {
	if c.n++; c.n > c.opts.MaxEntries {
		return &CapError{What: "entries in the workspace", Found: int64(c.n), Cap: int64(c.opts.MaxEntries), More: true}
	}
	if inGit(name) {
		if c.useIgnore && name == ".git/info/exclude" && typ == TypeFile && size < 1<<20 {
			r, err := content()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(io.LimitReader(r, size))
			if err != nil {
				return fmt.Errorf("%w: %w", ErrBadArchive, err)
			}
			c.ignoreFiles["\x00"] = data
		}
		return nil
	}
	if unrecorded(name) {
		return nil
	}
	if typ == TypeDir {
		return nil
	}
	if _, dup := c.seen[name]; dup {
		return fmt.Errorf("%w: %s appears twice", ErrBadArchive, name)
	}
	o := c.old[name]
	if typ == TypeSymlink {
		st := &State{Type: TypeSymlink, Mode: 0o777, Target: target, Size: int64(len(target))}
		c.seen[name] = &seenFile{st: st, unchanged: o != nil && o.Type == TypeSymlink && o.Target == target}
		return nil
	}
	isIgnoreFile := c.useIgnore && path.Base(name) == ".gitignore"
	if o != nil && o.Type == TypeFile && !c.opts.Verify && size == o.Size && mtime == o.MTime && mode.Exec() == o.Mode.Exec() {
		c.seen[name] = &seenFile{st: &State{Type: TypeFile, Mode: mode, Size: o.Size, SHA256: o.SHA256}, unchanged: true}
		if isIgnoreFile && size < 1<<20 {
			// Its content is needed, but not hashed.
			r, err := content()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(io.LimitReader(r, size))
			if err != nil {
				return fmt.Errorf("%w: %w", ErrBadArchive, err)
			}
			c.ignoreFiles[path.Dir(name)] = data
		}
		return nil
	}
	if c.cs.Bytes+size > c.opts.MaxBytes {
		return &CapError{What: "bytes", Found: c.cs.Bytes + size, Cap: c.opts.MaxBytes, More: true}
	}
	r, err := content()
	if err != nil {
		return err
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadArchive, name, err)
	}
	c.h.Reset()
	c.h.Write(data)
	sum := hex.EncodeToString(c.h.Sum(nil))
	st := &State{Type: TypeFile, Mode: mode, Size: size, SHA256: sum}
	same := o != nil && o.Type == TypeFile && o.SHA256 == sum && o.Mode.Exec() == mode.Exec()
	if !same {
		st.Data = data
		c.cs.Bytes += size
	}
	if isIgnoreFile {
		c.ignoreFiles[path.Dir(name)] = data
	}
	c.seen[name] = &seenFile{st: st, unchanged: same}
	return nil
}

// hardLink takes a hard link as the file it links to, which must have
// come before it.
func (c *collector) hardLink(name, linkname string) error {
	target, err := archiveName(&tar.Header{Name: linkname})
	if err != nil {
		return err
	}
	if c.n++; c.n > c.opts.MaxEntries {
		return &CapError{What: "entries in the workspace", Found: int64(c.n), Cap: int64(c.opts.MaxEntries), More: true}
	}
	if unrecorded(name) {
		return nil
	}
	if _, dup := c.seen[name]; dup {
		return fmt.Errorf("%w: %s appears twice", ErrBadArchive, name)
	}
	t := c.seen[target]
	if t == nil || t.st.Type != TypeFile {
		return fmt.Errorf("%w: hard link %s to %s, not a file before it", ErrBadArchive, name, linkname)
	}
	o := c.old[name]
	st := *t.st
	same := o != nil && o.Type == TypeFile && o.SHA256 == st.SHA256 && o.Mode.Exec() == st.Mode.Exec()
	if !same && st.Data == nil {
		return fmt.Errorf("%w: hard link %s to the unchanged %s: its content is not in the stream (write it with tar --hard-dereference)", ErrBadArchive, name, target)
	}
	if same {
		st.Data = nil
	} else {
		c.cs.Bytes += st.Size
	}
	c.seen[name] = &seenFile{st: &st, unchanged: same}
	return nil
}

func (c *collector) skip(name, reason string) {
	if !unrecorded(name) {
		c.cs.Skipped = append(c.cs.Skipped, Skipped{Path: name, Reason: reason})
	}
}

func (c *collector) finish() (*Changes, error) {
	cs, old := c.cs, c.old
	var ignore func(p string) bool
	if c.useIgnore {
		ignore = ignoreMatcher(c.ignoreFiles)
	}
	for p, s := range c.seen {
		o := old[p]
		switch {
		case o == nil:
			if ignore != nil && ignore(p) {
				cs.IgnoredAdded++
				if s.st.Data != nil {
					cs.Bytes -= s.st.Size
				}
				continue
			}
			cs.Changes = append(cs.Changes, Change{Path: p, Kind: Added, New: s.st})
		case !s.unchanged:
			cs.Changes = append(cs.Changes, Change{Path: p, Kind: Modified, Old: stateOf(o), New: s.st})
		}
	}
	for p, o := range old {
		if c.seen[p] == nil {
			cs.Changes = append(cs.Changes, Change{Path: p, Kind: Deleted, Old: stateOf(o)})
		}
	}
	sort.Slice(cs.Changes, func(i, j int) bool { return cs.Changes[i].Path < cs.Changes[j].Path })
	for i := range cs.Changes {
		ch := &cs.Changes[i]
		switch ch.Kind {
		case Added:
			cs.Added++
		case Modified:
			cs.Modified++
		case Deleted:
			cs.Deleted++
		}
		if ch.New != nil && ch.New.Type == TypeFile && isBinary(ch.New.Data) {
			ch.Binary = true
		}
	}
	return cs, nil
}

func stateOf(f *FileState) *State {
	return &State{Type: f.Type, Mode: f.Mode, Size: f.Size, Target: f.Target, SHA256: f.SHA256}
}

// isBinary is git's test: a NUL byte in the first 8000 bytes.
func isBinary(data []byte) bool {
	if len(data) > 8000 {
		data = data[:8000]
	}
	return bytes.IndexByte(data, 0) >= 0
}

// ignoreMatcher builds git's ignore test from the tree's .gitignore files
// (by directory; "\x00" holds .git/info/exclude): a path is ignored when
// it or any of its parent directories is.
func ignoreMatcher(files map[string][]byte) func(string) bool {
	dirs := make([]string, 0, len(files))
	for d := range files {
		if d != "\x00" {
			dirs = append(dirs, d)
		}
	}
	// Lower priority first: the exclude file, then the top, then deeper.
	depth := func(d string) int {
		if d == "." {
			return -1
		}
		return strings.Count(d, "/")
	}
	sort.Slice(dirs, func(i, j int) bool {
		if di, dj := depth(dirs[i]), depth(dirs[j]); di != dj {
			return di < dj
		}
		return dirs[i] < dirs[j]
	})
	pats := parseIgnore(files["\x00"], nil)
	for _, d := range dirs {
		var domain []string
		if d != "." {
			domain = splitPath(d)
		}
		pats = append(pats, parseIgnore(files[d], domain)...)
	}
	if len(pats) == 0 {
		return func(string) bool { return false }
	}
	m := gitignore.NewMatcher(pats)
	return func(p string) bool {
		parts := splitPath(p)
		for i := 1; i <= len(parts); i++ {
			if m.Match(parts[:i], i < len(parts)) {
				return true
			}
		}
		return false
	}
}

// ReadOld fills in the old content of the modified and deleted files
// from the source directory they were imported from, read as its owner
// beneath it like Archive's reads. A file whose content there is no longer
// the baseline's gets OldMissing instead: its diff cannot be shown and
// Patch refuses it. dir is the source's directory (and within its allowed
// root, as for Scan).
func (cs *Changes) ReadOld(ctx context.Context, dir, within string) error {
	rootfd, st, err := openRoot(dir, within)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return err
	}
	return runAs(id, func() error {
		fd, err := reopenAs(rootfd, dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		b := newBeneath(fd)
		defer b.close()
		for i := range cs.Changes {
			if err := ctx.Err(); err != nil {
				return err
			}
			c := &cs.Changes[i]
			if c.Old == nil || c.Old.Type != TypeFile || c.Old.Data != nil {
				continue
			}
			data, err := b.readFile(c.Path, c.Old.Size)
			switch {
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, errNotRegular):
				c.OldMissing = "the source no longer has it as imported"
				continue
			case errors.Is(err, errTooBig):
				c.OldMissing = "the source's copy changed since the import"
				continue
			case err != nil:
				return err
			}
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != c.Old.SHA256 {
				c.OldMissing = "the source's copy changed since the import"
				continue
			}
			c.Old.Data = data
			c.OldMissing = ""
			if isBinary(data) {
				c.Binary = true
			}
		}
		return nil
	})
}
