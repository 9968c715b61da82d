//go:build unix

package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// The writing side of beneath: every path is created relative to a
// directory opened beneath the root without following links, and the last
// component is never followed either (O_NOFOLLOW, renameat and unlinkat
// act on the name itself).

func splitParent(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	return strings.TrimSuffix(dir, "/"), base
}

// mkdirAll makes directory rel and its missing parents (perm for the ones
// it makes); a link or a file in the way is an error.
func (b *beneath) mkdirAll(rel string, perm uint32) error {
	if rel == "" || rel == "." {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		dir, base := splitParent(p)
		pfd, err := b.parent(dir)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, base, perm)
		if err == nil {
			// Mkdirat honours the umask; the mode asked for is meant.
			if e := fchmodat(pfd, base, perm); e != nil {
				return pathErr("chmod", p, e)
			}
			continue
		}
		if !errors.Is(err, unix.EEXIST) {
			return pathErr("mkdir", p, err)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathErr("stat", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return pathErr("mkdir", p, unix.ELOOP)
		default:
			return pathErr("mkdir", p, unix.ENOTDIR)
		}
	}
	return nil
}

func fchmodat(dirfd int, name string, perm uint32) error {
	fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, perm)
}

// createFile writes a new file rel (its parent must exist) from r: in a
// temporary name beside it, renamed over rel once complete when replace
// is set, else created in place (failing if rel exists). perm is set
// exactly (no umask); mtime (Unix ns) when not 0.
func (b *beneath) createFile(rel string, r io.Reader, perm uint32, mtime int64, replace bool) error {
	dir, base := splitParent(rel)
	pfd, err := b.parent(dir)
	if err != nil {
		return err
	}
	name := base
	if replace {
		var rnd [8]byte
		rand.Read(rnd[:])
		name = ".delegate-" + hex.EncodeToString(rnd[:]) + ".tmp"
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm&0o777)
	if err != nil {
		return pathErr("create", rel, err)
	}
	ok := false
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
		if !ok {
			unix.Unlinkat(pfd, name, 0)
		}
	}()
	if b.buf == nil {
		b.buf = make([]byte, 128<<10)
	}
	if err := copyToFd(fd, r, b.buf); err != nil {
		return pathErr("write", rel, err)
	}
	// The file is new (O_EXCL): in a tree without default ACLs its mode
	// is perm less the umask's bits, so it needs setting only when the
	// umask took some away (a system call per file less on an import of
	// thousands).
	if !b.plainModes || perm&0o777&b.umask != 0 {
		if err := unix.Fchmod(fd, perm&0o777); err != nil {
			return pathErr("chmod", rel, err)
		}
	}
	if mtime != 0 {
		if err := setFileTimes(fd, pfd, name, mtime); err != nil {
			return pathErr("utimes", rel, err)
		}
	}
	err = unix.Close(fd)
	fd = -1
	if err != nil {
		return pathErr("close", rel, err)
	}
	if replace {
		if err := unix.Renameat(pfd, name, pfd, base); err != nil {
			return pathErr("rename", rel, err)
		}
	}
	ok = true
	return nil
}

func copyToFd(fd int, r io.Reader, buf []byte) error {
	for {
		n, err := r.Read(buf)
		for w := 0; w < n; {
			m, werr := unix.Write(fd, buf[w:n])
			if werr == unix.EINTR {
				continue
			}
			if werr != nil {
				return werr
			}
			w += m
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// symlink makes link rel pointing to target (never followed here).
func (b *beneath) symlink(rel, target string, mtime int64) error {
	dir, base := splitParent(rel)
	pfd, err := b.parent(dir)
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(target, pfd, base); err != nil {
		return pathErr("symlink", rel, err)
	}
	if mtime != 0 {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
		unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// remove unlinks rel (a file or a link, never what a link points to).
func (b *beneath) remove(rel string) error {
	dir, base := splitParent(rel)
	pfd, err := b.parent(dir)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return pathErr("remove", rel, err)
	}
	return nil
}

// removeEmptyParents removes rel's parent directories that are empty, up
// to (not including) the root, as git does when a file is deleted.
func (b *beneath) removeEmptyParents(rel string) {
	for dir, _ := splitParent(rel); dir != ""; dir, _ = splitParent(dir) {
		parent, base := splitParent(dir)
		if b.dfd >= 0 && b.dir == dir {
			b.close()
		}
		pfd, err := b.parent(parent)
		if err != nil || unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR) != nil {
			return
		}
	}
}

// setTimes sets rel's modification time (Unix ns), a link's own.
func (b *beneath) setTimes(rel string, mtime int64) error {
	dir, base := splitParent(rel)
	pfd, err := b.parent(dir)
	if err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr("utimes", rel, err)
	}
	return nil
}

// chmod sets directory rel's permission bits.
func (b *beneath) chmod(rel string, perm uint32) error {
	dir, base := splitParent(rel)
	pfd, err := b.parent(dir)
	if err != nil {
		return err
	}
	if err := fchmodat(pfd, base, perm); err != nil {
		return pathErr("chmod", rel, err)
	}
	return nil
}
