//go:build linux

package workspace

import (
	"bytes"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// processUmask is this process's umask as /proc/self/status shows it
// (Linux 4.7 and later), read without changing it (umask(2) can only be
// read by setting it, which would race with other threads creating
// files); ok false when it could not be read.
func processUmask() (uint32, bool) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(line, []byte("Umask:")); ok {
			m, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 32)
			return uint32(m), err == nil
		}
	}
	return 0, false
}

// setFileTimes sets an open file's access and modification times
// (utimensat on the descriptor itself, as futimens does: no lookup of its
// name again).
func setFileTimes(fd int, pfd int, name string, mtime int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// emptyWithoutACL says whether the directory fd is empty and has no
// default ACL, so that nothing made beneath it gets one (ACLs are
// inherited from the parent directory only): the modes of what is created
// there are what they were created with, less the umask.
func emptyWithoutACL(fd int) bool {
	var one [1]byte
	if _, err := unix.Fgetxattr(fd, "system.posix_acl_default", one[:]); err != unix.ENODATA && err != unix.EOPNOTSUPP {
		return false // one there (ERANGE: longer than a byte), or unknown
	}
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dup)
	var buf [4096]byte
	for {
		n, err := unix.Getdents(dup, buf[:])
		if err != nil {
			return false
		}
		if n == 0 {
			return true
		}
		if _, _, names := unix.ParseDirent(buf[:n], 1, nil); len(names) > 0 {
			return false // ParseDirent leaves out "." and ".."
		}
	}
}
