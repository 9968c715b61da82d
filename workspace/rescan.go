//go:build unix

package workspace

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// A job's source is scanned when it is submitted (so that a bad one is a
// field error then) and, before this, again when the job starts: 22–37
// ms of a 10,000-file import, for a job that starts at once (issue 41,
// item 3). Rescan gives the submission's tree back instead when a scan
// now would find the same, which it tells from the status of what the
// scan read, without listing a directory:
//
//   - a directory's names (created, removed, renamed in or out) change
//     its modification and change times, and so does a change of its
//     mode or owner; a mount on it changes its device and inode;
//   - a file's content, size, mode and owner change its change time (a
//     job cannot set it back: the kernel sets it); a file replaced is
//     another inode, and changed its directory's times;
//   - what decides which files are in (the .gitignore files, the index,
//     .git/info/exclude) is read from files whose status is kept too,
//     and a mount point left out is kept by device and inode.
//
// A change within the filesystem's timestamp granularity of the status it
// replaces (the same tick of the kernel's clock) leaves the times as they
// were, so the tree is taken again only when every time it kept is
// racyMargin older than the scan (git's "racily clean" entries, the same
// question), and only on filesystems whose times the kernel sets from
// its own clock (a network filesystem's server sets them from its own).
// Anything else, and any error, scans again: the slow way is the exact one.

// racyMargin: a status this close to the scan's start, or after it, may
// hide a change made in the same tick (1 s on ext4's small inodes; a few
// ms elsewhere).
var racyMargin = 2 * time.Second

// maxStamped bounds the inputs and mount points a tree keeps the status
// of; a tree with more is scanned again.
const maxStamped = 100_000

// fileStamp is the status a change shows in.
type fileStamp struct {
	mode, uid, gid     uint32
	dev, ino           uint64
	size, mtime, ctime int64
}

func stampOf(st *unix.Stat_t) fileStamp {
	return fileStamp{mode: uint32(st.Mode), uid: st.Uid, gid: st.Gid, dev: uint64(st.Dev), ino: uint64(st.Ino),
		size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// stamped is a path's status.
type stamped struct {
	path string
	st   fileStamp
}

// stamp adds p's status to list, unless the tree keeps too many.
func (t *Tree) stamp(list []stamped, p string, st *unix.Stat_t) []stamped {
	if len(list) >= maxStamped {
		t.stamped = false
		return list
	}
	return append(list, stamped{p, stampOf(st)})
}

// readInput reads a file that decides what the tree holds (an ignore
// file, the index), keeping its status as opened for Rescan.
func (s *scanner) readInput(p string, max int64) ([]byte, error) {
	data, st, err := s.b.readFileStat(p, max)
	if err == nil {
		s.t.inputs = s.t.stamp(s.t.inputs, p, st)
	}
	return data, err
}

// Rescan returns the tree as Scan(ctx, t.Root, opts) would find it now:
// t itself when nothing a scan depends on changed since t was scanned
// (see above), else a new scan.
func (t *Tree) Rescan(ctx context.Context, opts ScanOptions) (*Tree, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if opts == t.opts && t.unchanged(ctx) {
		return t, nil
	}
	return Scan(ctx, t.Root, opts)
}

// unchanged tells whether the status of everything t's scan read is as
// it was, and too old to hide a change.
func (t *Tree) unchanged(ctx context.Context) bool {
	if !t.stamped {
		return false
	}
	limit := t.began.Add(-racyMargin).UnixNano()
	if t.rootSt.ctime >= limit {
		return false
	}
	for i := range t.Entries {
		if t.Entries[i].ctime >= limit {
			return false
		}
	}
	for _, in := range t.inputs {
		if in.st.ctime >= limit {
			return false
		}
	}
	rootfd, st, err := openRoot(t.Root, t.within)
	if err != nil {
		return false
	}
	defer unix.Close(rootfd)
	if stampOf(st) != t.rootSt || !stampsLocally(rootfd) {
		return false
	}
	if t.within != "" && refuseGitDir(rootfd, t.Root) != nil {
		return false
	}
	b := newBeneath(rootfd)
	defer b.close()
	for i := range t.Entries {
		if i&1023 == 0 && ctx.Err() != nil {
			return false
		}
		e := &t.Entries[i]
		st, err := b.lstat(e.Path)
		if err != nil || st.Ino != uint64(e.ino) || st.Mtim.Nano() != e.MTime || st.Ctim.Nano() != e.ctime {
			return false
		}
		switch typ := st.Mode & unix.S_IFMT; e.Type {
		case TypeDir:
			if typ != unix.S_IFDIR || int64(st.Dev) != t.dev || perm(st) != e.Perm {
				return false
			}
		case TypeFile:
			if typ != unix.S_IFREG || st.Size != e.Size || perm(st) != e.Perm {
				return false
			}
		case TypeSymlink:
			if typ != unix.S_IFLNK {
				return false
			}
		}
	}
	for _, list := range [][]stamped{t.inputs, t.mounts} {
		for _, s := range list {
			st, err := b.lstat(s.path)
			if err != nil || stampOf(st) != s.st {
				return false
			}
		}
	}
	return true
}
