package handoff

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/internal/handoff/front"
)

// Handler runs a handed request, writing to its descriptors, and returns
// its exit status; or it declines it (declined true) having read and
// written nothing, and the client runs the command itself. ctx ends when
// the client is interrupted (Ctrl-C) or gone.
type Handler func(ctx context.Context, r *Request) (code int, declined bool)

// lockName is the file in the data dir whose lock says which server
// owns the socket.
const lockName = "cli.lock"

// Server owns a data dir's hand-off socket.
type Server struct {
	ln   *net.UnixListener
	lock *os.File
	path string
	exe  os.FileInfo // this binary, which a client must be too
	// view is this process's mount namespace and root directory, which
	// a client's must be: a client that sees another filesystem (a
	// container, a confined application, a private /tmp) means by its
	// paths what the server would not read.
	view [2]os.FileInfo
	log  *slog.Logger
	// requestTimeout bounds the reading of a request: a client that
	// connects and stops (Ctrl-Z) is declined, not waited for.
	requestTimeout time.Duration
}

// requestTimeout is Server.requestTimeout's default: a request is sent
// whole as soon as the client has connected.
const requestTimeout = 10 * time.Second

// Listen takes dataDir's socket (mode 0600) for this process. It returns
// nil and no error when another server holds it: one server a data dir
// serves the CLI (stdio servers, one per MCP client, share data dirs).
func Listen(dataDir string, log *slog.Logger) (*Server, error) {
	path, err := front.SocketPath(dataDir)
	if err != nil {
		return nil, err
	}
	exe, err := os.Stat("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	var view [2]os.FileInfo
	for i, p := range viewPaths {
		if view[i], err = os.Stat(fmt.Sprintf(p, "self")); err != nil {
			return nil, fmt.Errorf("handoff: %w", err)
		}
	}
	// Not through a link: one left there would have this server create
	// the file it names (as root, /etc/nologin say).
	lock, err := os.OpenFile(filepath.Join(dataDir, lockName), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("handoff: the lock file (a regular file, not a link): %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil // another server's
		}
		return nil, fmt.Errorf("handoff: lock %s: %w", lock.Name(), err)
	}
	// Held: a socket left there is a dead server's.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("handoff: %w", err)
	}
	// Made 0600 as it is bound (no moment where another uid could
	// connect; SO_PEERCRED is checked all the same).
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("handoff: %w", err)
	}
	ln.SetUnlinkOnClose(false) // removed by Serve, under the lock
	return &Server{ln: ln, lock: lock, path: path, exe: exe, view: view, log: log, requestTimeout: requestTimeout}, nil
}

// Serve answers requests with h until ctx ends, then waits for the
// requests in progress (their contexts ended) and gives the socket up.
func (s *Server) Serve(ctx context.Context, h Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		s.ln.Close()
		wg.Wait()
		os.Remove(s.path)
		s.lock.Close()
	}()
	wg.Go(func() {
		<-ctx.Done()
		s.ln.Close()
	})
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil {
				// The CLI runs its commands itself from now on.
				s.log.Warn("the CLI's hand-off socket is no longer served", "err", err)
			}
			return nil
		}
		wg.Go(func() { s.serveConn(ctx, conn, h) })
	}
}

// Close gives the socket up without serving (Serve does it when it
// ends).
func (s *Server) Close() {
	s.ln.Close()
	os.Remove(s.path)
	s.lock.Close()
}

func (s *Server) serveConn(ctx context.Context, conn *net.UnixConn, h Handler) {
	defer conn.Close()
	// The request is read by its time or until the server stops (Serve
	// waits for this connection).
	conn.SetReadDeadline(time.Now().Add(s.requestTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	req, err := s.read(conn)
	stop()
	// (When the server stops meanwhile, the command's context has ended.)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		// Declined: the client runs the command itself (another uid,
		// such as root, or another build of delegate, may well).
		s.log.Debug("handoff: request refused", "err", err)
		conn.Write([]byte{front.FrameDeclined})
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The client's Ctrl-C, or its end: the command's context ends, as a
	// signal ends the CLI's own.
	go func() {
		var b [1]byte
		for {
			if _, err := conn.Read(b[:]); err != nil || b[0] != front.FrameSignal {
				cancel()
				return
			}
			cancel()
		}
	}()
	code, declined := h(ctx, req)
	// Closed before the answer: when the client exits, whoever reads
	// its output (a pipe, a terminal) sees the end at once.
	req.closeFiles()
	if declined {
		conn.Write([]byte{front.FrameDeclined})
		return
	}
	conn.Write(binary.LittleEndian.AppendUint32([]byte{front.FrameExit}, uint32(int32(code))))
}

// viewPaths are a process's mount namespace and root directory (of
// "self" or a pid), which a client's must share with the server's.
var viewPaths = [...]string{"/proc/%s/ns/mnt", "/proc/%s/root"}

// read reads a request and checks who sent it.
func (s *Server) read(conn *net.UnixConn) (*Request, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return nil, errors.Join(err, cerr)
	}
	if int(cred.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("uid %d is not this server's (%d)", cred.Uid, os.Geteuid())
	}
	if exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", cred.Pid)); err != nil || !os.SameFile(exe, s.exe) {
		return nil, fmt.Errorf("process %d does not run this server's binary", cred.Pid)
	}
	for i, p := range viewPaths {
		if fi, err := os.Stat(fmt.Sprintf(p, strconv.Itoa(int(cred.Pid)))); err != nil || !os.SameFile(fi, s.view[i]) {
			return nil, fmt.Errorf("process %d sees another filesystem than this server (%s)", cred.Pid, p)
		}
	}
	buf := make([]byte, front.HeaderLen)
	oob := make([]byte, syscall.CmsgSpace(3*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	files, ferr := receivedFiles(oob[:oobn])
	req := &Request{PID: int(cred.Pid)}
	if len(files) == 3 {
		req.Stdin, req.Stdout, req.Stderr = files[0], files[1], files[2]
	} else {
		for _, f := range files {
			f.Close()
		}
		return nil, errors.Join(ferr, fmt.Errorf("%d descriptors sent, not 3", len(files)))
	}
	if _, err := io.ReadFull(conn, buf[n:]); err != nil {
		req.closeFiles()
		return nil, err
	}
	blen := binary.LittleEndian.Uint32(buf[len(front.Magic)+1:])
	if string(buf[:len(front.Magic)]) != front.Magic || buf[len(front.Magic)] != front.Version || blen > front.MaxBody {
		req.closeFiles()
		return nil, front.ErrBadRequest
	}
	body := make([]byte, blen)
	if _, err := io.ReadFull(conn, body); err != nil {
		req.closeFiles()
		return nil, err
	}
	if req.Args, req.Env, req.Dir, err = front.DecodeBody(body); err != nil {
		req.closeFiles()
		return nil, err
	}
	return req, nil
}

// receivedFiles are the descriptors a message carried (close-on-exec:
// the net package receives them so).
func receivedFiles(oob []byte) ([]*os.File, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	var errs []error
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), [...]string{"stdin", "stdout", "stderr"}[min(i, 2)]))
		}
	}
	return files, errors.Join(errs...)
}
