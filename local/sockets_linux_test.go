//go:build linux

package local

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socketProbe is one call the socket test makes, in a sandbox (through the
// test binary's "sockets" helper) and on the host, to tell what the
// sandbox refuses from what the kernel lacks.
type socketProbe struct {
	name    string
	allowed bool // a job may make it (when the kernel can)
	call    func() error
}

func socketProbes() []socketProbe {
	sock := func(af, typ int) func() error {
		return func() error {
			fd, err := unix.Socket(af, typ|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}
	}
	pair := func(af int) func() error {
		return func() error {
			fds, err := unix.Socketpair(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
			}
			return err
		}
	}
	return []socketProbe{
		{"unix", true, sock(unix.AF_UNIX, unix.SOCK_STREAM)},
		{"inet", true, sock(unix.AF_INET, unix.SOCK_DGRAM)},
		{"inet6", true, sock(unix.AF_INET6, unix.SOCK_DGRAM)},
		{"netlink-route", true, sock(unix.AF_NETLINK, unix.SOCK_RAW)},
		{"socketpair-unix", true, pair(unix.AF_UNIX)},
		{"vsock", false, vsockListen},
		{"packet", false, sock(unix.AF_PACKET, unix.SOCK_DGRAM)},
		{"alg", false, sock(unix.AF_ALG, unix.SOCK_SEQPACKET)},
		{"key", false, sock(unix.AF_KEY, unix.SOCK_RAW)},
		{"bluetooth", false, sock(unix.AF_BLUETOOTH, unix.SOCK_RAW)},
		{"xdp", false, sock(unix.AF_XDP, unix.SOCK_RAW)},
		{"tipc", false, sock(unix.AF_TIPC, unix.SOCK_RDM)},
		{"socketpair-vsock", false, pair(unix.AF_VSOCK)},
		{"io_uring", false, ioUringSetup},
	}
}

// vsockListen is the attack: listen on a vsock port, which the host's
// (and the hypervisor's) port space shares whatever the network namespace.
func vsockListen() error {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: unix.VMADDR_PORT_ANY}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return nil
}

func ioUringSetup() error {
	var params [120]byte // struct io_uring_params, zeroed
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return errno
	}
	unix.Close(int(fd))
	return nil
}

// probeResult is "ok" or the errno's name (e.g. "EAFNOSUPPORT").
func probeResult(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		if strings.HasPrefix(err.Error(), "bind") || strings.HasPrefix(err.Error(), "listen") {
			return "ok-socket-" + unix.ErrnoName(errno) // made the socket, failed later
		}
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// runSocketProbes prints name=result lines (the "sockets" helper).
func runSocketProbes() int {
	for _, p := range socketProbes() {
		fmt.Printf("%s=%s\n", p.name, probeResult(p.call()))
	}
	return 0
}
