//go:build unix

package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"golang.org/x/sys/unix"
)

// Default caps of a tree (the figures).
const (
	DefaultMaxBytes = 256 << 20
	DefaultMaxFiles = 50_000
)

// maxSkipped bounds the special files a Tree lists by name.
const maxSkipped = 1000

// Kind is what a source tree is.
type Kind string

const (
	// KindDir: a plain directory, taken whole.
	KindDir Kind = "dir"
	// KindGit: a git work tree (a .git directory at its top), taken as
	// git sees it.
	KindGit Kind = "git"
)

// Type is the type of an entry.
type Type uint8

const (
	TypeFile Type = iota
	TypeDir
	TypeSymlink
)

func (t Type) String() string {
	switch t {
	case TypeDir:
		return "dir"
	case TypeSymlink:
		return "symlink"
	}
	return "file"
}

// Entry is one file, directory or symbolic link of a tree.
type Entry struct {
	Path   string      // slash-separated, relative to the tree's root
	Type   Type        // file, directory or symbolic link
	Perm   fs.FileMode // permission bits (setuid, setgid, sticky dropped)
	Size   int64       // of a file
	MTime  int64       // modification time, Unix nanoseconds
	Target string      // of a symbolic link, as written (never followed)

	ino, ctime int64
}

// Skipped is an entry left out of a tree and why: a socket, a fifo, a
// device, a mount point.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Tree is a source directory as Scan found it: what Archive will copy.
type Tree struct {
	Root string // the directory, absolute
	Kind Kind
	// Head is the commit checked out (git), "" before the first commit
	// or for a plain directory; Branch its branch, "" when detached.
	Head, Branch string
	// IncludeIgnored: ignored files were asked for and are in Entries.
	IncludeIgnored bool
	Entries        []Entry
	Files          int   // regular files and symbolic links in Entries
	Dirs           int   // directories in Entries
	Bytes          int64 // the regular files' sizes
	// Skipped lists special files (the first 1000; SkippedCount counts
	// them all) that are not copied.
	Skipped      []Skipped
	SkippedCount int

	dev, ino int64
	owner    uint32
	ownerGid uint32
	within   string
	// What Rescan checks to tell that a scan now would find the same:
	// the options, when the scan began, the root's own status, the
	// files it read to decide what is in (ignore files, the index), and
	// the mount points it left out.
	opts    ScanOptions
	began   time.Time
	rootSt  fileStamp
	inputs  []stamped
	mounts  []stamped
	stamped bool // inputs and mounts are all there (none over maxStamped)
}

// ScanOptions are a scan's options; the zero value takes the defaults.
type ScanOptions struct {
	// IncludeIgnored takes a git work tree's ignored files too.
	IncludeIgnored bool
	// MaxBytes caps the regular files' total size (DefaultMaxBytes when
	// 0); MaxFiles caps the entries, directories and links included
	// (DefaultMaxFiles when 0).
	MaxBytes int64
	MaxFiles int
	// Within, if set, is a directory (an allowed root) that dir must lie
	// in; dir is then opened beneath it without following any link on
	// the way, so that a link swapped into the path cannot lead out. Such
	// a source (a person's directory) must not be a git directory nor lie
	// in one (ErrGitDir): its changes would be a repository's hooks and
	// configuration.
	Within string
}

func (o *ScanOptions) defaults() error {
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxFiles == 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.MaxBytes < 0 || o.MaxFiles < 0 {
		return fmt.Errorf("caps must not be negative (max bytes %d, max files %d)", o.MaxBytes, o.MaxFiles)
	}
	return nil
}

