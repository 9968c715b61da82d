//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// A sandbox whose network goes through the server's egress proxy
// (Spec.Egress; package egress, "Local sandboxes"): its network namespace
// is made by the server, not by the sandbox (so it belongs to the host's
// user namespace, and nothing in the sandbox can reconfigure it), and has
// no interface but its loopback, with every IPv4 and IPv6 destination
// routed to it as a local address:
//
//	ip link set lo up
//	ip route add local 0.0.0.0/0 dev lo
//	ip -6 route add local ::/0 dev lo
//
// A connection to any address lands on a socket of the namespace, whose
// local address is where the job meant to go. The server opens the
// proxy's listeners in it (proxyPort for the proxy variables, 80 and 443
// for clients that ignore them, 53 over UDP and TCP for its resolver,
// the callback port forwarded to the callback server) and serves them
// with the job's token; any other port refuses, other UDP meets no
// socket, ICMP goes nowhere. Neither pasta nor slirp4netns runs: there
// is no road out to police but the proxy.
//
// The namespace is bound at fileNetns (as a kept sandbox's is), so that
// every command of the sandbox joins it and a restarted server opens the
// listeners in it again (Recover). Listening sockets belong to the
// server's process: while no server runs, a job's connections to them
// are refused, and the next server serves them again.

const (
	// proxyPort is the proxy's port inside the sandbox, and proxyHost the
	// address the job is told (any address reaches the listener).
	proxyPort = 3128
	proxyHost = "10.0.2.2"
	// proxyResolvConf is bound over the sandbox's /etc/resolv.conf: any
	// address reaches the sandbox's resolver, this one as well.
	proxyResolvConf = "# delegate sandbox: names are answered by delegate's egress proxy\nnameserver 10.0.2.3\n"
	// TrustFile is where a sandbox whose job has its own CA (injected
	// credentials) finds its trust bundle: its system roots and that CA.
	TrustFile = "/run/delegate/ca-bundle.pem"
	// fileTrust is the bundle in the sandbox directory, bound at TrustFile.
	fileTrust = "ca-bundle.pem"
	// maxRootsBytes bounds the system roots read into a bundle.
	maxRootsBytes = 8 << 20
)

// systemRoots are where distributions keep their bundle of trusted roots,
// in the order they are looked for in a sandbox's root.
var systemRoots = [...]string{
	"etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
	"etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"etc/ssl/cert.pem",                  // Alpine, macOS-like layouts
	"etc/ssl/ca-bundle.pem",             // openSUSE
}

// proxies serves the egress proxy's listeners of this backend's
// sandboxes made with Spec.Egress, in the server's process.
type proxies struct {
	server   sandbox.EgressServer // Config.Egress, nil for none
	callback int                  // Config.EgressCallbackPort
	log      *slog.Logger

	mu     sync.Mutex
	served map[string]*servedSandbox // by sandbox id
}

// EgressRoute implements sandbox.EgressRouter.
func (b *Backend) EgressRoute(token string) sandbox.EgressRoute { return b.proxies.route(token) }

// route is what a job whose sandbox's network is the proxy's is told.
func (ps *proxies) route(token string) sandbox.EgressRoute {
	r := sandbox.EgressRoute{
		ProxyURL: "http://" + net.JoinHostPort(proxyHost, strconv.Itoa(proxyPort)),
		// The sandbox's own loopback, and the callback listener, which is
		// reached directly (the proxy would refuse an address).
		NoProxy:   "localhost,127.0.0.1,::1," + proxyHost,
		TrustFile: TrustFile,
	}
	if p := ps.callbackPort(); p != 0 {
		r.CallbackURL = "http://" + net.JoinHostPort(proxyHost, strconv.Itoa(p))
	}
	return r
}

// callbackPort is the port of the callback listener in new sandboxes:
// the server's callback port, unless it is one of the proxy's own.
func (ps *proxies) callbackPort() int {
	switch p := ps.callback; p {
	case 0, proxyPort, 80, 443, 53:
		return 0
	default:
		return p
	}
}

// proxyListeners are one sandbox's listeners, opened in its namespace.
type proxyListeners struct {
	proxy, http, tls, dnsTCP, callback net.Listener
	dnsUDP                             net.PacketConn
}

