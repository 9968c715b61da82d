//go:build linux

package handoff

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/handoff/front"
)

// clientEnv makes this test binary a client: it hands its own command
// line off (package front does, as the program starts: its C front end
// in a cgo build, its Go one in a Go build) and exits with the answer,
// or with notHanded when the command was not handed off.
const clientEnv = "HANDOFF_TEST_CLIENT"

const notHanded = 99

func TestMain(m *testing.M) {
	if os.Getenv(clientEnv) == "1" {
		fmt.Fprintln(os.Stderr, "not handed off")
		os.Exit(notHanded)
	}
	os.Exit(m.Run())
}

// testServer serves a temporary data dir with h until the test ends.
func testServer(t *testing.T, h Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "handoff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := Listen(dir, slog.New(slog.DiscardHandler))
	if err != nil || s == nil {
		t.Fatalf("Listen: %v, %v", s, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join(dir, front.SocketName)); !os.IsNotExist(err) {
			t.Errorf("the socket is left after Serve: %v", err)
		}
	})
	return dir
}

// client is this test binary as a client of dataDir's server.
func client(dataDir string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), clientEnv+"=1", "DELEGATE_DATA_DIR="+dataDir, "HANDOFF_TEST_VAR=from the client")
	return cmd
}

func exitStatus(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}

// TestHandOff: the server gets the command line, the environment, the
// working directory and the client's descriptors (its stdin read, its
// stdout and stderr written by the server), and the client exits with
// the server's status.
func TestHandOff(t *testing.T) {
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) {
		in, _ := io.ReadAll(r.Stdin)
		fmt.Fprintf(r.Stdout, "args %q var %q dir %q stdin %q", r.Args, r.Getenv("HANDOFF_TEST_VAR"), r.Dir, in)
		fmt.Fprint(r.Stderr, "on stderr")
		return 42, false
	})
	cmd := client(dir, "run", "--script", "a b")
	cmd.Dir = "/usr"
	cmd.Stdin = strings.NewReader("input\x00bytes")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code := exitStatus(t, cmd.Run())
	want := `args ["run" "--script" "a b"] var "from the client" dir "/usr" stdin "input\x00bytes"`
	if code != 42 || out.String() != want || errb.String() != "on stderr" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 42, %q, \"on stderr\"", code, out.String(), errb.String(), want)
	}
}

// TestHandOffDeclined: a declined command, a command that is not run or
// exec, and a data dir without a server all come back to the client.
func TestHandOffDeclined(t *testing.T) {
	var asked atomic.Int32 // atomic: the race detector does not see the socket between the handler and the test
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) {
		asked.Add(1)
		return 0, true
	})
	for _, c := range []struct {
		dir  string
		args []string
		asks int
	}{
		{dir, []string{"run", "--script", "true"}, 1},
		{dir, []string{"--data-dir", dir, "exec", "sbx-x", "--", "true"}, 2},
		{dir, []string{"jobs", "list"}, 2},
		{t.TempDir(), []string{"run", "--script", "true"}, 2},
		{"relative/dir", []string{"run", "--script", "true"}, 2},
	} {
		cmd := client(c.dir, c.args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if code := exitStatus(t, cmd.Run()); code != notHanded || int(asked.Load()) != c.asks {
			t.Errorf("%s %q: exit %d (stderr %q), server asked %d times; want %d, %d", c.dir, c.args, code, errb.String(), asked.Load(), notHanded, c.asks)
		}
	}
}

// TestHandOffInterrupt: a SIGINT of the client ends the context of the
// command in the server, and the client exits with what the command
// then returns.
func TestHandOffInterrupt(t *testing.T) {
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) {
		fmt.Fprintln(r.Stdout, "started")
		select {
		case <-ctx.Done():
			return 130, false
		case <-time.After(time.Minute):
			return 0, false
		}
	})
	cmd := client(dir, "exec", "sbx-x", "--", "sleep", "60")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("started\n"))
	if _, err := io.ReadFull(stdout, line); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	if code := exitStatus(t, cmd.Wait()); code != 130 || time.Since(start) > 30*time.Second {
		t.Fatalf("exit %d after %v; want 130 at once", code, time.Since(start))
	}
}

// TestHandOffRefusesOtherBinaries: a process of another binary is
// declined before its request is read (it runs the command itself).
func TestHandOffRefusesOtherBinaries(t *testing.T) {
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) {
		t.Error("a request of another binary was served")
		return 0, false
	})
	// python3 speaks the protocol as another program would.
	py := `import socket,sys,struct,array
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
body=struct.pack('<I',1)+struct.pack('<I',3)+b'run'+struct.pack('<I',0)+struct.pack('<I',0)
s.sendmsg([b'DLGH\x01'+struct.pack('<I',len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i',[0,1,2]))])
s.sendall(body); print(s.recv(5))`
	out, err := exec.Command("python3", "-c", py, filepath.Join(dir, front.SocketName)).CombinedOutput()
	if err != nil {
		t.Skipf("python3: %v %s", err, out)
	}
	if strings.TrimSpace(string(out)) != "b'D'" {
		t.Fatalf("answer %s; want b'D'", out)
	}
}

