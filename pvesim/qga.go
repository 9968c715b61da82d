package pvesim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// The emulated QEMU guest agent, used only where qemu-ga is not installed
// (see qgareal.go), is a POSIX shell loop running inside the VM's sandbox
// as its one command (a local sandbox runs one command; the
// agent is that command, and it starts the others). The only channel
// between the simulator and the sandbox is the sandbox's file API, which
// reaches /workspace only, so the agent keeps its spool in qgaDir:
//
//	qgaDir/q/N.OP    a request (empty file, written last); OP is ping,
//	                 exec, write, read or rm
//	qgaDir/N/...     its arguments (argv, in, path, data, count, offset)
//	qgaDir/N/ack     the agent's answer: "ok [pid]" or "err WHAT ERRNO-TEXT"
//	qgaDir/N/rc      an exec's exit status, once it ended
//	qgaDir/N/out,err an exec's stdout and stderr; a read's data in out
//
// Files are read and written by the agent, in the guest, with the guest's
// permissions, so /tmp, /workspace and any path the guest may write work
// exactly as the commands the guest runs see them.
const qgaDir = "/workspace/.qga"

// varScript makes, at the guest's boot, the directories of /var that a
// Debian guest has on its root disk (as systemd-tmpfiles' var.conf and
// the packages do): /var/tmp (1777) among them, where programs keep
// temporary files too big for /tmp (a tmpfs on Debian 13). /var is on
// the guest's disk (sandbox.Spec.DiskVar); where it is not writable (a
// backend without DiskVar) the guest has what its root gives.
const varScript = `mkdir -p /var/tmp /var/lib /var/cache /var/log /var/spool 2>/dev/null && chmod 1777 /var/tmp 2>/dev/null`

// agentScript is the guest agent. It polls for requests (the sandbox API
// has no way to wake it), runs each exec in the background like
// qemu-ga's guest-exec, and answers file requests with dd, whose error
// messages end with the errno text qemu-ga would report.
const agentScript = `
umask 022
` + varScript + `
Q=` + qgaDir + `
mkdir -p "$Q/q" || exit 1
: > "$Q/ready"
answer() { printf '%s\n' "$2" > "$1/ack.t" && mv -f "$1/ack.t" "$1/ack"; }
readpath() { f=$(cat "$1/path"; echo x); f=${f%x}; }
idle=0
while :; do
  busy=0
  for t in "$Q"/q/*; do
    [ -e "$t" ] || continue
    rm -f "$t"
    busy=1
    n=${t##*/}; op=${n#*.}; n=${n%%.*}
    d=$Q/$n
    [ "$op" = rm ] || mkdir -p "$d"
    case $op in
    ping) answer "$d" ok ;;
    rm) rm -rf "$d" ;;
    exec)
      . "$d/argv"
      p=$1; found=
      case $p in
      */*) [ -f "$p" ] && found=$p ;;
      *) set -f; IFS=:; for dir in $PATH; do [ -f "$dir/$p" ] && { found=$dir/$p; break; }; done; unset IFS; set +f ;;
      esac
      if [ -z "$found" ]; then answer "$d" "err spawn ENOENT"
      elif [ ! -x "$found" ]; then answer "$d" "err spawn EACCES"
      else
        if [ -f "$d/in" ]; then i=$d/in; else i=/dev/null; fi
        { ( cd / && exec "$@" ) < "$i" > "$d/out" 2> "$d/err"; echo $? > "$d/rc.t"; mv -f "$d/rc.t" "$d/rc"; } &
        answer "$d" "ok $!"
      fi ;;
    write)
      readpath "$d"
      if e=$(dd if="$d/data" of="$f" bs=65536 status=none 2>&1); then rm -f "$d/data"; answer "$d" ok
      else answer "$d" "err open ${e##*: }"; fi ;;
    read)
      readpath "$d"; c=$(cat "$d/count"); o=$(cat "$d/offset")
      if e=$(dd if="$f" of="$d/out" bs=65536 iflag=skip_bytes,count_bytes skip="$o" count="$c" status=none 2>&1); then answer "$d" ok
      else case $e in *"failed to open"*) w=open ;; *) w=read ;; esac; answer "$d" "err $w ${e##*: }"; fi ;;
    esac
  done
  if [ $busy = 1 ]; then idle=0; else idle=$((idle + 1)); fi
  if [ $idle -lt 50 ]; then sleep 0.01; else sleep 0.05; fi
done
`

// agentEnv is the agent's environment, which the commands it runs inherit
// (qemu-ga passes its own, as systemd set it up).
var agentEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG=C.UTF-8",
}

// errAgentTimeout: the agent did not answer in time (qemu's QMP timeout).
var errAgentTimeout = errors.New("got timeout")

// agentError is an error the guest agent itself reported.
type agentError struct{ desc string }

func (e *agentError) Error() string { return "Agent error: " + e.desc }

// qga talks to the emulated agent of one running guest.
type qga struct {
	sb   sandbox.Instance
	proc sandbox.Process
	next atomic.Int64
	// blocked are the commands it refuses, as qemu-ga -b does.
	blocked []string
	// execs maps an exec's pid to its request number, until exec-status
	// reports it ended (then qemu-ga forgets it, and so do we).
	mu    sync.Mutex
	execs map[int]int64
	done  chan struct{} // closed when the agent process ended
}

