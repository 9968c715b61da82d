package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// recordPlaces are where the local sandboxes' records may be kept, best
// first; the first that is a tmpfs and safe to write is used
// (sandboxesDir). /run/delegate is a tmpfs on every systemd host,
// emptied by a reboot, which ends every sandbox anyway. Where /run is
// on disk (hosts without systemd, some containers), root's records go
// to /dev/shm/delegate-0, a tmpfs too. /dev/shm is world-writable
// (sticky): another user may have made that name first, as a link or
// a directory of theirs, so it is used only as a directory of this
// uid's, not a link, writable by no one else (recordsPlace); the sticky
// bit keeps others from renaming or removing it after. Not for other
// uids: systemd-logind (RemoveIPC=yes, its default) empties a regular
// user's files and directories in /dev/shm at their last logout, which
// would take the records of sandboxes still running; those keep the
// data dir's. A private tmpfs mounted by delegate was not chosen:
// mounted on /run/delegate it would hide the local backend's uid
// registry and probe records (/run/delegate/uids, probes) of running
// sandboxes; anywhere it needs CAP_SYS_ADMIN in the host's mount
// namespace, a lock against two processes stacking mounts, and is not
// seen by processes of another mount namespace, which would keep
// records apart.
func recordPlaces() []string {
	places := []string{"/run/delegate"}
	if os.Geteuid() == 0 {
		places = append(places, "/dev/shm/delegate-0")
	}
	return places
}

// sandboxesDir is the directory of the local backend's sandboxes:
// DATA_DIR/sandboxes, made a symbolic link to a directory of the first
// of places that is a tmpfs (one per data dir) where this process can
// make one. A sandbox's directory holds its records (its state, pid
// files, FIFOs, the control socket, each command's files) and the mount
// points of its tmpfs workspace and channel; on the data dir's disk,
// making and removing those inodes was a fifth of a `delegate run`
// (ext4's search for a free inode skips those freed in the last
// seconds; docs/BENCHMARKS.md, "Third pass"), and a /run on disk costs
// the same. The caches, the artifacts and the store stay on the data
// dir. A data dir whose sandboxes directory holds sandboxes made before
// keeps it until it is empty (a directory, or a link to a place of
// places not chosen now); where no place fits, the data dir's is used,
// and log says why at debug level.
func sandboxesDir(log *slog.Logger, dataDir string, places []string) string {
	link := filepath.Join(dataDir, "sandboxes")
	name := recordsName(dataDir)
	target := ""
	for _, p := range places {
		dir, err := recordsPlace(p, name)
		if err == nil {
			target = dir
			break
		}
		log.Debug("sandboxes' records: a place not used", "place", p, "reason", err)
	}
	dir := linkRecords(link, target, name, places)
	log.Debug("sandboxes' records", "dir", dir, "on_tmpfs", onTmpfs(dir))
	return dir
}

// recordsName is the name of dataDir's records' directory in a place:
// one per data dir.
func recordsName(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "sandboxes-" + hex.EncodeToString(sum[:8])
}

// linkRecords makes link a link to target ("": none fits) where it may,
// and returns the directory the sandboxes are to be kept in.
func linkRecords(link, target, name string, places []string) string {
	fi, err := os.Lstat(link)
	switch {
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		t, _ := os.Readlink(link)
		if target != "" && t == target {
			return target // after a reboot, made again by recordsPlace
		}
		if !ourRecords(t, name, places) {
			return link // not ours: as it is
		}
		// Ours, in a place not chosen now (not a tmpfs, or gone and
		// not to be made again): kept while it holds sandboxes; removed
		// only while empty (rmdir), so a sandbox made there meanwhile
		// keeps it.
		if err := syscall.Rmdir(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return t
			}
			return link
		}
		if target == "" {
			os.Remove(link)
			return link
		}
		// Replaced in one step: a process reading the link meanwhile
		// sees the old target or the new, never none.
		tmp := link + ".new-" + strconv.Itoa(os.Getpid())
		os.Remove(tmp)
		if os.Symlink(target, tmp) != nil || os.Rename(tmp, link) != nil {
			os.Remove(tmp)
			os.Remove(link)
			return link
		}
		return target
	case err == nil && fi.IsDir():
		if target == "" || !emptyDir(link) {
			return link
		}
		if err := syscall.Rmdir(link); err != nil {
			return link
		}
	case errors.Is(err, fs.ErrNotExist):
		if target == "" {
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

// ourRecords: t is a records' directory of this data dir (name) in one
// of places.
func ourRecords(t, name string, places []string) bool {
	if filepath.Base(t) != name {
		return false
	}
	for _, p := range places {
		if filepath.Dir(t) == filepath.Clean(p) {
			return true
		}
	}
	return false
}

// recordsPlace makes the records' directory name in place when place is
// a tmpfs, place a directory of this uid's that no one else may write
// (not a link), and returns it.
func recordsPlace(place, name string) (string, error) {
	if !onTmpfs(place) { // before anything is made there
		return "", fmt.Errorf("%s is not on a tmpfs", place)
	}
	if err := os.Mkdir(place, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if err := ownDir(place, 0o022, 0); err != nil {
		return "", err
	}
	if !onTmpfs(place) { // something mounted there
		return "", fmt.Errorf("%s is not on a tmpfs", place)
	}
	dir := filepath.Join(place, name)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return dir, ownDir(dir, 0o777, 0o700)
}

// ownDir checks that dir is a directory (not a link) of this uid's
// whose permission bits under mask are want.
func ownDir(dir string, mask, want fs.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&mask != want {
		return fmt.Errorf("%s is not a directory of uid %d with mode %#o under %#o (found %v)", dir, os.Geteuid(), want, mask, fi.Mode())
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
