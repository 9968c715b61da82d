// Package front is the hand-off's client side and its wire protocol
// (package handoff has the server and the whole story): the Go front end,
// which a CGO_ENABLED=0 build runs as this package is initialised, and
// the C one (front_linux.c), which a cgo build runs before the Go
// runtime starts. It imports little on purpose: Go initialises a
// package as soon as its imports are, lexically first among those
// ready, so that this one runs before the ~200 packages of the rest of
// the program (the SQLite driver, the MCP SDK, net/http ...) do their
// initialisation, which a handed command never needs.
//
// The protocol (front_linux.c must stay in step):
//
//	client → server, once, with SCM_RIGHTS [0, 1, 2]:
//	  "DLGH" version(1 byte) bodylen(u32 LE) body
//	  body: argc(u32) {len(u32) bytes}×argc envc(u32) {len bytes}×envc len(u32) cwd
//	client → server, later: 'I' for each SIGINT or SIGTERM (Ctrl-C)
//	server → client: 'D' (declined, nothing done) or 'X' code(i32 LE), then it closes
package front

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
)

// SocketName is the socket's name in the data dir.
const SocketName = "cli.sock"

// The protocol's bytes (see the package comment).
const (
	Magic         = "DLGH"
	Version       = 1
	HeaderLen     = len(Magic) + 1 + 4
	MaxBody       = 8 << 20 // a command line and an environment, at most
	FrameDeclined = 'D'
	FrameExit     = 'X'
	FrameSignal   = 'I'
)

// NoHandOffEnv set to 1 keeps a command in its own process (tests,
// benchmarks of the in-process path).
const NoHandOffEnv = "DELEGATE_NO_HANDOFF"

// EncodeBody writes a request's body (without the header).
func EncodeBody(args, env []string, dir string) []byte {
	var b []byte
	list := func(l []string) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(l)))
		for _, s := range l {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
			b = append(b, s...)
		}
	}
	list(args)
	list(env)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dir)))
	return append(b, dir...)
}

// header is the fixed start of a request for a body of n bytes.
func Header(n int) []byte {
	h := append([]byte(Magic), Version)
	return binary.LittleEndian.AppendUint32(h, uint32(n))
}

// ErrBadRequest: the bytes are not a request of this protocol.
var ErrBadRequest = errors.New("handoff: malformed request")

// DecodeBody reads a request's body.
func DecodeBody(b []byte) (args, env []string, dir string, err error) {
	u32 := func() (int, bool) {
		if len(b) < 4 {
			return 0, false
		}
		n := binary.LittleEndian.Uint32(b)
		b = b[4:]
		return int(n), true
	}
	str := func() (string, bool) {
		n, ok := u32()
		if !ok || n > len(b) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	list := func() ([]string, bool) {
		n, ok := u32()
		if !ok || n > len(b)/4 {
			return nil, false
		}
		l := make([]string, 0, n)
		for range n {
			s, ok := str()
			if !ok {
				return nil, false
			}
			l = append(l, s)
		}
		return l, true
	}
	var ok1, ok2, ok3 bool
	args, ok1 = list()
	env, ok2 = list()
	dir, ok3 = str()
	if !ok1 || !ok2 || !ok3 || len(b) != 0 {
		return nil, nil, "", ErrBadRequest
	}
	return args, env, dir, nil
}

// DataDir is the data dir a command line names, found as the CLI finds
// it (--data-dir, DELEGATE_DATA_DIR, XDG_STATE_HOME, HOME), or "" when it
// is not an absolute path: the server compares the data dir the command
// would use with its own, so a guess that differs costs only a refusal.
func DataDir(args []string, getenv func(string) string) string {
	dir := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dir = v
		} else if a == "--data-dir" && i+1 < len(args) {
			dir = args[i+1]
			i++
		}
	}
	switch {
	case dir != "":
	case getenv("DELEGATE_DATA_DIR") != "":
		dir = getenv("DELEGATE_DATA_DIR")
	case getenv("XDG_STATE_HOME") != "":
		dir = filepath.Join(getenv("XDG_STATE_HOME"), "delegate")
	case getenv("HOME") != "":
		dir = filepath.Join(getenv("HOME"), ".local", "state", "delegate")
	}
	if !filepath.IsAbs(dir) {
		return ""
	}
	return dir
}

// HandedOff says whether args is a command a server may take: run or
// exec, after --data-dir flags at most.
func HandedOff(args []string) bool {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "run" || a == "exec":
			return true
		case a == "--data-dir":
			i++
		case strings.HasPrefix(a, "--data-dir="):
		default:
			return false
		}
	}
	return false
}

// SocketPath is the socket of dataDir, or an error when the path is too
// long for a Unix socket address.
func SocketPath(dataDir string) (string, error) {
	p := filepath.Join(dataDir, SocketName)
	if len(p) >= 108 {
		return "", errors.New("handoff: the socket path " + p + " is longer than a Unix socket address may be")
	}
	return p, nil
}
