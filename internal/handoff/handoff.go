// Package handoff hands a CLI command (`delegate run`, `delegate exec`)
// to a `delegate serve` already serving the same data dir, over a Unix
// socket in that data dir, instead of opening the store, the engine and
// the backend in a process of its own (docs/cli.md, "Handed to a running
// server"). The client sends its command line, its environment, its
// working directory and its standard input, output and error as
// descriptors; the server runs the command as the CLI would, writing to
// those descriptors itself (so that what reaches a terminal is exactly
// what the in-process path writes), and answers with its exit status, or
// declines it having done nothing, and the client runs it as before.
//
// The wire protocol, the same from the C front end (front_linux.c) and
// the Go one (client_linux.go):
//
//	client → server, once, with SCM_RIGHTS [0, 1, 2]:
//	  "DLGH" version(1 byte) bodylen(u32 LE) body
//	  body: argc(u32) {len(u32) bytes}×argc envc(u32) {len bytes}×envc len(u32) cwd
//	client → server, later: 'I' for each SIGINT or SIGTERM (Ctrl-C)
//	server → client: 'D' (declined, nothing done) or 'X' code(i32 LE), then it closes
//
// Only a process of the server's own uid (SO_PEERCRED) running the
// server's own binary (/proc/PID/exe, the same file) is served.
package handoff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SocketName is the socket's name in the data dir; lockName the file
// whose lock says which server owns it.
const (
	SocketName = "cli.sock"
	lockName   = "cli.lock"
)

// The protocol's bytes (see the package comment).
const (
	magic       = "DLGH"
	version     = 1
	headerLen   = len(magic) + 1 + 4
	maxBody     = 8 << 20 // a command line and an environment, at most
	frameDecl   = 'D'
	frameExit   = 'X'
	frameSignal = 'I'
)

// NoHandOffEnv set to 1 keeps a command in its own process (tests,
// benchmarks of the in-process path).
const NoHandOffEnv = "DELEGATE_NO_HANDOFF"

// Request is a command handed to the server.
type Request struct {
	Args []string // the command line, without the program's name
	Env  []string // KEY=VALUE
	Dir  string   // the client's working directory
	// Stdin, Stdout and Stderr are the client's own descriptors.
	Stdin, Stdout, Stderr *os.File
	PID                   int // the client's, from SO_PEERCRED
}

// Getenv reads the client's environment as os.Getenv reads the
// process's (the first of duplicates).
func (r *Request) Getenv(key string) string {
	for _, kv := range r.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func (r *Request) closeFiles() {
	for _, f := range []*os.File{r.Stdin, r.Stdout, r.Stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// encodeBody writes a request's body (without the header).
func encodeBody(args, env []string, dir string) []byte {
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
func header(n int) []byte {
	h := append([]byte(magic), version)
	return binary.LittleEndian.AppendUint32(h, uint32(n))
}

// errBadRequest: the bytes are not a request of this protocol.
var errBadRequest = errors.New("handoff: malformed request")

// decodeBody reads a request's body.
func decodeBody(b []byte) (args, env []string, dir string, err error) {
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
		return nil, nil, "", errBadRequest
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

// socketPath is the socket of dataDir, or an error when the path is too
// long for a Unix socket address.
func socketPath(dataDir string) (string, error) {
	p := filepath.Join(dataDir, SocketName)
	if len(p) >= 108 {
		return "", fmt.Errorf("handoff: the socket path %s is longer than a Unix socket address may be", p)
	}
	return p, nil
}
