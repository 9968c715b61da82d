package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// runRecords is where the local sandboxes' records are kept when this
// process may write there: a tmpfs on every systemd host, emptied by a
// reboot, which ends every sandbox anyway.
const runRecords = "/run/delegate"

// sandboxesDir is the directory of the local backend's sandboxes:
// DATA_DIR/sandboxes, made a symbolic link to a directory of runRecords
// (one per data dir) where this process can make one. A sandbox's
// directory holds its records (its state, pid files, FIFOs, the
// control socket, each command's files) and the mount points of its
// tmpfs workspace and channel; on the data dir's disk, making and
// removing those inodes was a fifth of a `delegate run` (ext4's search
// for a free inode skips those freed in the last seconds;
// docs/BENCHMARKS.md, "Third pass"). The caches, the artifacts and the
// store stay on the data dir. A data dir whose sandboxes directory
// holds sandboxes made before keeps it until it is empty; where
// runRecords cannot be written (not root), the data dir's is used.
func sandboxesDir(dataDir, run string) string {
	link := filepath.Join(dataDir, "sandboxes")
	sum := sha256.Sum256([]byte(dataDir))
	target := filepath.Join(run, "sandboxes-"+hex.EncodeToString(sum[:8]))
	fi, err := os.Lstat(link)
	switch {
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		if t, _ := os.Readlink(link); t != target {
			return link // not ours: as it is
		}
		if makeRecordsDir(target) == nil {
			return target // after a reboot, made again
		}
		// The records' place is gone and cannot be made again: the
		// data dir's own, as without one.
		os.Remove(link)
		return link
	case err == nil && fi.IsDir():
		if !emptyDir(link) || makeRecordsDir(target) != nil {
			return link
		}
		// Removed only while empty (rmdir): a sandbox made there
		// meanwhile keeps it.
		if err := syscall.Rmdir(link); err != nil {
			return link
		}
	case errors.Is(err, fs.ErrNotExist):
		if makeRecordsDir(target) != nil {
			return link
		}
	default:
		return link
	}
	if err := os.Symlink(target, link); err != nil {
		// Another process made it first (the same link), or the data
		// dir is not ours to write: what is there now.
		if t, _ := os.Readlink(link); t == target {
			return target
		}
		return link
	}
	return target
}

// makeRecordsDir makes dir (and its parent) for this process alone,
// and checks that it is a directory of this uid's, 0700, not a link.
func makeRecordsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("%s is not a directory of uid %d with mode 0700", dir, os.Geteuid())
	}
	return nil
}

// emptyDir: dir has no entries.
func emptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	return errors.Is(err, io.EOF)
}
