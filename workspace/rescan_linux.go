package workspace

import "golang.org/x/sys/unix"

// stampsLocally tells whether the filesystem of the directory open as fd
// is one whose times this kernel sets from its own clock (Rescan's
// timestamps can then be compared with the scan's start): not a network
// filesystem, whose server sets them from its clock.
func stampsLocally(fd int) bool {
	var fs unix.Statfs_t
	if unix.Fstatfs(fd, &fs) != nil {
		return false
	}
	switch int64(fs.Type) {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC, unix.TMPFS_MAGIC,
		unix.OVERLAYFS_SUPER_MAGIC, unix.F2FS_SUPER_MAGIC:
		return true
	}
	return false
}
