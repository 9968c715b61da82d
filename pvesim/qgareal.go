package pvesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// The real QEMU guest agent. Where Debian's qemu-guest-agent is
// installed, each guest runs qemu-ga itself, inside its sandbox, listening
// on a unix socket in the guest's qgaDir (-m unix-listen), and the
// simulator speaks QGA's JSON protocol to it as qemu-server's QMPClient
// does through QEMU's chardev (src/PVE/QMPClient.pm: guest-sync-delimited
// before each command, one command at a time, a time-out per command).
// Exec, exec-status (output capture, out-truncated), the file calls,
// ping, info and the blocklist (-b) are then the real agent's.
//
// The sandbox's one command is guestInit, a small service manager: it
// runs qemu-ga in a process group of its own and starts it again when it
// ends, as systemd restarts qemu-guest-agent.service. RestartAgent kills
// that process group, which is what the simulator has instead of the
// service's cgroup: what qemu-ga started dies with it unless it left the
// group (setsid).

// qgaBinary finds qemu-ga on the host, where the guests' sandboxes see it
// too (they mount the host's /usr, /bin, /sbin): "" when it is missing.
func qgaBinary() string {
	if runtime.GOOS != "linux" {
		return ""
	}
	for _, p := range []string{"/usr/sbin/qemu-ga", "/usr/bin/qemu-ga", "/usr/local/sbin/qemu-ga", "/usr/local/bin/qemu-ga"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath("qemu-ga"); err == nil && strings.HasPrefix(p, "/usr/") {
		return p
	}
	return ""
}

var qgaVersionRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`QEMU Guest Agent (\S+)`) })

// qgaVersion is what `qemu-ga --version` says of itself.
func qgaVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return ""
	}
	if m := qgaVersionRe().FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

// guestInit keeps qemu-ga running in the guest. $1 is qemu-ga, $2 the
// commands it blocks ("" for none). The agent's pid (its process group's
// id) is in agent.pid; a file "stop" ends the loop.
const guestInit = `bin=$1 block=$2
Q=` + qgaDir + `
umask 022
` + varScript + `
mkdir -p "$Q/state" || exit 1
while :; do
  rm -f "$Q/sock"
  if [ -n "$block" ]; then
    setsid "$bin" -m unix-listen -p "$Q/sock" -t "$Q/state" -f "$Q/qemu-ga.pid" -b "$block" &
  else
    setsid "$bin" -m unix-listen -p "$Q/sock" -t "$Q/state" -f "$Q/qemu-ga.pid" &
  fi
  echo $! > "$Q/agent.pid.t" && mv -f "$Q/agent.pid.t" "$Q/agent.pid"
  wait $!
  [ -e "$Q/stop" ] && exit 0
  sleep 0.05
done
`

// qgaReal is the connection to one guest's qemu-ga.
type qgaReal struct {
	sb   sandbox.Instance
	proc sandbox.Process
	dir  *os.File // the guest's qgaDir on the host (O_PATH)
	done chan struct{}
	// sem holds the one command in flight: QEMU's chardev serves one
	// client at a time.
	sem  chan struct{}
	conn net.Conn
	rd   *bufio.Reader
	sync atomic.Int64
}

var _ guestAgent = (*qgaReal)(nil)

