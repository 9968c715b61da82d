//go:build unix

package mcpserver_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/mcpserver"
	"golang.org/x/sys/unix"
)

// blockingPipe is a pipe in blocking mode, as a shell or an MCP client
// gives a server its stdin (os.Pipe's are already non-blocking).
func blockingPipe(t *testing.T) (io.ReadCloser, io.WriteCloser) {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	return os.NewFile(uintptr(fds[0]), "stdin"), os.NewFile(uintptr(fds[1]), "client")
}

func nonBlocking(t *testing.T, fd int) bool {
	t.Helper()
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return flags&unix.O_NONBLOCK != 0
}

// TestStdioPollsPipes: a blocking pipe is read through the poller while the
// session lasts (its file is non-blocking then), Close ends a read that
// waits although the client keeps its end open, and the file is left in
// blocking mode, as it was found.
func TestStdioPollsPipes(t *testing.T) {
	r, w := blockingPipe(t)
	defer w.Close()
	// A second descriptor of the same open file, to look at its mode
	// after the session has closed its own.
	probe, err := unix.Dup(int(r.(*os.File).Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(probe)
	outR, outW := io.Pipe()
	ctx := context.Background()
	server := newServer(ctx, fullService(), slog.New(slog.DiscardHandler))
	ss, err := server.Connect(ctx, mcpserver.StdioTransport(r, outW, mcpserver.Limits{}, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	rw := &rawConn{w: w, r: newLineReader(outR), ctx: ctx}
	rw.initialize(t)
	rw.alive(t, 1)
	if !nonBlocking(t, probe) {
		t.Error("the pipe is in blocking mode during the session: it is not read through the poller")
	}

	closed := make(chan error, 1)
	go func() { closed <- ss.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the session while the client kept its end of stdin open")
	}
	if nonBlocking(t, probe) {
		t.Error("stdin is left in non-blocking mode after the session")
	}
}
