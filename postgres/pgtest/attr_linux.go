package pgtest

import "syscall"

// serverAttr runs the server as cred, in a process group of its own, and
// has it go with the test binary, however that ends (SIGQUIT:
// PostgreSQL's immediate shutdown).
func serverAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
}
