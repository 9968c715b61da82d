//go:build !linux

package pgtest

import "syscall"

// serverAttr runs the server as cred, in a process group of its own
// (Stop ends it; a test binary killed leaves it running: no Pdeathsig
// here).
func serverAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
