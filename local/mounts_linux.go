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
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("make %s read-only: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("make %s read-only: %w", path, err)
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
	if err := unix.Mount("", path, "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", path, err)
	}
	return nil
}

// bindReadOnly binds src (recursively) at dst, which it creates with the
// same type (directory or file), and makes it read-only.
func bindReadOnly(src, dst string, isDir bool) error {
	if isDir {
		if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	} else if err := touch(dst); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return readOnlyRecursive(dst)
}

func touch(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// copyTopLevel reproduces the entries named (or all of srcRoot's, when
// names is nil) under root: symlinks as the same symlinks (Debian's /bin
// → usr/bin), directories and files as read-only binds.
func copyTopLevel(srcRoot, root string, names []string) error {
	if names == nil {
		ents, err := os.ReadDir(srcRoot)
		if err != nil {
			return fmt.Errorf("read template: %w", err)
		}
		for _, e := range ents {
			if !slices.Contains(templateSkip[:], e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	for _, name := range names {
		src := filepath.Join(srcRoot, name)
		dst := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		case fi.IsDir():
			if err := bindReadOnly(src, dst, true); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := bindReadOnly(src, dst, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildRoot assembles the job's root filesystem under dirRootfs, relative
// to the current directory (the sandbox directory: see runShim for why
// init works with relative paths), then makes it the root.
func buildRoot(cfg initConfig) error {
	// Nothing we mount may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := dirRootfs
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("mount root tmpfs: %w", err)
	}
	var err error
	if cfg.Template {
		err = copyTopLevel(dirTemplate, root, nil)
	} else {
		err = copyTopLevel("/", root, hostViewDirs[:])
	}
	if err != nil {
		return fmt.Errorf("populate root: %w", err)
	}
	if cfg.Network {
		if err := bindResolvConf(root); errors.Is(err, errNoResolvConf) {
			// Not fatal: the job may only need addresses.
			fmt.Fprintf(os.Stderr, "%s%v\n", setupPrefix, err)
		} else if err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	// Empty /root and /home (read-only, like the rest of the root): programs
	// expect them, and they show that nothing of the host's is there.
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"root", 0o755}, {"home", 0o755}, {"workspace", 0o755}, {"tmp", 0o1777}, {"proc", 0o555}, {"dev", 0o755}} {
		p := filepath.Join(root, d.name)
		if _, err := os.Lstat(p); err == nil {
			continue // from the template
		}
		if err := os.Mkdir(p, d.mode); err != nil {
			return fmt.Errorf("create /%s: %w", d.name, err)
		}
	}
	if err := unix.Mount(dirWorkspace, filepath.Join(root, "workspace"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind /workspace: %w", err)
	}
	if err := bindStatusFIFO(root); err != nil {
		return err
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%d", cfg.TmpBytes)
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := buildDev(filepath.Join(root, "dev"), tmpOpts); err != nil {
		return err
	}
	if err := unix.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make root read-only: %w", err)
	}
	return pivot(root)
}

// buildDev makes a minimal /dev: a few harmless host devices bound in,
// the usual symlinks, and a private /dev/shm.
func buildDev(dev, shmOpts string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, n)
		if err := touch(p); err != nil {
			return fmt.Errorf("create /dev/%s: %w", n, err)
		}
		// A bind keeps the host mount's device access; a device node made
		// on our own tmpfs would not open (user-namespace mounts are nodev).
		if err := unix.Mount("/dev/"+n, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("create /dev/%s: %w", name, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, shmOpts); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("", dev, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make /dev read-only: %w", err)
	}
	return nil
}

// pivot makes root the root directory and drops the old one entirely, so
// nothing of the host outside the binds stays reachable.
func pivot(root string) error {
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach below then removes it, without needing a directory for it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return os.Chdir("/")
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