// Scan reads a source tree's list of entries as the tree's owner, without
// reading the files' contents: for a git work tree (a .git directory at
// its top), the tracked files, the untracked files that are not ignored
// (.gitignore files, .git/info/exclude; the owner's global excludes file
// is not read) and .git itself; for a plain directory, everything.
// Symbolic links are entries, never followed; sockets, fifos, devices and
// mount points are skipped and listed. The caps are checked as it goes: a
// *CapError has the figures. A .git that is a file (a linked work tree,
// a submodule) names a repository outside the tree: the tree is then taken
// as a plain directory with its ignore rules, without that file.
func Scan(ctx context.Context, dir string, opts ScanOptions) (*Tree, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	if opts.Within != "" {
		if err := refuseGitPath(dir); err != nil {
			return nil, err
		}
	}
	rootfd, st, err := openRoot(dir, opts.Within)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	if opts.Within != "" {
		if err := refuseGitDir(rootfd, dir); err != nil {
			return nil, err
		}
	}
	t := &Tree{Root: filepath.Clean(dir), Kind: KindDir, IncludeIgnored: opts.IncludeIgnored,
		dev: int64(st.Dev), ino: int64(st.Ino), owner: st.Uid, ownerGid: st.Gid, within: opts.Within,
		opts: opts, began: began, rootSt: stampOf(st), stamped: true}
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return nil, err
	}
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, t.Root)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		s := &scanner{ctx: ctx, t: t, opts: opts, b: newBeneath(fd), id: id}
		defer s.b.close()
		return s.scan(fd)
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// openRoot opens dir, a directory given as an absolute path, as the
// server; a link as its last component is refused (so is any link below
// within, when given).
func openRoot(dir, within string) (int, *unix.Stat_t, error) {
	if !filepath.IsAbs(dir) {
		return -1, nil, fmt.Errorf("%q: %w", dir, ErrNotAbsolute)
	}
	dir = filepath.Clean(dir)
	var fd int
	var err error
	if within != "" {
		if !filepath.IsAbs(within) {
			return -1, nil, fmt.Errorf("allowed root %q: %w", within, ErrNotAbsolute)
		}
		rel, rerr := filepath.Rel(filepath.Clean(within), dir)
		if rerr != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return -1, nil, fmt.Errorf("%s: %w %s", dir, ErrOutside, within)
		}
		wfd, werr := unix.Open(within, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if werr != nil {
			return -1, nil, rootErr(within, werr)
		}
		if rel == "." {
			fd = wfd
		} else {
			fd, err = openAcross(wfd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			unix.Close(wfd)
		}
	} else {
		fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, nil, rootErr(dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, rootErr(dir, err)
	}
	return fd, &st, nil
}

func rootErr(dir string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s: %w", dir, fs.ErrNotExist)
	case errors.Is(err, unix.ENOTDIR):
		// O_DIRECTORY|O_NOFOLLOW says ENOTDIR for a link too.
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s: %w", dir, ErrSymlink)
		}
		return fmt.Errorf("%s: %w", dir, ErrNotDirectory)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: %w", dir, ErrSymlink)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s: %w", dir, fs.ErrPermission)
	}
	return fmt.Errorf("%s: %w", dir, err)
}

// reopenAs opens the root again on the calling thread, so that the
// owner's own permission to read it is checked.
func reopenAs(rootfd int, root string) (int, error) {
	fd, err := unix.Openat(rootfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, rootErr(root, err)
	}
	return fd, nil
}

type scanner struct {
	ctx  context.Context
	t    *Tree
	opts ScanOptions
	b    *beneath
	id   *identity

	// tracked holds the git index's paths, trackedDirs every directory
	// above one.
	tracked, trackedDirs map[string]bool
	// skipGit leaves out every .git directory (reading changes back).
	skipGit bool
	entries int64
	bytes   int64
	over    bool
	stop    bool
}

func (s *scanner) scan(rootfd int) error {
	mode := walkPlain
	var pats []gitignore.Pattern
	st, err := s.b.lstat(".git")
	switch {
	case s.skipGit:
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		s.t.Kind = KindGit
		if err := s.readGit(); err != nil {
			return err
		}
		mode = walkGit
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		mode = walkGit
		s.tracked, s.trackedDirs = map[string]bool{}, map[string]bool{}
		s.skip(".git", "a .git file: its repository lies outside the directory")
	case err != nil && !errors.Is(err, unix.ENOENT):
		return err
	}
	if mode == walkGit && s.opts.IncludeIgnored {
		mode = walkPlain
	}
	if mode == walkGit {
		if data, err := s.readInput(".git/info/exclude", 1<<20); err == nil {
			pats = parseIgnore(data, nil)
		} else if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			return err
		}
	}
	if err := s.walk(rootfd, "", pats, mode); err != nil {
		return err
	}
	if s.over {
		if s.entries > int64(s.opts.MaxFiles) {
			return &CapError{What: "files", Found: s.entries, Cap: int64(s.opts.MaxFiles), More: s.stop}
		}
		return &CapError{What: "bytes", Found: s.bytes, Cap: s.opts.MaxBytes, More: s.stop}
	}
	return nil
}

// readGit reads the index (the tracked paths), unless ignored files
// are wanted anyway, and HEAD.
func (s *scanner) readGit() error {
	s.tracked, s.trackedDirs = map[string]bool{}, map[string]bool{}
	var data []byte
	var err error
	if !s.opts.IncludeIgnored {
		data, err = s.readInput(".git/index", 256<<20)
	}
	switch {
	case s.opts.IncludeIgnored:
		// Everything comes: which paths git tracks does not matter
		// (and a job's broken index must not stop its tree being read).
	case errors.Is(err, unix.ENOENT):
		// No index yet: nothing is tracked.
	case err != nil:
		return fmt.Errorf("read the git index: %w", err)
	default:
		var idx index.Index
		if err := index.NewDecoder(bytes.NewReader(data)).Decode(&idx); err != nil {
			return fmt.Errorf("read the git index (.git/index): %w", err)
		}
		for _, e := range idx.Entries {
			s.tracked[e.Name] = true
			for d := path.Dir(e.Name); d != "."; d = path.Dir(d) {
				if s.trackedDirs[d] {
					break
				}
				s.trackedDirs[d] = true
			}
		}
	}
	head, branch, err := readHead(s.b)
	if err != nil {
		if s.opts.IncludeIgnored {
			return nil
		}
		return err
	}
	s.t.Head, s.t.Branch = head, branch
	return nil
}

type walkMode int

const (
	walkPlain   walkMode = iota // everything
	walkGit                     // git's rules: tracked, or not ignored
	walkTracked                 // in an ignored directory: tracked paths only
)

