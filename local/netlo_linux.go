//go:build linux

package local

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// loopbackUp brings up "lo" in the sandbox's (otherwise empty) network
// namespace: jobs often talk to themselves over 127.0.0.1 (test servers,
// language servers), and this 127.0.0.1 is the sandbox's own, not the
// host's.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set flags: %w", err)
	}
	return nil
}
