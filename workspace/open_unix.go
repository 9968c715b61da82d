//go:build unix

package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// openWalk opens rel beneath dirfd one component at a time, each with
// O_NOFOLLOW and checked to be on dirfd's device: what openat2's
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV give in one call
// (except for a bind mount of the same device, which it cannot see).
func openWalk(dirfd int, rel string, flags int, mode uint32, crossMounts bool) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil {
		return -1, err
	}
	dev := st.Dev
	parts := strings.Split(rel, "/")
	cur := dirfd
	closeCur := func() {
		if cur != dirfd {
			unix.Close(cur)
		}
	}
	defer closeCur()
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			return -1, unix.EXDEV
		}
		fl, m := unix.O_RDONLY|unix.O_DIRECTORY, uint32(0)
		if i == len(parts)-1 {
			fl, m = flags, mode
		}
		fd, err := unix.Openat(cur, p, fl|unix.O_NOFOLLOW|unix.O_CLOEXEC, m)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) && (i < len(parts)-1 || flags&unix.O_DIRECTORY != 0) {
				// A link where a directory was: what openat2 calls ELOOP.
				if e := unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW); e == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
					err = unix.ELOOP
				}
			}
			return -1, err
		}
		if err := unix.Fstat(fd, &st); err != nil || !crossMounts && uint64(st.Dev) != uint64(dev) {
			unix.Close(fd)
			if err == nil {
				err = unix.EXDEV
			}
			return -1, err
		}
		closeCur()
		cur = fd
	}
	fd := cur
	cur = dirfd // keep it open for the caller
	return fd, nil
}

// beneath opens paths beneath a tree's root. It keeps one directory open
// between calls, since a tree's entries come directory by directory.
type beneath struct {
	root int
	dir  string
	dfd  int
	// buf is createFile's copy buffer, made once (a tree of small files
	// spent a third of its extraction allocating and clearing one per
	// file).
	buf []byte
	// plainModes: a new file's mode is what it was created with less
	// umask (no default ACL above it: an empty tree without one, made
	// here), so createFile sets it only when umask took bits away.
	plainModes bool
	umask      uint32
}

func newBeneath(root int) *beneath { return &beneath{root: root, dfd: -1} }

func (b *beneath) close() {
	if b.dfd >= 0 {
		unix.Close(b.dfd)
		b.dfd = -1
	}
}

// parent returns an open descriptor of directory rel ("" or "." is the
// root); b keeps it.
func (b *beneath) parent(rel string) (int, error) {
	if rel == "" || rel == "." {
		return b.root, nil
	}
	if b.dfd >= 0 && b.dir == rel {
		return b.dfd, nil
	}
	fd, err := openBeneath(b.root, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, pathErr("open", rel, err)
	}
	b.close()
	b.dir, b.dfd = rel, fd
	return fd, nil
}

// open opens rel beneath the root (its last component too without
// following a link) and returns it with its fstat.
func (b *beneath) open(rel string, flags int, mode uint32) (int, *unix.Stat_t, error) {
	dir, base := path.Split(rel)
	pfd, err := b.parent(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return -1, nil, err
	}
	fd, err := openBeneath(pfd, base, flags, mode)
	if err != nil {
		return -1, nil, pathErr("open", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, pathErr("stat", rel, err)
	}
	return fd, &st, nil
}

// lstat returns rel's own status (a link's, not its target's).
func (b *beneath) lstat(rel string) (*unix.Stat_t, error) {
	dir, base := path.Split(rel)
	pfd, err := b.parent(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, pathErr("stat", rel, err)
	}
	return &st, nil
}

// readlink reads link rel.
func (b *beneath) readlink(rel string) (string, error) {
	dir, base := path.Split(rel)
	pfd, err := b.parent(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return "", err
	}
	return readlinkAt(pfd, base, rel)
}

func readlinkAt(dirfd int, name, rel string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", pathErr("readlink", rel, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > 1<<16 {
			return "", pathErr("readlink", rel, unix.ENAMETOOLONG)
		}
	}
}

var (
	errNotRegular = errors.New("not a regular file")
	errTooBig     = errors.New("too big")
)

// readFile reads a small file beneath the root (an index, an ignore
// file), at most max bytes; fs.ErrNotExist when it is absent.
func (b *beneath) readFile(rel string, max int64) ([]byte, error) {
	data, _, err := b.readFileStat(rel, max)
	return data, err
}

// readFileStat is readFile that gives the file's status as it was opened
// (before its data was read) too.
func (b *beneath) readFileStat(rel string, max int64) ([]byte, *unix.Stat_t, error) {
	fd, st, err := b.open(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("%s: %w", rel, errNotRegular)
	}
	if st.Size > max {
		return nil, nil, fmt.Errorf("%s: %d bytes, more than the %d this reads: %w", rel, st.Size, max, errTooBig)
	}
	buf := make([]byte, st.Size)
	if _, err := readFull(f, buf); err != nil {
		return nil, nil, pathErr("read", rel, err)
	}
	return buf, st, nil
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// pathErr names the path (relative to the tree) and says in words what an
// errno means here.
func pathErr(op, rel string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	switch {
	case errors.Is(err, unix.ELOOP):
		err = fmt.Errorf("%w: %w", ErrSymlink, err)
	case errors.Is(err, unix.EXDEV):
		err = fmt.Errorf("%w: %w", ErrOtherFilesystem, err)
	}
	return &fs.PathError{Op: op, Path: rel, Err: err}
}

// readDirNames lists a directory's names (without . and ..).
func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	if _, err := unix.Seek(dup, 0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

func isErrno(err error, e unix.Errno) bool { return errors.Is(err, e) }