func (s *scanner) walk(dirfd int, rel string, pats []gitignore.Pattern, mode walkMode) error {
	names, err := readDirNames(dirfd)
	if err != nil {
		return pathErr("read directory", orDot(rel), err)
	}
	sort.Strings(names)
	if mode == walkGit {
		for _, n := range names {
			if n == ".gitignore" {
				p := join(rel, n)
				if data, err := s.readInput(p, 1<<20); err == nil {
					pats = append(pats[:len(pats):len(pats)], parseIgnore(data, splitPath(rel))...)
				} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, errNotRegular) {
					// git does not follow a .gitignore that is a link
					// either; anything else is an error.
					return err
				}
				break
			}
		}
	}
	for _, name := range names {
		if s.stop {
			return nil
		}
		if s.entries&255 == 0 {
			if err := s.ctx.Err(); err != nil {
				return err
			}
		}
		p := join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return &ChangedError{Path: p, What: "removed while the directory was read"}
			}
			return pathErr("stat", p, err)
		}
		typ := st.Mode & unix.S_IFMT
		isDir := typ == unix.S_IFDIR
		if s.skipGit && isDir && strings.EqualFold(name, ".git") {
			continue
		}
		sub := mode
		if rel == "" && name == ".git" && isDir && s.t.Kind == KindGit {
			sub = walkPlain
		} else if mode == walkGit || mode == walkTracked {
			if !s.tracked[p] {
				if isDir && s.trackedDirs[p] {
					if mode == walkGit && s.ignored(pats, p, true) {
						sub = walkTracked
					}
				} else if mode == walkTracked || s.ignored(pats, p, isDir) {
					continue
				}
			}
		}
		switch typ {
		case unix.S_IFDIR:
			if int64(st.Dev) != s.t.dev {
				s.skip(p, "a mount point (another filesystem)")
				s.t.mounts = s.t.stamp(s.t.mounts, p, &st)
				continue
			}
			fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					return &ChangedError{Path: p, What: "replaced while the directory was read"}
				}
				return pathErr("open", p, err)
			}
			s.add(Entry{Path: p, Type: TypeDir, Perm: perm(&st), MTime: st.Mtim.Nano(), ino: int64(st.Ino), ctime: st.Ctim.Nano()})
			err = s.walk(fd, p, pats, sub)
			unix.Close(fd)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			s.add(Entry{Path: p, Type: TypeFile, Perm: perm(&st), Size: st.Size, MTime: st.Mtim.Nano(), ino: int64(st.Ino), ctime: st.Ctim.Nano()})
		case unix.S_IFLNK:
			target, err := readlinkAt(dirfd, name, p)
			if err != nil {
				return err
			}
			s.add(Entry{Path: p, Type: TypeSymlink, Perm: 0o777, Target: target, MTime: st.Mtim.Nano(), ino: int64(st.Ino), ctime: st.Ctim.Nano()})
		case unix.S_IFSOCK:
			s.skip(p, "a socket")
		case unix.S_IFIFO:
			s.skip(p, "a fifo")
		case unix.S_IFCHR, unix.S_IFBLK:
			s.skip(p, "a device")
		default:
			s.skip(p, "a special file")
		}
	}
	return nil
}

// add counts an entry against the caps and keeps it while under them.
// Over a cap, the scan goes on counting (so that the error can say how
// much was found) up to four times the file cap.
func (s *scanner) add(e Entry) {
	s.entries++
	s.bytes += e.Size
	if s.entries > int64(s.opts.MaxFiles) || s.bytes > s.opts.MaxBytes {
		if !s.over {
			s.over = true
			s.t.Entries = nil
		}
		if s.entries >= 4*int64(s.opts.MaxFiles)+1 {
			s.stop = true
		}
		return
	}
	s.t.Entries = append(s.t.Entries, e)
	switch e.Type {
	case TypeDir:
		s.t.Dirs++
	default:
		s.t.Files++
		s.t.Bytes += e.Size
	}
}

func (s *scanner) skip(p, reason string) {
	s.t.SkippedCount++
	if len(s.t.Skipped) < maxSkipped {
		s.t.Skipped = append(s.t.Skipped, Skipped{Path: p, Reason: reason})
	}
}

// ignored tells whether git ignores path p (not tracked) under pats.
// Directories that git ignores are never entered, so a path's parents
// need no check here.
func (s *scanner) ignored(pats []gitignore.Pattern, p string, isDir bool) bool {
	if len(pats) == 0 {
		return false
	}
	return gitignore.NewMatcher(pats).Match(splitPath(p), isDir)
}

// parseIgnore reads an ignore file's patterns for the directory domain.
func parseIgnore(data []byte, domain []string) []gitignore.Pattern {
	var ps []gitignore.Pattern
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	return ps
}

// perm is a stat's permission bits without setuid, setgid and sticky:
// none of them means anything for a copy in a sandbox.
func perm(st *unix.Stat_t) fs.FileMode { return fs.FileMode(st.Mode & 0o777) }

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func orDot(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

func splitPath(p string) []string {
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}
