//go:build linux && !amd64

package local

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// The seccomp filter is written for the x86_64 syscall table only; running
// jobs without it would silently weaken the sandbox, so refuse instead.
func seccompSupported() error {
	return fmt.Errorf("the local backend's seccomp filter is only implemented for linux/amd64, not linux/%s", runtime.GOARCH)
}

func installSeccomp([]byte) error { return seccompSupported() }

func seccompProgram() ([]unix.SockFilter, error) { return nil, seccompSupported() }
