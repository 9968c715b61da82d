package local

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// PeekEnd reads how a sandbox's command ended, as its supervisor recorded
// it, without a backend (dir is the backend's Config.Dir): a process that
// only reads the jobs (delegate jobs list, with no server running) says a
// job ended that no server has recorded yet. false when the command has
// not ended, or there is no such sandbox or command.
func PeekEnd(dir, sandboxID, execID string) (sandbox.Exit, bool) {
	if !safeName(sandboxID) || !safeName(execID) {
		return sandbox.Exit{}, false
	}
	d := filepath.Join(dir, sandboxID)
	if strings.HasPrefix(execID, "ex-") {
		if _, err := os.Lstat(filepath.Join(d, dirExecs, execID)); err == nil {
			d = filepath.Join(d, dirExecs, execID) // one command of many
		}
	}
	var rec execRecord
	if data, err := os.ReadFile(filepath.Join(d, fileExec)); err != nil || json.Unmarshal(data, &rec) != nil || rec.ID != execID {
		return sandbox.Exit{}, false
	}
	var end exitRecord
	if data, err := os.ReadFile(filepath.Join(d, fileExit)); err != nil || json.Unmarshal(data, &end) != nil {
		return sandbox.Exit{}, false
	}
	e := sandbox.Exit{Code: end.Code, Signal: end.Signal, OOMKilled: end.OOMKilled, OutputBytes: end.OutputBytes,
		Truncated: end.Truncated, Killed: end.Killed, DeadlineExceeded: end.DeadlineExceeded, Reason: end.Reason}
	if e.Signal == "" && end.Signo > 0 {
		e.Signal = syscall.Signal(end.Signo).String()
	}
	if end.EndedAt > 0 {
		e.EndedAt = time.Unix(0, end.EndedAt).UTC()
	}
	return e, true
}

// safeName: an id that is one path element.
func safeName(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\\\x00")
}
