package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// resolveBeneath: a path stays beneath the directory it is opened from,
// follows no symbolic link (nor /proc's magic links) and crosses no mount
// point. The kernel checks all three during the lookup itself, so nothing
// swapped in while a path is resolved can lead it elsewhere.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS |
	unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openBeneath opens rel (slash-separated, relative) beneath dirfd with
// openat2. Kernels before 5.6 (or a seccomp filter that refuses openat2)
// get the portable walk, one component at a time.
func openBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openat2(dirfd, rel, flags, mode, resolveBeneath)
}

// openAcross is openBeneath that may cross mount points: for the path
// from an allowed root down to a tree (a home directory may be a mount of
// its own); inside the tree, nothing crosses one.
func openAcross(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openat2(dirfd, rel, flags, mode, resolveBeneath&^unix.RESOLVE_NO_XDEV)
}

func openat2(dirfd int, rel string, flags int, mode uint32, resolve uint64) (int, error) {
	// No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a link as the last
	// component too, with ELOOP (O_NOFOLLOW|O_DIRECTORY would say ENOTDIR).
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EAGAIN) && try < 16:
			// A rename or mount raced the lookup: the kernel asks us
			// to try again rather than guess.
			continue
		case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) && try == 0 && !openat2Works():
			return openWalk(dirfd, rel, flags, mode, resolve&unix.RESOLVE_NO_XDEV == 0)
		}
		return -1, err
	}
}

// openat2Works tells an EPERM from openat2 itself (a seccomp filter) from
// an EPERM of the file.
func openat2Works() bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// fdPath is the path the kernel gives the directory open as fd (its links
// resolved), "" when it cannot say.
func fdPath(fd int, _ string) string {
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || !filepath.IsAbs(p) {
		return ""
	}
	return p
}