var _ guestAgent = (*qga)(nil)

// startAgent runs the agent loop in sb and waits until it is ready.
func startAgent(ctx context.Context, sb sandbox.Instance, blocked []string) (*qga, error) {
	proc, err := sb.Exec(ctx, sandbox.Command{
		Args:        []string{"/bin/sh", "-c", agentScript},
		Env:         agentEnv,
		Dir:         "/workspace",
		OutputLimit: 64 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("start guest agent: %w", err)
	}
	a := &qga{sb: sb, proc: proc, execs: map[int]int64{}, done: make(chan struct{}), blocked: blocked}
	go func() {
		proc.Wait(context.Background())
		close(a.done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := sb.ReadFile(ctx, qgaDir+"/ready", 0, 1); err == nil {
			return a, nil
		}
		if a.exited() {
			outs, _ := proc.ReadOutput(ctx, 0, 4096)
			out := sandbox.Join(outs)
			return nil, fmt.Errorf("guest agent ended at start: %s", strings.TrimSpace(string(out)))
		}
		if time.Now().After(deadline) {
			return nil, errors.New("guest agent did not start within 10s")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (a *qga) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func (a *qga) close() {}

// refuse is qemu-ga's answer to a command it blocks (qga/main.c,
// qapi/qmp-dispatch.c of QEMU 7.2).
func (a *qga) refuse(cmd string) error {
	if slices.Contains(a.blocked, cmd) {
		return &agentError{desc: fmt.Sprintf("Command %s has been disabled", cmd)}
	}
	return nil
}

// restart is not emulated: the agent is the sandbox's one process.
func (a *qga) restart(ctx context.Context) error {
	return errors.New("the emulated guest agent cannot restart (install qemu-guest-agent for the real one)")
}

// emulatedCommands are the commands the emulation answers.
var emulatedCommands = []string{"guest-exec", "guest-exec-status", "guest-file-close", "guest-file-open", "guest-file-read",
	"guest-file-write", "guest-info", "guest-network-get-interfaces", "guest-ping", "guest-sync", "guest-sync-delimited"}

// info is guest-info.
func (a *qga) info(ctx context.Context) (map[string]any, error) {
	var cmds []any
	for _, c := range emulatedCommands {
		cmds = append(cmds, map[string]any{"name": c, "enabled": !slices.Contains(a.blocked, c), "success-response": true})
	}
	return map[string]any{"version": "pvesim-emulation", "supported_commands": cmds}, nil
}

func (a *qga) dir(n int64) string { return fmt.Sprintf("%s/%d", qgaDir, n) }

// request writes a request's files and its trigger, then waits for the
// agent's answer.
func (a *qga) request(ctx context.Context, op string, files map[string][]byte, timeout time.Duration) (n int64, ack string, err error) {
	n = a.next.Add(1)
	d := a.dir(n)
	for name, data := range files {
		if err := a.sb.WriteFile(ctx, d+"/"+name, data, 0o644); err != nil {
			return n, "", fmt.Errorf("guest agent request: %w", err)
		}
	}
	if err := a.sb.WriteFile(ctx, fmt.Sprintf("%s/q/%d.%s", qgaDir, n, op), nil, 0o644); err != nil {
		return n, "", fmt.Errorf("guest agent request: %w", err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		data, err := a.sb.ReadFile(ctx, d+"/ack", 0, 4096)
		if err == nil && len(data) > 0 && data[len(data)-1] == '\n' {
			return n, strings.TrimSuffix(string(data), "\n"), nil
		}
		if a.exited() {
			return n, "", errAgentTimeout
		}
		select {
		case <-ctx.Done():
			return n, "", ctx.Err()
		case <-deadline.C:
			return n, "", errAgentTimeout
		case <-tick.C:
		}
	}
}

// forget asks the agent to remove a request's files (asynchronously).
func (a *qga) forget(ctx context.Context, n int64) {
	a.sb.WriteFile(ctx, fmt.Sprintf("%s/q/%d.rm", qgaDir, n), nil, 0o644)
}

// ping is guest-ping: a round trip through the agent.
func (a *qga) ping(ctx context.Context, timeout time.Duration) error {
	n, _, err := a.request(ctx, "ping", nil, timeout)
	a.forget(ctx, n)
	return err
}

// shellQuote quotes s for a POSIX shell: exact for any bytes but NUL.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// exec is guest-exec with capture-output: it starts argv (no shell) with
// input as its stdin (nil: /dev/null) and returns the pid.
func (a *qga) exec(ctx context.Context, argv []string, input []byte) (int, error) {
	if err := a.refuse("guest-exec"); err != nil {
		return 0, err
	}
	var b strings.Builder
	b.WriteString("set --")
	for _, arg := range argv {
		b.WriteString(" ")
		b.WriteString(shellQuote(arg))
	}
	b.WriteString("\n")
	files := map[string][]byte{"argv": []byte(b.String())}
	if input != nil {
		files["in"] = input
	}
	n, ack, err := a.request(ctx, "exec", files, 10*time.Second)
	if err != nil {
		a.forget(ctx, n)
		return 0, err
	}
	if what, ok := strings.CutPrefix(ack, "err spawn "); ok {
		a.forget(ctx, n)
		// glib's g_spawn message, as qemu-ga 7.2 passes it on.
		text := map[string]string{"ENOENT": "No such file or directory", "EACCES": "Permission denied"}[what]
		return 0, &agentError{desc: fmt.Sprintf("Guest agent command failed, error was 'Failed to execute child process “%s” (%s)'", argv[0], text)}
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(ack, "ok "))
	if err != nil {
		return 0, fmt.Errorf("guest agent: bad exec answer %q", ack)
	}
	a.mu.Lock()
	a.execs[pid] = n
	a.mu.Unlock()
	return pid, nil
}

// maxExecOutput is qemu-ga's GUEST_EXEC_MAX_OUTPUT: captured output
// beyond it is dropped and reported truncated.
const maxExecOutput = 16 << 20

// execStatus is what guest-exec-status returns.
type execStatus struct {
	Exited       bool
	ExitCode     *int
	Signal       *int
	Out, Err     []byte
	OutTruncated bool
	ErrTruncated bool
}

// execStatus is guest-exec-status. Once it reports a process ended, the
// agent forgets the pid, like qemu-ga.
func (a *qga) execStatus(ctx context.Context, pid int) (execStatus, error) {
	if err := a.refuse("guest-exec-status"); err != nil {
		return execStatus{}, err
	}
	a.mu.Lock()
	n, ok := a.execs[pid]
	a.mu.Unlock()
	if !ok {
		return execStatus{}, &agentError{desc: "Invalid parameter 'pid'"}
	}
	d := a.dir(n)
	rc, err := a.sb.ReadFile(ctx, d+"/rc", 0, 64)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, sandbox.ErrGone) {
			return execStatus{}, nil // still running
		}
		return execStatus{}, nil
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(rc)))
	if err != nil {
		return execStatus{}, fmt.Errorf("guest agent: bad exit status %q", rc)
	}
	st := execStatus{Exited: true}
	// The shell reports death by signal N as 128+N; qemu-ga reports the
	// signal. Codes 129..192 are ambiguous here (see the package doc).
	if code > 128 && code <= 128+64 {
		sig := code - 128
		st.Signal = &sig
	} else {
		st.ExitCode = &code
	}
	st.Out, st.OutTruncated = a.readCapped(ctx, d+"/out")
	st.Err, st.ErrTruncated = a.readCapped(ctx, d+"/err")
	a.mu.Lock()
	delete(a.execs, pid)
	a.mu.Unlock()
	a.forget(ctx, n)
	return st, nil
}

func (a *qga) readCapped(ctx context.Context, p string) ([]byte, bool) {
	data, err := a.sb.ReadFile(ctx, p, 0, maxExecOutput+1)
	if err != nil {
		return nil, false
	}
	if len(data) > maxExecOutput {
		return data[:maxExecOutput], true
	}
	return data, false
}

// fileWrite is guest-file-open (mode "wb") + guest-file-write: the file
// is created or truncated, as the guest's user.
func (a *qga) fileWrite(ctx context.Context, path string, data []byte) error {
	if err := a.refuse("guest-file-open"); err != nil {
		return err
	}
	n, ack, err := a.request(ctx, "write", map[string][]byte{"path": []byte(path), "data": data}, 10*time.Second)
	a.forget(ctx, n)
	if err != nil {
		return err
	}
	if errno, ok := strings.CutPrefix(ack, "err open "); ok {
		return &agentError{desc: fmt.Sprintf("failed to open file '%s' (mode: 'wb'): %s", path, errno)}
	}
	return nil
}

// fileRead reads up to count bytes from offset; it reports whether it
// reached the end of the file (it cannot tell when it read all it was
// asked for).
func (a *qga) fileRead(ctx context.Context, path string, offset, count int64) ([]byte, bool, error) {
	if err := a.refuse("guest-file-open"); err != nil {
		return nil, false, err
	}
	n, ack, err := a.request(ctx, "read", map[string][]byte{
		"path":   []byte(path),
		"count":  []byte(strconv.FormatInt(count, 10)),
		"offset": []byte(strconv.FormatInt(offset, 10)),
	}, 30*time.Second)
	defer a.forget(ctx, n)
	if err != nil {
		return nil, false, err
	}
	if errno, ok := strings.CutPrefix(ack, "err open "); ok {
		return nil, false, &agentError{desc: fmt.Sprintf("failed to open file '%s' (mode: 'r'): %s", path, errno)}
	}
	if errno, ok := strings.CutPrefix(ack, "err read "); ok {
		return nil, false, &agentError{desc: "failed to read file: " + errno}
	}
	data, err := a.sb.ReadFile(ctx, a.dir(n)+"/out", 0, count)
	if err != nil {
		return nil, false, fmt.Errorf("guest agent: read answer: %w", err)
	}
	return data, int64(len(data)) < count, nil
}
