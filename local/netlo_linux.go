//go:build linux

package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

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

// routeAllToLoopback makes every IPv4 and IPv6 destination a local
// address of the calling thread's network namespace, on its loopback, as
// "ip route add local 0.0.0.0/0 dev lo" and "ip -6 route add local ::/0
// dev lo" do (through netlink: no ip binary is needed). A host without
// IPv6 keeps the IPv4 route alone.
func routeAllToLoopback() error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := addLocalRoute(unix.AF_INET, lo.Index); err != nil {
		return fmt.Errorf("route 0.0.0.0/0 to the loopback: %w", err)
	}
	if err := addLocalRoute(unix.AF_INET6, lo.Index); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("route ::/0 to the loopback: %w", err)
	}
	return nil
}

// addLocalRoute adds a route of type local for every address of family
// to the local table, through the interface index ifindex.
func addLocalRoute(family, ifindex int) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	// nlmsghdr, rtmsg, then one attribute: RTA_OIF (a uint32).
	const attrLen = unix.SizeofRtAttr + 4
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofRtMsg+attrLen)
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&msg[0]))
	hdr.Len = uint32(len(msg))
	hdr.Type = unix.RTM_NEWROUTE
	hdr.Flags = unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_EXCL
	hdr.Seq = 1
	rt := (*unix.RtMsg)(unsafe.Pointer(&msg[unix.SizeofNlMsghdr]))
	rt.Family = uint8(family)
	rt.Dst_len = 0
	rt.Table = unix.RT_TABLE_LOCAL
	rt.Protocol = unix.RTPROT_BOOT
	rt.Scope = unix.RT_SCOPE_HOST
	rt.Type = unix.RTN_LOCAL
	attr := (*unix.RtAttr)(unsafe.Pointer(&msg[unix.SizeofNlMsghdr+unix.SizeofRtMsg]))
	attr.Len = attrLen
	attr.Type = unix.RTA_OIF
	*(*uint32)(unsafe.Pointer(&msg[unix.SizeofNlMsghdr+unix.SizeofRtMsg+unix.SizeofRtAttr])) = uint32(ifindex)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
				return syscall.Errno(errno)
			}
			return nil
		}
	}
	return errors.New("no answer from netlink")
}
