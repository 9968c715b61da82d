//go:build linux

package local

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// testHelperEnv makes the test binary act as a small tool (see runHelper)
// instead of running tests. Tests copy it into a sandbox's workspace to
// probe the sandbox from the inside without relying on host tools.
const testHelperEnv = "DELEGATE_LOCAL_TEST_HELPER"

func TestMain(m *testing.M) {
	if Reexec() {
		return // not reached: Reexec exits
	}
	if h := os.Getenv(testHelperEnv); h != "" {
		os.Exit(runHelper(h, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// runHelper is the test binary as a tool.
func runHelper(name string, args []string) int {
	switch name {
	case "pieces": // 3 MiB to stdout in pieces (TestRawReader)
		if err := writePieces(os.Stdout); err != nil {
			return 1
		}
		return 0
	case "alloc": // alloc MiB: allocate and touch that much memory
		n, _ := strconv.Atoi(args[0])
		buf := make([]byte, n<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		fmt.Printf("allocated %d MiB\n", n)
		return 0
	case "connect": // connect addr: try a TCP connection
		c, err := net.DialTimeout("tcp", args[0], 3*time.Second)
		if err != nil {
			fmt.Printf("connect failed: %v\n", err)
			return 1
		}
		c.Close()
		fmt.Println("connected")
		return 0
	case "dial": // dial addr...: try a TCP connection to each, report each
		for _, a := range args {
			c, err := net.DialTimeout("tcp", a, 3*time.Second)
			if err != nil {
				fmt.Printf("dial %s: failed: %v\n", a, err)
				continue
			}
			c.Close()
			fmt.Printf("dial %s: connected\n", a)
		}
		return 0
	case "resolve": // resolve name: look a name up with Go's own resolver
		r := &net.Resolver{PreferGo: true}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(ctx, args[0])
		if err != nil {
			fmt.Printf("resolve failed: %v\n", err)
			return 1
		}
		fmt.Printf("resolved %s: %v\n", args[0], addrs)
		return 0
	case "lookup": // lookup name...: the system resolver's answer for each
		for _, a := range args {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			addrs, err := net.DefaultResolver.LookupHost(ctx, a)
			cancel()
			if err != nil {
				fmt.Printf("%s: no (%v)\n", a, err)
				continue
			}
			fmt.Printf("%s: %s\n", a, strings.Join(addrs, " "))
		}
		return 0
	case "tunnels": // tunnels N host:port roots.pem: open N TLS tunnels through the proxy, hold them until /workspace/stop
		return runTunnels(args)
	case "sink": // sink addr: accept TCP connections and hold them, reading what comes ("read" once one's first byte has)
		ln, err := net.Listen("tcp", args[0])
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Println("listening")
		for {
			c, err := ln.Accept()
			if err != nil {
				return 1
			}
			go func() {
				if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
					fmt.Println("read")
				}
				io.Copy(io.Discard, c)
			}()
		}
	case "udp": // udp addr...: send a datagram to each
		for _, a := range args {
			c, err := net.Dial("udp", a)
			if err != nil {
				fmt.Printf("udp %s: %v\n", a, err)
				continue
			}
			_, err = c.Write([]byte("hello " + a))
			c.Close()
			fmt.Printf("udp %s: sent (%v)\n", a, err)
		}
		return 0
	case "loopback": // talk to ourselves over 127.0.0.1
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Printf("loopback listen: %v\n", err)
			return 1
		}
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Write([]byte("pong"))
				c.Close()
			}
		}()
		c, err := net.DialTimeout("tcp", l.Addr().String(), 3*time.Second)
		if err != nil {
			fmt.Printf("loopback dial: %v\n", err)
			return 1
		}
		buf := make([]byte, 4)
		_, err = c.Read(buf)
		fmt.Printf("loopback %s %v\n", buf, err)
		return 0
	case "syscalls": // what the seccomp filter does to a few calls
		report := func(name string, err error) {
			if err == nil {
				fmt.Printf("%s=ok\n", name)
			} else {
				fmt.Printf("%s=%v\n", name, err)
			}
		}
		report("unshare", unix.Unshare(unix.CLONE_NEWUSER))
		report("mount", unix.Mount("none", "/tmp", "tmpfs", 0, ""))
		report("keyctl", errnoOf(unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, 0, 0)))
		report("ptrace", errnoOf(unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)))
		report("bpf", errnoOf(unix.Syscall(unix.SYS_BPF, 0, 0, 0)))
		report("clone3", errnoOf(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)))
		report("x32", errnoOf(unix.Syscall(0x40000000+39, 0, 0, 0))) // x32 getpid
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		report("clone-newuser", cmd.Run())
		report("clone-plain", exec.Command("/bin/true").Run())
		return 0
	case "sockets": // which socket families and io_uring the sandbox allows
		return runSocketProbes()
	case "nofile": // RLIMIT_NOFILE, and how many descriptors it can open
		return runNoFile()
	case "lownofile": // New under a low hard RLIMIT_NOFILE
		return runLowNoFile(args)
	case "budgets": // inotify instances and message queues: one, or all it can
		return runBudgets(args)
	case "mapfiles": // mapfiles FILE: map FILE, close it, again, until that fails; hold them
		return runMapFiles(args)
	case "sharedroot": // an egress job in a mount namespace with a shared root
		return runSharedRoot(args)
	case "keptserver": // a server keeping a sandbox, until killed
		return runKeptServer(args)
	case "check": // New as whoever runs this
		_, err := New(Config{Dir: args[0]})
		fmt.Printf("New: %v\n", err)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
	return 2
}

