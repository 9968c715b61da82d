//go:build linux

package local

import (
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// startAsOwner starts cmd, which makes a new user namespace, with this
// thread's effective uid and gid set to owner for the clone: the
// namespace is then owner's, not root's, and the kernel charges what the
// sandbox holds of per-user budgets to owner (uids.go). Only this thread
// changes (the shim locks it, and the Go runtime makes new threads from
// another when a thread is locked), and only for the clone; its
// effective capabilities are kept meanwhile, so that a host that lets
// only privileged processes make user namespaces still lets the shim.
// The C shim does the same (start_as_owner in owner_linux.c).
func startAsOwner(cmd *exec.Cmd, owner uint32) error {
	if err := setEffectiveIDs(owner); err != nil {
		setEffectiveIDs(0)
		return fmt.Errorf("own the sandbox's user namespace as host uid %d: %w", owner, err)
	}
	startErr := cmd.Start()
	if err := setEffectiveIDs(0); err != nil {
		// A shim that is not root again cannot place init in its cgroups
		// nor map its ids; end what it started.
		if startErr == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return fmt.Errorf("become root again after starting the sandbox init: %w", err)
	}
	return startErr
}

// setEffectiveIDs sets this thread's effective uid and gid (only: the real
// and saved ones stay root's, so root can come back) and keeps its
// effective capabilities. (SYS_SETRESUID is the 32-bit call on the
// architectures the backend runs on: New refuses the others.)
func setEffectiveIDs(id uint32) error {
	const keep = ^uintptr(0) // (uid_t)-1: unchanged
	if id == 0 {
		// The uid first: back at euid 0 the kernel restores the effective
		// capabilities from the permitted ones, and the gid follows.
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return fmt.Errorf("setresuid: %w", e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep); e != 0 {
			return fmt.Errorf("setresgid: %w", e)
		}
		return nil
	}
	// The gid first, while CAP_SETGID is still effective: leaving euid 0
	// clears the effective capabilities (not the permitted ones, since
	// the real and saved uids stay 0), which are raised again below.
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(id), keep); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(id), keep); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
