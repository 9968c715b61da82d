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
// The wire protocol and the client (in Go and in C) are package
// front's: a program hands its commands off by importing it.
//
// Only a process of the server's own uid (SO_PEERCRED) running the
// server's own binary (/proc/PID/exe, the same file) is served.
package handoff

import (
	"os"
	"strings"
)

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
