package front

import (
	"encoding/binary"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

// The Go front end runs as this package is initialised, before most of
// the program's packages are (see the package comment).
func init() {
	if code, ok := Try(os.Args[1:]); ok {
		os.Exit(code)
	}
}

// Try hands the command line args to the server serving its data dir,
// when there is one and it takes the command, and returns its exit
// status (ok true); otherwise ok is false, nothing was done, and the
// command runs in this process. The C front end (front_linux.c) does the
// same before the Go runtime starts in a cgo build, where Try does
// nothing: what it would have done is done.
func Try(args []string) (code int, ok bool) {
	if cFront || os.Getenv(NoHandOffEnv) == "1" || !HandedOff(args) {
		return 0, false
	}
	dir := DataDir(args, os.Getenv)
	if dir == "" {
		return 0, false
	}
	code, err := handOff(dir, args)
	if errors.Is(err, errNoServer) || errors.Is(err, errDeclined) {
		return 0, false
	}
	if err != nil {
		os.Stderr.WriteString("delegate: " + err.Error() + "\n")
		return 125, true
	}
	return code, true
}

var (
	errNoServer = errors.New("handoff: no server")
	errDeclined = errors.New("handoff: declined")
)

// handOff sends args to dataDir's server and waits for its answer,
// passing on SIGINT and SIGTERM.
func handOff(dataDir string, args []string) (int, error) {
	path, err := SocketPath(dataDir)
	if err != nil {
		return 0, errNoServer
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, errNoServer
	}
	conn := os.NewFile(uintptr(fd), "handoff")
	defer conn.Close()
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return 0, errNoServer
	}
	// The server must be of this process's uid: a data dir another uid
	// can write to (DELEGATE_DATA_DIR=/tmp/...) must not get this
	// process's environment, its terminal and its exit status.
	if cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED); err != nil || int(cred.Uid) != os.Geteuid() {
		return 0, errNoServer
	}
	cwd, _ := os.Getwd()
	body := EncodeBody(args, os.Environ(), cwd)
	// From here the server may run the command: a Ctrl-C is its.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	interrupted := false
	if err := syscall.Sendmsg(fd, Header(len(body)), syscall.UnixRights(0, 1, 2), nil, 0); err != nil {
		return 0, errNoServer
	}
	for len(body) > 0 {
		n, err := syscall.Write(fd, body)
		if err != nil && err != syscall.EINTR {
			return 0, errNoServer
		}
		body = body[max(n, 0):]
	}
	answers := make(chan []byte, 1)
	go func() {
		var b [5]byte
		n, _ := readFull(fd, b[:1])
		if n == 1 && b[0] == FrameExit {
			m, _ := readFull(fd, b[1:])
			n += m
		}
		answers <- b[:n]
	}()
	for {
		select {
		case <-sigs:
			interrupted = true
			syscall.Write(fd, []byte{FrameSignal})
		case a := <-answers:
			switch {
			case len(a) == 1 && a[0] == FrameDeclined && interrupted:
				return ExitInterrupted, nil
			case len(a) == 1 && a[0] == FrameDeclined:
				return 0, errDeclined
			case len(a) == 5 && a[0] == FrameExit:
				return int(int32(binary.LittleEndian.Uint32(a[1:]))), nil
			}
			return 0, errors.New("the server serving " + dataDir + " ended before the command did")
		}
	}
}

// ExitInterrupted is the status of a command interrupted before the
// server took it (the CLI's own for a cancelled job).
const ExitInterrupted = 130

func readFull(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := syscall.Read(fd, b[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			return n, err
		}
		n += m
	}
	return n, nil
}