// TestSocketMode: the socket is its owner's alone, and a second server
// of the same data dir leaves it to the first.
func TestSocketMode(t *testing.T) {
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) { return 0, true })
	fi, err := os.Stat(filepath.Join(dir, front.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v; want a socket, 0600", fi.Mode())
	}
	s, err := Listen(dir, slog.New(slog.DiscardHandler))
	if s != nil || err != nil {
		t.Errorf("a second Listen: %v, %v; want nil, nil", s, err)
	}
}

// TestHandOffRefusesServersOfAnotherUID: a socket in the data dir that a
// process of another uid listens on (a data dir others may write to) is
// not handed the command (nor the client's environment and terminal):
// the client runs it itself.
func TestHandOffRefusesServersOfAnotherUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to listen as another uid")
	}
	// Not t.TempDir: its parent is root's alone.
	dir, err := os.MkdirTemp("", "handoff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	// python3, as nobody, answers any request with exit status 7.
	py := `import os,socket,sys,struct
os.setgid(65534); os.setuid(65534)
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print('ready',flush=True)
c,_=s.accept(); c.recv(1<<20); c.sendall(b'X'+struct.pack('<i',7)); c.close()`
	srv := exec.Command("python3", "-c", py, filepath.Join(dir, front.SocketName))
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Skipf("python3: %v", err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	ready := make([]byte, len("ready\n"))
	if _, err := io.ReadFull(out, ready); err != nil {
		t.Fatalf("the other uid's server: %v", err)
	}
	cmd := client(dir, "run", "--script", "true")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if code := exitStatus(t, cmd.Run()); code != notHanded {
		t.Fatalf("exit %d (stderr %q); want %d: the command was handed to uid 65534", code, errb.String(), notHanded)
	}
}

// TestServeEndsWithASilentClient: a client that connects and sends
// nothing (stopped by Ctrl-Z, say) neither holds its connection for
// ever nor keeps the server from ending.
func TestServeEndsWithASilentClient(t *testing.T) {
	dir, err := os.MkdirTemp("", "handoff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	serve := func(timeout time.Duration) (context.CancelFunc, chan error) {
		s, err := Listen(dir, slog.New(slog.DiscardHandler))
		if err != nil || s == nil {
			t.Fatalf("Listen: %v, %v", s, err)
		}
		s.requestTimeout = timeout
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, func(context.Context, *Request) (int, bool) { return 0, false }) }()
		return cancel, done
	}
	dial := func() net.Conn {
		c, err := net.Dial("unix", filepath.Join(dir, front.SocketName))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(time.Minute)) // a failure, not a hang
		return c
	}
	wait := func(done chan error) {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatal("Serve did not end with a silent client connected")
		}
	}
	// Past its time, the server declines a silent client and hangs up.
	cancel, done := serve(100 * time.Millisecond)
	answer, err := io.ReadAll(dial())
	if string(answer) != "D" || err != nil {
		t.Errorf("a silent client was answered %q, %v; want \"D\" and the end", answer, err)
	}
	cancel()
	wait(done)
	// One half-way through its header when the server stops.
	cancel, done = serve(time.Hour)
	c := dial()
	c.Write([]byte("DLG"))
	// A second client answered: the first's request is being read.
	c2 := dial().(*net.UnixConn)
	body := front.EncodeBody([]string{"run"}, nil, "/")
	if _, _, err := c2.WriteMsgUnix(append(front.Header(len(body)), body...), syscall.UnixRights(0, 1, 2), nil); err != nil {
		t.Fatal(err)
	}
	if answer, err := io.ReadAll(c2); len(answer) != 5 || answer[0] != front.FrameExit {
		t.Fatalf("a whole request was answered %q, %v", answer, err)
	}
	cancel()
	wait(done)
}

// TestListenFollowsNoLink: a link left as the lock file (by whoever could
// write the data dir) does not have the server create, or lock, the file
// it names.
func TestListenFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "nologin")
	if err := os.Symlink(target, filepath.Join(dir, lockName)); err != nil {
		t.Fatal(err)
	}
	s, err := Listen(dir, slog.New(slog.DiscardHandler))
	if s != nil {
		s.Close()
	}
	if _, serr := os.Lstat(target); !os.IsNotExist(serr) {
		t.Errorf("Listen (%v, %v) made %s through the link: %v", s, err, target, serr)
	}
	if err == nil || !strings.Contains(err.Error(), lockName) {
		t.Errorf("Listen: %v; want an error naming %s", err, lockName)
	}
}

// TestHandOffRefusesOtherMountNamespaces: a client of the server's uid
// and binary that sees another filesystem (another mount namespace: a
// container, a confined application, a private /tmp) is declined and
// runs the command itself, where its paths (--file /tmp/x, its working
// directory) mean what it sees, not what the server would read.
func TestHandOffRefusesOtherMountNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	dir := testServer(t, func(ctx context.Context, r *Request) (int, bool) {
		t.Error("a client of another mount namespace was served")
		return 0, false
	})
	cmd := client(dir, "run", "--script", "true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if code := exitStatus(t, cmd.Run()); code != notHanded {
		t.Fatalf("exit %d (stderr %q); want %d", code, errb.String(), notHanded)
	}
}