func errnoOf(_, _ uintptr, e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// mib is a mebibyte.
const mib = 1 << 20

func defaultSpec() sandbox.Spec {
	return sandbox.Spec{JobID: "job-test", CPU: 1, MemoryBytes: 256 * mib, DiskBytes: 64 * mib}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// canRun skips a test on a host where the backend cannot work (not root),
// unless DELEGATE_REQUIRE_LOCAL is set, as in CI: then it is a failure.
func canRun(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 && os.Getenv("DELEGATE_REQUIRE_LOCAL") == "" {
		t.Skip("the local backend needs root; set DELEGATE_REQUIRE_LOCAL=1 to make this a failure")
	}
}

// newBackend returns a backend on a fresh directory.
func newBackend(t testing.TB, pidsMax int) *Backend {
	t.Helper()
	canRun(t)
	var log *slog.Logger
	if tt, ok := t.(*testing.T); ok && testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testLogWriter{tt}, nil))
	}
	b, err := New(Config{Dir: t.TempDir(), PidsMax: pidsMax, Logger: log})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

func create(t testing.TB, b *Backend, spec sandbox.Spec) *sbox {
	t.Helper()
	sb, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return sb.(*sbox)
}

var testEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C"}

// start runs args in sb.
func start(t testing.TB, sb sandbox.Instance, args ...string) sandbox.Process {
	t.Helper()
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: args, Env: testEnv, OutputLimit: 1 << 20})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return p
}

// finish waits for p and returns how it ended and its whole output.
func finish(t testing.TB, p sandbox.Process) (sandbox.Exit, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	out, err := p.ReadOutput(ctx, 0, 1<<20)
	if err != nil {
		t.Fatalf("ReadOutput: %v", err)
	}
	return exit, string(sandbox.Join(out))
}

// tagged renders output pieces as "[stream]data", in order.
func tagged(outs []sandbox.Output) string {
	var b strings.Builder
	for _, o := range outs {
		fmt.Fprintf(&b, "[%s]%s", o.Stream, o.Data)
	}
	return b.String()
}

// finishTagged waits for p and returns how it ended and its output as
// tagged renders it.
func finishTagged(t testing.TB, p sandbox.Process) (sandbox.Exit, string) {
	t.Helper()
	exit, _ := finish(t, p)
	out, err := p.ReadOutput(context.Background(), 0, 1<<20)
	if err != nil {
		t.Fatalf("ReadOutput: %v", err)
	}
	return exit, tagged(out)
}

func run(t testing.TB, sb sandbox.Instance, args ...string) (sandbox.Exit, string) {
	t.Helper()
	return finish(t, start(t, sb, args...))
}

// sh runs a shell script in a new default sandbox.
func sh(t *testing.T, b *Backend, script string) (sandbox.Exit, string) {
	t.Helper()
	return run(t, create(t, b, defaultSpec()), "/bin/sh", "-c", script)
}

// withHelper copies the test binary into sb as /workspace/helper.
func withHelper(t testing.TB, sb sandbox.Instance) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(context.Background(), "/workspace/helper", data, 0o755); err != nil {
		t.Fatalf("WriteFile helper: %v", err)
	}
}

// runHelperIn runs the test binary's helper mode inside sb.
func runHelperIn(t testing.TB, sb sandbox.Instance, helper string, args ...string) (sandbox.Exit, string) {
	t.Helper()
	withHelper(t, sb)
	p, err := sb.Exec(context.Background(), sandbox.Command{
		Args:        append([]string{"/workspace/helper"}, args...),
		Env:         append([]string{testHelperEnv + "=" + helper}, testEnv...),
		OutputLimit: 1 << 20,
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return finish(t, p)
}

// cgroupValue reads one file of a sandbox's cgroup.
func cgroupValue(t testing.TB, dir, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("read cgroup: %v", err)
	}
	return strings.TrimSpace(string(data))
}

func stateOf(t testing.TB, sb *sbox) sandboxState {
	t.Helper()
	st, err := sb.b.state(sb.dir, sb.id)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	return st
}

// waitFor polls cond until it holds or the timeout passes: for what
// another process does (a sandbox's files, its cgroups), which sends this
// one no event.
func waitFor(timeout time.Duration, cond func() bool) bool { return testkit.Poll(timeout, cond) }

// waitKilled blocks a helper process of the tests until it is killed
// (SIGKILL, or SIGTERM).
func waitKilled() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	<-c
}

func wantContains(t testing.TB, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// listed reports whether List's result has the sandbox id.
func listed(infos []sandbox.Info, id string) bool {
	for _, in := range infos {
		if in.ID == id {
			return true
		}
	}
	return false
}
