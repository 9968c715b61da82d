package workspace

import (
	"fmt"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// identity is who the package acts as inside a tree: the tree's owner, so
// that whoever owns a tree can make it show nothing its owner could not
// read (a link to /etc/shadow, a root-only file) and can receive nothing
// its owner could not write.
type identity struct {
	uid, gid uint32
	groups   []uint32
}

func (id *identity) String() string {
	if id == nil {
		return "the server's user"
	}
	return fmt.Sprintf("uid %d", id.uid)
}

// identityFor returns the identity to act as in a directory owned by uid
// (group gid): nil when there is nothing to switch to (the server is not
// root, so it has no more rights than its own; or the tree is root's).
func identityFor(uid, gid uint32) (*identity, error) {
	if os.Geteuid() != 0 || uid == 0 {
		return nil, nil
	}
	id := &identity{uid: uid, gid: gid}
	// The owner's primary group and supplementary groups, as a login of
	// that user would have them; a uid without an account keeps only the
	// directory's group.
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			id.gid = uint32(g)
		}
		if gs, err := u.GroupIds(); err == nil {
			for _, s := range gs {
				if g, err := strconv.ParseUint(s, 10, 32); err == nil {
					id.groups = append(id.groups, uint32(g))
				}
			}
		}
	}
	return id, nil
}

// runAs runs fn as id. With an identity, fn runs on an OS thread of its
// own whose filesystem identity (fsuid, fsgid, supplementary groups) is
// id's: set with the raw per-thread system calls, not Go's setgroups, which
// changes every thread of the process. The goroutine never unlocks the
// thread, so the runtime discards the thread when fn returns and no other
// goroutine ever runs with these credentials. Everything fn does must
// happen on that goroutine: a goroutine fn starts runs as the server.
func runAs(id *identity, fn func() error) error {
	if id == nil {
		return fn()
	}
	type result struct {
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: see above.
		defer func() {
			if p := recover(); p != nil {
				done <- result{panic: p}
			}
		}()
		if err := id.become(); err != nil {
			done <- result{err: err}
			return
		}
		done <- result{err: fn()}
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

// become sets the calling thread's filesystem identity. (The numbers are
// the 32-bit-id calls of amd64 and arm64, the builds delegate ships; on
// 32-bit x86 and arm the same names are the old 16-bit calls.) setfsuid and
// setfsgid report no errors: each is checked by reading the value back
// (an invalid id, -1, changes nothing and returns the current one).
func (id *identity) become() error {
	var gp unsafe.Pointer
	if len(id.groups) > 0 {
		gp = unsafe.Pointer(&id.groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(id.groups)), uintptr(gp), 0); e != 0 {
		return fmt.Errorf("setgroups for uid %d: %w", id.uid, e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(id.gid), 0, 0)
	if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); uint32(cur) != id.gid {
		return fmt.Errorf("setfsgid %d: still %d", id.gid, cur)
	}
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(id.uid), 0, 0)
	if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(cur) != id.uid {
		return fmt.Errorf("setfsuid %d: still %d", id.uid, cur)
	}
	return nil
}
