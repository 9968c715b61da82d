//go:build unix

package mcpserver

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pollable returns a second descriptor of f, waited on by Go's network
// poller, when f is a pipe or a socket (what an MCP client gives a server
// it starts), and a function that puts f's file back in blocking mode if
// it was. A terminal, a regular file or /dev/null is left alone: their
// blocking mode is shared with whatever else has them open (a shell), and
// a poller cannot wait on the last two.
//
// Why: a read of blocking stdin parks a thread in the kernel, and the
// goroutine it hands each message to waits for another thread to pick it
// up; a read through the poller ends with the goroutine that reads able
// to handle what it read on the same thread. And a Close of the pollable
// descriptor ends a read that waits, which no close of blocking stdin does.
func pollable(f *os.File) (*os.File, func(), error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var (
		dup         int
		wasBlocking bool
		opErr       error
	)
	// Control, not Fd: Fd would put f in blocking mode.
	err = raw.Control(func(fd uintptr) {
		var st unix.Stat_t
		if opErr = unix.Fstat(int(fd), &st); opErr != nil {
			return
		}
		if kind := st.Mode & unix.S_IFMT; kind != unix.S_IFIFO && kind != unix.S_IFSOCK {
			opErr = fmt.Errorf("not a pipe or a socket (mode %o)", kind)
			return
		}
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil {
			opErr = err
			return
		}
		wasBlocking = flags&unix.O_NONBLOCK == 0
		if dup, opErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); opErr != nil {
			return
		}
		if opErr = unix.SetNonblock(dup, true); opErr != nil {
			unix.Close(dup)
		}
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return nil, nil, err
	}
	restore := func() {
		if wasBlocking {
			// The two descriptors share one open file, and so its mode.
			raw.Control(func(fd uintptr) { unix.SetNonblock(int(fd), false) })
		}
	}
	// A descriptor in non-blocking mode is one NewFile registers with the
	// poller.
	return os.NewFile(uintptr(dup), f.Name()), restore, nil
}