// close closes the listeners (those their Serve calls closed already
// say so, which is no failure) and returns what failed.
func (l *proxyListeners) close() error {
	var errs []error
	for _, c := range []io.Closer{l.proxy, l.http, l.tls, l.dnsTCP, l.callback, l.dnsUDP} {
		if c == nil {
			continue
		}
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// servedSandbox is a sandbox whose listeners this server serves.
type servedSandbox struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ls     *proxyListeners
}

// makeProxyNetns makes the sandbox's network namespace, its loopback up
// and every destination routed to it, and binds it at path.
func makeProxyNetns(path string) error {
	if err := touch(path); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with us
		f, err := newNetns()
		if err == nil {
			err = routeAllToLoopback()
			if err == nil {
				err = unix.Mount(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), path, "", unix.MS_BIND, "")
			}
			f.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}

// inNetnsAt runs fn on a thread that has entered the network namespace
// bound at path: the sockets fn makes belong to it.
func inNetnsAt(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the sandbox's network namespace: %w", err)
			return
		}
		err = fn()
		// A thread that cannot go back ends with this goroutine (it stays
		// locked); one that can is handed back to the scheduler.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// openProxyListeners opens the proxy's listeners in the namespace bound
// at path: callback is the callback listener's port (0: none).
func openProxyListeners(path string, callback int) (*proxyListeners, error) {
	l := &proxyListeners{}
	err := inNetnsAt(path, func() error {
		var err error
		listen := func(port int) net.Listener {
			if err != nil {
				return nil
			}
			var ln net.Listener
			ln, err = net.Listen("tcp", ":"+strconv.Itoa(port))
			return ln
		}
		l.proxy, l.http, l.tls, l.dnsTCP = listen(proxyPort), listen(80), listen(443), listen(53)
		if callback != 0 {
			l.callback = listen(callback)
		}
		if err == nil {
			l.dnsUDP, err = net.ListenPacket("udp", ":53")
		}
		return err
	})
	if err != nil {
		l.close()
		return nil, fmt.Errorf("the egress proxy's listeners: %w", err)
	}
	return l, nil
}

// serve serves a sandbox's listeners, opening them in its namespace,
// unless this server serves them already.
func (ps *proxies) serve(id, dir string, st sandboxState) error {
	if st.Proxy == nil {
		return nil
	}
	if ps.server == nil {
		return fmt.Errorf("sandbox %s goes through the egress proxy, and this server has none (local.Config.Egress)", id)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.served[id] != nil {
		return nil
	}
	ls, err := openProxyListeners(filepath.Join(dir, fileNetns), st.Proxy.Callback)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &servedSandbox{cancel: cancel, ls: ls}
	token := st.Proxy.Token
	serve := func(what string, f func() error) {
		s.wg.Go(func() {
			if err := f(); err != nil && ctx.Err() == nil {
				ps.log.Error("egress proxy: a sandbox's listener failed", "sandbox", id, "listener", what, "err", err)
			}
		})
	}
	serve("proxy", func() error { return ps.server.Serve(ctx, ls.proxy, token) })
	serve("http", func() error { return ps.server.ServeTransparent(ctx, ls.http, token) })
	serve("https", func() error { return ps.server.ServeTransparent(ctx, ls.tls, token) })
	serve("dns/tcp", func() error { return ps.server.ServeDNSStream(ctx, ls.dnsTCP, token) })
	serve("dns/udp", func() error { return ps.server.ServeDNS(ctx, ls.dnsUDP, token) })
	if ls.callback != nil {
		serve("callback", func() error { return ps.server.ServeCallback(ctx, ls.callback, token) })
	}
	ps.served[id] = s
	return nil
}

// stop stops serving a sandbox's listeners (they close with their Serve
// calls), and returns what failed to close.
func (ps *proxies) stop(id string) error {
	ps.mu.Lock()
	s := ps.served[id]
	delete(ps.served, id)
	ps.mu.Unlock()
	if s == nil {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	if err := s.ls.close(); err != nil {
		return fmt.Errorf("sandbox %s: the egress proxy's listeners: %w", id, err)
	}
	return nil
}

// close stops serving every sandbox's listeners (Close: the next server
// serves them again when it recovers the sandboxes).
func (ps *proxies) close() error {
	ps.mu.Lock()
	ids := make([]string, 0, len(ps.served))
	for id := range ps.served {
		ids = append(ids, id)
	}
	ps.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, ps.stop(id))
	}
	return errors.Join(errs...)
}

// writeTrustBundle writes the sandbox's trust bundle: the system roots of
// its root filesystem (the template's, or the host's it sees) and the
// job's CA. It is bound read-only at TrustFile in the sandbox.
func writeTrustBundle(dir string, tpl int, ca []byte) error {
	root := "/"
	if tpl >= 0 {
		root = fmt.Sprintf("/proc/self/fd/%d", tpl)
	}
	roots, err := readSystemRoots(root)
	if err != nil {
		return err
	}
	bundle := append(roots, '\n')
	bundle = append(bundle, ca...)
	// Readable by the sandbox's init (its group may search dir) and job.
	return writeFileAtomic(filepath.Join(dir, fileTrust), bundle, 0o644)
}

// readSystemRoots reads the bundle of trusted roots of the root
// filesystem at root, resolving links inside it; none is no error (the
// bundle then holds the job's CA alone).
func readSystemRoots(root string) ([]byte, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	defer unix.Close(rootFD)
	for _, p := range systemRoots {
		fd, err := unix.Openat2(rootFD, p, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), p)
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			f.Close()
			continue
		}
		data, err := io.ReadAll(io.LimitReader(f, maxRootsBytes+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("trust bundle: /%s: %w", p, err)
		}
		if len(data) > maxRootsBytes {
			return nil, fmt.Errorf("trust bundle: /%s is larger than %d MiB", p, maxRootsBytes>>20)
		}
		return data, nil
	}
	return nil, nil
}

// errNoEgressProxy is Create's answer for Spec.Egress on a backend
// without a proxy.
var errNoEgressProxy = errors.New("this server's local backend has no egress proxy (local.Config.Egress)")
