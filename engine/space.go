package engine

import (
	"errors"
	"strings"
	"syscall"

	"github.com/delegate-dev/delegate"
	"golang.org/x/sys/unix"
)

// minFreeSetting is the floor's environment variable, named in refusals.
const minFreeSetting = "DELEGATE_MIN_FREE"

// defaultMinFree is the floor when none is set: the smaller of 1 GiB and
// 5% of the file system.
func defaultMinFree(total int64) int64 { return min(1<<30, total/20) }

// space is the data dir's floor of free space: below it, work that would
// write there (a submission, a sandbox opened) is refused, rather than
// accepted and then failed, or stuck, when the disk is full.
type space struct {
	dir   string // "" : no data dir to watch
	floor int64  // 0: defaultMinFree; < 0: none
}

// free returns the bytes free in dir for an unprivileged process, and the
// file system's size.
func free(dir string) (avail, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil // Bsize is uint32 on macOS
}

// check refuses when the data dir is below its floor. A data dir that
// cannot be looked at is not refused for it: writing there says why.
func (s space) check() error {
	if s.dir == "" || s.floor < 0 {
		return nil
	}
	avail, total, err := free(s.dir)
	if err != nil {
		return nil
	}
	floor := s.floor
	if floor == 0 {
		floor = defaultMinFree(total)
	}
	if avail < floor {
		return &delegate.NoSpaceError{Dir: s.dir, Free: avail, Floor: floor, Setting: minFreeSetting}
	}
	return nil
}

// explain turns err, if a write failed for lack of room, into a
// NoSpaceError that says where (the file system's own words, ENOSPC or
// SQLite's "database or disk is full", say neither where nor what to
// do); any other error is returned as it is.
func (s space) explain(err error) error {
	if err == nil || !isNoSpace(err) {
		return err
	}
	var ns *delegate.NoSpaceError
	if errors.As(err, &ns) {
		return err
	}
	e := &delegate.NoSpaceError{Dir: s.dir, Err: err}
	if s.dir != "" {
		e.Free, _, _ = free(s.dir)
	}
	return e
}

// isNoSpace tells whether err is a write that failed for lack of room.
func isNoSpace(err error) bool {
	if err == nil {
		return false
	}
	var ns *delegate.NoSpaceError
	msg := strings.ToLower(err.Error())
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.As(err, &ns) ||
		strings.Contains(msg, "database or disk is full") || strings.Contains(msg, "no space left on device")
}

// low tells whether the data dir is (nearly) full: less free than a
// write needs (lowSpace), whatever the floor.
func (s space) low() bool {
	if s.dir == "" {
		return false
	}
	avail, _, err := free(s.dir)
	return err == nil && avail < lowSpace
}

// lowSpace: less free than this, a write of a job's end may fail.
const lowSpace = 1 << 20

// where names the data dir, or says it is the server's.
func (s space) where() string {
	if s.dir == "" {
		return "the server's data dir"
	}
	return s.dir
}
