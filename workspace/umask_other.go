//go:build unix && !linux

package workspace

import "golang.org/x/sys/unix"

// processUmask: not known here, so a new file's mode is always set.
func processUmask() (uint32, bool) { return 0, false }

// setFileTimes sets a file's access and modification times by its name in
// its directory pfd.
func setFileTimes(fd int, pfd int, name string, mtime int64) error {
	ts := []unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	return unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// emptyWithoutACL: not checked here (createFile always sets the mode).
func emptyWithoutACL(fd int) bool { return false }
