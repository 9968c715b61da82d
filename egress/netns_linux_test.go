//go:build linux

package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/delegate-dev/delegate/internal/testnet"
)

// The network tests run in the test internet of internal/testnet: the
// whole test binary runs again in fresh network and mount namespaces
// (testnet.Main), where testnet.World holds the test web sites, a test DNS
// server and a fake metadata service, reached over a veth pair, and each
// test's sandbox namespace is wired to the proxy the way doc.go describes
// for the local backend.

const helperEnv = "DELEGATE_EGRESS_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	os.Exit(testnet.Main(m))
}

func listenIn(t testing.TB, ns, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := testnet.InNetns(ns, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func listenPacketIn(t testing.TB, ns, network, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	err := testnet.InNetns(ns, func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

func dialIn(ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := testnet.InNetns(ns, func() (err error) {
		c, err = net.DialTimeout(network, addr, 3*time.Second)
		return err
	})
	return c, err
}

// sandbox is a job's network namespace wired as the local backend would
// wire it: no interface but its loopback, every IPv4 and IPv6 destination
// routed to that loopback (so a connection to anywhere lands on a local
// socket, whose local address is where the job meant to go), and the
// proxy's listeners, opened inside it by the server, on the ports a job
// uses: 3128 (the proxy variables), 80 and 443 (redirected clients), 53
// (DNS, UDP and TCP) and the callback port. Nothing leaves it otherwise.
// Its /etc/resolv.conf is the test process's, naming the test DNS: that
// address, like the local backend's 10.0.2.3 or any other, reaches the
// sandbox's own resolver.
type sandbox struct {
	ns    string
	token string
}

// sandboxProxyURL is what the local backend would put in http_proxy and
// https_proxy: any address of the sandbox reaches its listener.
const (
	sandboxProxyURL = "http://10.0.2.2:3128"
	sandboxCallback = 8765
)

var sandboxSeq atomic.Int64

func newSandbox(t testing.TB, p *Proxy, token string) *sandbox {
	t.Helper()
	sb := &sandbox{ns: fmt.Sprintf("egsbx%d", sandboxSeq.Add(1)), token: token}
	for _, args := range [][]string{
		{"netns", "add", sb.ns},
		{"-n", sb.ns, "link", "set", "lo", "up"},
		{"-n", sb.ns, "route", "add", "local", "0.0.0.0/0", "dev", "lo"},
		{"-n", sb.ns, "-6", "route", "add", "local", "::/0", "dev", "lo"},
	} {
		if err := testnet.IP(args...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	serve := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil {
				t.Errorf("sandbox %s: %s: %v", sb.ns, name, err)
			}
		})
	}
	proxyLn := listenIn(t, sb.ns, "tcp", ":3128")
	httpLn := listenIn(t, sb.ns, "tcp", ":80")
	tlsLn := listenIn(t, sb.ns, "tcp", ":443")
	dnsTCP := listenIn(t, sb.ns, "tcp", ":53")
	dnsUDP := listenPacketIn(t, sb.ns, "udp", ":53")
	serve("proxy", func() error { return p.Serve(ctx, proxyLn, token) })
	serve("transparent http", func() error { return p.ServeTransparent(ctx, httpLn, token) })
	serve("transparent tls", func() error { return p.ServeTransparent(ctx, tlsLn, token) })
	serve("dns tcp", func() error { return p.ServeDNSStream(ctx, dnsTCP, token) })
	serve("dns udp", func() error { return p.ServeDNS(ctx, dnsUDP, token) })
	if p.guard.callback.IsValid() {
		cbLn := listenIn(t, sb.ns, "tcp", fmt.Sprintf(":%d", sandboxCallback))
		serve("callback", func() error { return p.ServeCallback(ctx, cbLn, token) })
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := testnet.IP("netns", "del", sb.ns); err != nil {
			t.Error(err)
		}
	})
	return sb
}

// cmdResult is what a client command did.
type cmdResult struct {
	out, err string
	code     int
}

func (r cmdResult) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
}

// run runs a command (in ns when ns is not ""), with env added to a
// minimal environment.
func run(t testing.TB, ns string, env []string, args ...string) cmdResult {
	t.Helper()
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "LANG=C"}, env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cmdResult{out: out.String(), err: errb.String()}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		res.code = ee.ExitCode()
	}
	return res
}

// nsDialer dials from a thread that entered ns once and stays there, for
// benchmarks: a dial costs what it costs anywhere else, not a thread's
// setns as well.
type nsDialer struct {
	reqs chan nsDial
}

type nsDial struct {
	network, addr string
	res           chan nsDialResult
}

type nsDialResult struct {
	c   net.Conn
	err error
}

// newNSDialer dials in the namespace at path (/run/netns/NAME, or
// /proc/self/ns/net for the test's own).
func newNSDialer(t testing.TB, path string) *nsDialer {
	d := &nsDialer{reqs: make(chan nsDial)}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		target, err := os.Open(path)
		if err == nil {
			err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET)
			target.Close()
		}
		ready <- err
		if err != nil {
			return
		}
		for r := range d.reqs {
			c, err := net.DialTimeout(r.network, r.addr, 3*time.Second)
			r.res <- nsDialResult{c, err}
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(d.reqs) })
	return d
}

func (d *nsDialer) dial(network, addr string) (net.Conn, error) {
	res := make(chan nsDialResult, 1)
	d.reqs <- nsDial{network, addr, res}
	r := <-res
	return r.c, r.err
}
