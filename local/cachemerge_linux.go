//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// mergeLayer writes what a job changed in its cache, the upper layer of
// its overlay (upper, whose overlay is unmounted), into the cache, the
// lower layer (the directory open at lower): new and changed files,
// links and directories, and what it removed (a whiteout, a character
// device 0/0, removes; an opaque directory replaces the one below). The
// last writer wins, per file. The job chose every name: each step in the
// cache is taken through a directory's descriptor, following no link, so
// that a link the cache holds never leads the server (root) out of it.
func mergeLayer(upper string, lower int) error {
	ents, err := os.ReadDir(upper)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		p := filepath.Join(upper, name)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				if err := removeAt(lower, name); err != nil {
					return err
				}
			}
		case unix.S_IFDIR:
			if err := mergeDir(p, lower, name, st.Mode&0o7777); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := copyAt(p, lower, name, st.Mode&0o7777); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := removeAt(lower, name); err != nil {
				return err
			}
			if err := unix.Symlinkat(target, lower, name); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		// Anything else (a FIFO, a socket, a device) stays out of the cache.
	}
	return nil
}

// mergeDir merges the upper directory p into name in lower, which it
// makes (mode) where there is none or something else; an opaque one
// replaces what was there.
func mergeDir(p string, lower int, name string, mode uint32) error {
	var st unix.Stat_t
	err := unix.Fstatat(lower, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && (st.Mode&unix.S_IFMT != unix.S_IFDIR || opaque(p)) {
		if err := removeAt(lower, name); err != nil {
			return err
		}
		err = unix.ENOENT
	}
	if errors.Is(err, unix.ENOENT) {
		err = unix.Mkdirat(lower, name, mode)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	fd, err := unix.Openat(lower, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer unix.Close(fd)
	return mergeLayer(p, fd)
}

// opaque says whether the upper directory p hides what is below it (the
// job removed the directory, then made one again).
func opaque(p string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// copyAt copies the file p into name in dir (mode), whatever was there,
// through a new file renamed over it.
func copyAt(p string, dir int, name string, mode uint32) error {
	src, err := os.Open(p)
	if err != nil {
		return err
	}
	defer src.Close()
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := removeAt(dir, name); err != nil {
			return err
		}
	}
	// A name of its own (the job may have made any other), made anew.
	var tmp string
	var fd int
	for i := 0; ; i++ {
		tmp = fmt.Sprintf(".delegate-merge-%d-%d", os.Getpid(), mergeSeq.Add(1))
		fd, err = unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if !errors.Is(err, unix.EEXIST) || i == 100 {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	dst := os.NewFile(uintptr(fd), tmp)
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Fchmodat(dir, tmp, mode, 0) // whatever the umask took
	}
	if err == nil {
		err = unix.Renameat(dir, tmp, dir, name)
	}
	if err != nil {
		unix.Unlinkat(dir, tmp, 0)
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// mergeSeq numbers copyAt's new files.
var mergeSeq atomic.Int64

// removeAt removes name in dir, a directory with all it holds, following
// no link; none is no error.
func removeAt(dir int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dir, name, 0)
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}