// startRealAgent starts guestInit in sb, whose workspace is hostWS on
// this host, and waits for qemu-ga's socket.
func startRealAgent(ctx context.Context, sb sandbox.Instance, hostWS, bin string, blocked []string) (*qgaReal, error) {
	proc, err := sb.Exec(ctx, sandbox.Command{
		Args:        []string{"/bin/sh", "-c", guestInit, "guest-init", bin, strings.Join(blocked, ",")},
		Env:         agentEnv,
		Dir:         "/workspace",
		OutputLimit: 64 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("start guest agent: %w", err)
	}
	a := &qgaReal{sb: sb, proc: proc, done: make(chan struct{}), sem: make(chan struct{}, 1)}
	go func() {
		proc.Wait(context.Background())
		close(a.done)
	}()
	fail := func(err error) (*qgaReal, error) {
		if a.dir != nil {
			a.dir.Close()
		}
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a.dir == nil {
			if f, err := os.OpenFile(filepath.Join(hostWS, strings.TrimPrefix(qgaDir, "/workspace/")), dirFlags, 0); err == nil {
				a.dir = f
			}
		}
		if a.dir != nil {
			if _, err := os.Stat(a.sockPath()); err == nil {
				return a, nil
			}
		}
		if a.exited() {
			outs, _ := proc.ReadOutput(ctx, 0, 4096)
			return fail(fmt.Errorf("guest agent ended at start: %s", strings.TrimSpace(string(sandbox.Join(outs)))))
		}
		if time.Now().After(deadline) {
			return fail(errors.New("qemu-ga did not listen within 10s"))
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// sockPath reaches the socket through the directory's descriptor: the
// host path of a sandbox's workspace may be longer than a socket address
// holds (108 bytes).
func (a *qgaReal) sockPath() string {
	return fmt.Sprintf("/proc/self/fd/%d/sock", a.dir.Fd())
}

func (a *qgaReal) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func (a *qgaReal) close() {
	select {
	case a.sem <- struct{}{}:
		if a.conn != nil {
			a.conn.Close()
			a.conn = nil
		}
		<-a.sem
	case <-time.After(time.Second):
	}
	if a.dir != nil {
		a.dir.Close()
	}
}

// qgaError is an error answer of qemu-ga: {"error": {"class", "desc"}}.
type qgaError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// cmd sends one command and decodes its "return" into out, within
// timeout (the wait for the chardev included), like QMPClient: a
// time-out is errAgentTimeout, an error answer an agentError. The
// connection is synchronised first (guest-sync-delimited): an answer a
// timed-out command left behind is skipped.
func (a *qgaReal) cmd(ctx context.Context, timeout time.Duration, execute string, args map[string]any, out any) error {
	deadline := time.Now().Add(timeout)
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	select {
	case a.sem <- struct{}{}:
	case <-wait.C:
		return errAgentTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-a.sem }()
	if a.conn == nil {
		// The agent may be restarting: its socket comes back.
		for {
			c, err := net.Dial("unix", a.sockPath())
			if err == nil {
				a.conn, a.rd = c, bufio.NewReader(c)
				break
			}
			if a.exited() || time.Now().After(deadline) {
				return errAgentTimeout
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	stop := context.AfterFunc(ctx, func() { a.conn.SetDeadline(time.Now()) })
	defer stop()
	a.conn.SetDeadline(deadline)
	raw, err := a.roundTrip(execute, args)
	if err != nil {
		a.conn.Close()
		a.conn = nil
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errAgentTimeout
		}
		return err
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
		Error  *qgaError       `json:"error"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return fmt.Errorf("qemu-ga answered %q: %w", raw, err)
	}
	if resp.Error != nil {
		return &agentError{desc: resp.Error.Desc}
	}
	if out != nil {
		if err := json.Unmarshal(resp.Return, out); err != nil {
			return fmt.Errorf("qemu-ga's answer to %s: %w", execute, err)
		}
	}
	return nil
}

// roundTrip synchronises and sends one command, returning its answer.
func (a *qgaReal) roundTrip(execute string, args map[string]any) ([]byte, error) {
	id := a.sync.Add(1) + int64(os.Getpid())<<20
	if err := a.send("guest-sync-delimited", map[string]any{"id": id}); err != nil {
		return nil, err
	}
	// The answer follows a 0xFF byte, which resets qemu-ga's parser;
	// anything before it is stale.
	for {
		if _, err := a.rd.ReadBytes(0xFF); err != nil {
			return nil, err
		}
		line, err := a.rd.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var sync struct {
			Return int64 `json:"return"`
		}
		if json.Unmarshal(line, &sync) == nil && sync.Return == id {
			break
		}
	}
	if err := a.send(execute, args); err != nil {
		return nil, err
	}
	return a.rd.ReadBytes('\n')
}

func (a *qgaReal) send(execute string, args map[string]any) error {
	msg := map[string]any{"execute": execute}
	if args != nil {
		msg["arguments"] = args
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(msg); err != nil {
		return err
	}
	_, err := a.conn.Write(buf.Bytes())
	return err
}

// QMPClient's time-outs: guest-ping in assert_agent_available 3 s, the
// other guest commands 5 s (src/PVE/QMPClient.pm cmd, src/PVE/QemuServer/
// Agent.pm qga_check_running).
const qgaCmdTimeout = 5 * time.Second

func (a *qgaReal) ping(ctx context.Context, timeout time.Duration) error {
	return a.cmd(ctx, timeout, "guest-ping", nil, nil)
}

func (a *qgaReal) exec(ctx context.Context, argv []string, input []byte) (int, error) {
	args := map[string]any{"path": argv[0], "capture-output": true}
	if len(argv) > 1 {
		args["arg"] = argv[1:]
	}
	if input != nil {
		args["input-data"] = base64.StdEncoding.EncodeToString(input)
	}
	var res struct {
		PID int `json:"pid"`
	}
	if err := a.cmd(ctx, qgaCmdTimeout, "guest-exec", args, &res); err != nil {
		return 0, err
	}
	return res.PID, nil
}

func (a *qgaReal) execStatus(ctx context.Context, pid int) (execStatus, error) {
	var res struct {
		Exited       bool   `json:"exited"`
		ExitCode     *int   `json:"exitcode"`
		Signal       *int   `json:"signal"`
		OutData      string `json:"out-data"`
		ErrData      string `json:"err-data"`
		OutTruncated bool   `json:"out-truncated"`
		ErrTruncated bool   `json:"err-truncated"`
	}
	if err := a.cmd(ctx, qgaCmdTimeout, "guest-exec-status", map[string]any{"pid": pid}, &res); err != nil {
		return execStatus{}, err
	}
	st := execStatus{Exited: res.Exited, ExitCode: res.ExitCode, Signal: res.Signal,
		OutTruncated: res.OutTruncated, ErrTruncated: res.ErrTruncated}
	var err error
	if st.Out, err = base64.StdEncoding.DecodeString(res.OutData); err != nil {
		return st, fmt.Errorf("qemu-ga: out-data: %w", err)
	}
	if st.Err, err = base64.StdEncoding.DecodeString(res.ErrData); err != nil {
		return st, fmt.Errorf("qemu-ga: err-data: %w", err)
	}
	return st, nil
}

// openFile is guest-file-open; the caller closes the handle.
func (a *qgaReal) openFile(ctx context.Context, path, mode string) (int64, error) {
	var h int64
	err := a.cmd(ctx, qgaCmdTimeout, "guest-file-open", map[string]any{"path": path, "mode": mode}, &h)
	return h, err
}

func (a *qgaReal) closeFile(ctx context.Context, h int64) error {
	return a.cmd(ctx, qgaCmdTimeout, "guest-file-close", map[string]any{"handle": h}, nil)
}

// fileRead is PVE's file-read: open, seek, read in 1 MiB chunks until
// count or the end of the file, close (src/PVE/API2/Qemu/Agent.pm).
func (a *qgaReal) fileRead(ctx context.Context, path string, offset, count int64) ([]byte, bool, error) {
	h, err := a.openFile(ctx, path, "r")
	if err != nil {
		return nil, false, err
	}
	defer a.closeFile(context.WithoutCancel(ctx), h)
	if offset > 0 {
		if err := a.cmd(ctx, qgaCmdTimeout, "guest-file-seek", map[string]any{"handle": h, "offset": offset, "whence": "set"}, nil); err != nil {
			return nil, false, err
		}
	}
	var data []byte
	eof := false
	for int64(len(data)) < count && !eof {
		var res struct {
			Count int    `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if err := a.cmd(ctx, qgaCmdTimeout, "guest-file-read", map[string]any{"handle": h, "count": min(count-int64(len(data)), 1<<20)}, &res); err != nil {
			return nil, false, err
		}
		chunk, err := base64.StdEncoding.DecodeString(res.Buf)
		if err != nil {
			return nil, false, fmt.Errorf("qemu-ga: buf-b64: %w", err)
		}
		data = append(data, chunk...)
		eof = res.EOF
		if res.Count == 0 && !eof {
			break // a FIFO with nothing to read: qemu-ga's file is non-blocking
		}
	}
	return data, eof, nil
}

// fileWrite is PVE's file-write: open "wb", write, close.
func (a *qgaReal) fileWrite(ctx context.Context, path string, data []byte) error {
	h, err := a.openFile(ctx, path, "wb")
	if err != nil {
		return err
	}
	werr := a.cmd(ctx, qgaCmdTimeout, "guest-file-write", map[string]any{"handle": h, "buf-b64": base64.StdEncoding.EncodeToString(data)}, nil)
	cerr := a.closeFile(ctx, h)
	return errors.Join(werr, cerr)
}

func (a *qgaReal) info(ctx context.Context) (map[string]any, error) {
	var res map[string]any
	err := a.cmd(ctx, qgaCmdTimeout, "guest-info", nil, &res)
	return res, err
}

// restart kills the agent's process group, as stopping its service
// would; guestInit starts it again.
func (a *qgaReal) restart(ctx context.Context) error {
	pid, err := a.exec(ctx, []string{"/bin/sh", "-c", `sleep 0.05; kill -s TERM -- "-$(cat "$0")"`, qgaDir + "/agent.pid"}, nil)
	if err != nil {
		return err
	}
	_ = pid
	return nil
}
