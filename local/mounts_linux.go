//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// hostViewDirs are the host directories a job sees (read-only) when no
// template is given: enough to run the host's programs, nothing personal
// or stateful (/root, /home, /var, /opt, /srv, /run, /mnt, /media and the
// delegate data directory stay out).
var hostViewDirs = [...]string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"}

// templateSkip are top-level entries of a template rootfs the sandbox
// provides itself.
var templateSkip = [...]string{"proc", "sys", "dev", "tmp", "workspace", "run"}

// maxTmpBytes caps the private /tmp (and /dev/shm), which is memory.
const maxTmpBytes = 256 << 20

// readOnlyRecursive makes the mount at path, and every mount below it,
// read-only, nosuid and nodev. It prefers mount_setattr (one atomic call
// for the whole tree); older kernels get a remount of the top mount, with
// the flags the kernel locks in a user namespace kept as they were.
func readOnlyRecursive(path string) error {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	err := unix.MountSetattr(unix.AT_FDCWD, path, unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW, &attr)
	if !errors.Is(err, unix.ENOSYS) {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	for _, f := range []struct{ st, ms int64 }{
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st.Flags&f.st != 0 {
			flags |= uintptr(f.ms)
		}
	}
	return unix.Mount("", path, "", flags, "")
}

// pivot makes root the root directory and drops the old one entirely, so
// nothing of the host outside the binds stays reachable.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach below then removes it, without needing a directory for it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// unmountSandbox removes the mounts Create makes in the sandbox directory
// dir, in the server's mount namespace: the workspace tmpfs, the status
// channel's tmpfs and the template's bind (which may carry mounts of its
// own: a lazy detach takes them all). Mounts anyone else made there are left to removeSandboxDir,
// which finds them.
func unmountSandbox(dir string) error {
	for _, d := range []string{dirWorkspace, dirVar, dirChannel, dirTemplate, dirTmp, fileNetns} {
		if err := unmountAt(filepath.Join(dir, d)); err != nil {
			return err
		}
	}
	if err := unmountLayered(dir); err != nil {
		return err
	}
	return unmountCaches(dir)
}

// unmountAt unmounts whatever is mounted at p, stacked mounts included.
func unmountAt(p string) error {
	for range 8 { // stacked mounts need one round each
		err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, deepest (and most
// recently stacked) first, the order in which they must be unmounted.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := parseMountinfo(f)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := len(all) - 1; i >= 0; i-- {
		mp := all[i].MountPoint
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unmountAll removes every mount at or below dir: a normal unmount first,
// a lazy detach if something still holds it, so no mount is left behind.
func unmountAll(dir string) error {
	for range 8 { // stacked mounts need one round each
		mps, err := mountsUnder(dir)
		if err != nil {
			return fmt.Errorf("list mounts: %w", err)
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			err := unix.Unmount(mp, unix.UMOUNT_NOFOLLOW)
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			}
			if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
		}
	}
	mps, _ := mountsUnder(dir)
	if len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, mps)
	}
	return nil
}
