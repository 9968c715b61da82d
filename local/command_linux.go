//go:build linux

package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A command of a kept sandbox (keeper_linux.go tells the whole): its
// process in the sandbox between init's fork and the job (runExec), and
// its shim on the host (runCommandShim), which sends its request
// (sendRequest), keeps its output and records its end; command_linux.c
// has the same for the C helpers.

// runExec is a kept sandbox's command between init's fork and the job
// (the Go helpers; the C init does the same in its fork): in its own
// session, it places itself in its cgroup, waits for its shim's
// go-ahead, takes its plan's steps (the seccomp filter last) on this
// thread, drops to the job's user and executes the job from this thread.
// A step that fails is reported on ctl, and written to the job's stderr.
func runExec() int {
	runtime.LockOSThread() // never unlocked: this thread executes the job
	report := func(code int, err error) int {
		fmt.Fprintf(os.Stderr, "%s%v\n", setupPrefix, err)
		unix.Sendmsg(execCtlFD, initStatus{Code: code, Reason: err.Error()}.encode(), nil, nil, unix.MSG_NOSIGNAL)
		return code
	}
	if os.Getppid() != 1 {
		fmt.Fprintf(os.Stderr, "%s%s is internal: it runs only as a command of a kept sandbox\n", setupPrefix, execCommand)
		return codeSetupFailed
	}
	data, err := io.ReadAll(io.NewSectionReader(os.NewFile(execPlanFD, "plan"), 0, maxPlanBytes+1))
	unix.Close(execPlanFD)
	if err != nil {
		return report(codeSetupFailed, fmt.Errorf("read the plan: %w", err))
	}
	p, err := unmarshalPlan(data)
	if err == nil && (p.Mode != modeCommand || len(p.Args) == 0 || p.Args[0] == "") {
		err = errors.New("not the plan of a command")
	}
	if err != nil {
		return report(codeSetupFailed, err)
	}
	if _, err := unix.FcntlInt(execCgroupFD, unix.F_GETFD, 0); err == nil {
		_, err := unix.Write(execCgroupFD, []byte("0"))
		unix.Close(execCgroupFD)
		if err != nil {
			return report(codeSetupFailed, fmt.Errorf("place the command in its cgroup: %w", err))
		}
	}
	if err := unix.Sendmsg(execCtlFD, []byte{ctlPlaced}, nil, nil, unix.MSG_NOSIGNAL); err != nil {
		return codeSetupFailed // the shim is gone
	}
	var answer [1]byte
	if n, _ := unix.Read(execCtlFD, answer[:]); n != 1 || answer[0] != ctlGo {
		// Killed before it started (or its shim is gone).
		unix.Kill(os.Getpid(), unix.SIGKILL)
		return 128 + int(unix.SIGKILL)
	}
	if err := closeOnExecFrom3(); err != nil {
		return report(codeSetupFailed, err)
	}
	if err := runOps(p.Ops, p.Seccomp); err != nil {
		return report(codeSetupFailed, err)
	}
	path, code, err := commandPath(p)
	if err != nil {
		return report(code, err)
	}
	if p.Stdin != "" {
		in, err := unix.Open(p.Stdin, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Dup3(in, 0, 0)
			unix.Close(in)
		}
		if err != nil {
			return report(codeSetupFailed, fmt.Errorf("standard input %s: %w", p.Stdin, err))
		}
	}
	// This thread's credentials and working directory are the job's: a
	// thread's own, not the process's (the runtime's other threads end
	// at the exec). Leaving uid 0 clears every capability.
	id := uintptr(p.JobID)
	for _, c := range []struct {
		name string
		nr   uintptr
		args [3]uintptr
	}{
		{"setgroups", unix.SYS_SETGROUPS, [3]uintptr{0, 0, 0}},
		{"setresgid", unix.SYS_SETRESGID, [3]uintptr{id, id, id}},
		{"setresuid", unix.SYS_SETRESUID, [3]uintptr{id, id, id}},
	} {
		if _, _, e := unix.RawSyscall(c.nr, c.args[0], c.args[1], c.args[2]); e != 0 {
			return report(codeSetupFailed, fmt.Errorf("become the job's user: %s: %w", c.name, e))
		}
	}
	if err := unix.Chdir(p.Dir); err != nil {
		return report(codeCannotExec, fmt.Errorf("working directory %s: %w", p.Dir, err))
	}
	return report(execFailed(p, unix.Exec(path, p.Args, p.Env)))
}

// runCommandShim supervises one command of a kept sandbox (the Go
// helper; command_linux.c has the C one): it asks the sandbox's init for
// the command, lets it go once it is in its cgroup (unless Kill came
// first), keeps its output and status lines, enforces its deadline (its
// own processes only), records its end in exit.json as soon as init
// reports it, and stays while what the command left in the background
// holds its output open. Its working directory is the command's.
func runCommandShim(log *slog.Logger, p *plan, planFile *os.File) int {
	notify := os.NewFile(serverFD, "recorded")
	syscall.CloseOnExec(serverFD)
	w := &outputWriter{limit: p.OutputLimit}
	if w.limit <= 0 {
		w.limit = DefaultOutputLimit
	}
	defer w.close()
	finish := func(rec exitRecord) int {
		err := writeJSONAtomic(fileExit, rec)
		if notify != nil {
			notify.Close() // the server's Wait wakes up
			notify = nil
		}
		if err != nil {
			log.Error("shim cannot record the exit status", "err", err)
			return 1
		}
		return 0
	}
	fail := func(err error) int { return finish(w.failed(err, log)) }

	var outP, errP [2]int
	if err := unix.Pipe2(outP[:], unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("pipe: %w", err))
	}
	if err := unix.Pipe2(errP[:], unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("pipe: %w", err))
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("socket pair: %w", err))
	}
	ctl := pair[0]
	if err := unix.SetsockoptInt(ctl, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		return fail(fmt.Errorf("socket pair: %w", err))
	}
	// Its own cgroup, below the sandbox's; where none can be made the
	// command is told apart by its process group (its session) alone.
	// In cgroup v1 the keeper gives it one (relay), the request names the
	// command for that.
	cgDir := p.Cgroup.commandGroup(p.ExecID)
	cg := -1
	named := p.Cgroup.Version == 1 && execIDPattern().MatchString(p.ExecID)
	if !named {
		var err error
		if cg, err = commandGroupFD(cgDir); err != nil {
			log.Warn("no cgroup of the command's own", "err", err)
			cg, cgDir = -1, ""
		}
	}
	ooms, _ := p.Cgroup.oomKills() // the sandbox's so far: only new ones are this command's
	bridge, err := startStatusBridge(p.Channel)
	if err != nil {
		log.Warn("status channel", "err", err)
	}
	defer func() {
		bridge.stop()
		os.Remove(p.Channel)
		if cgDir != "" {
			unix.Rmdir(cgDir) // only once empty: what it left behind keeps it
		}
	}()

	head := make([]byte, 8)
	binary.NativeEndian.PutUint32(head, requestMagic)
	fds := []int{int(planFile.Fd()), outP[1], errP[1], pair[1]}
	switch {
	case cg >= 0:
		binary.NativeEndian.PutUint32(head[4:], requestCgroup)
		fds = append(fds, cg)
	case named:
		binary.NativeEndian.PutUint32(head[4:], requestID)
		head = append(head, p.ExecID...)
	}
	sendErr := sendRequest(head, fds)
	for _, fd := range fds[1:] {
		unix.Close(fd)
	}
	planFile.Close()
	if sendErr != nil {
		unix.Close(outP[0])
		unix.Close(errP[0])
		return fail(fmt.Errorf("the sandbox is gone: its init takes no command (%w)", sendErr))
	}
	copied := make(chan struct{})
	go func() {
		copyOutput(w, outP[0], errP[0], log)
		close(copied)
	}()

	// What comes on ctl: the command placed (with its pid), reports.
	type message struct {
		data []byte
		pid  int
	}
	msgs := make(chan message)
	go func() {
		defer close(msgs)
		for {
			buf := make([]byte, 64<<10)
			oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
			n, oobn, _, _, err := unix.Recvmsg(ctl, buf, oob, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || n == 0 {
				return // every end of the command's socket is closed
			}
			m := message{data: buf[:n]}
			if _, cred := parseControl(oob[:oobn]); cred != nil {
				m.pid = int(cred.Pid)
			}
			msgs <- m
		}
	}()
	killed := func() bool {
		_, err := os.Stat(fileKilled)
		return err == nil
	}
	var (
		jobPID      int // the command's host pid, once it is placed
		deadlineHit atomic.Bool
		deadline    <-chan time.Time
	)
	if d := p.deadlineTime(); !d.IsZero() {
		t := time.NewTimer(time.Until(d))
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-deadline:
			// The backstop for a command that no server watches: its own
			// processes, not the sandbox's others.
			deadline = nil
			deadlineHit.Store(true)
			os.WriteFile(fileKilled, nil, 0o600)
			if p.Cgroup.frozen() {
				// Paused: thawed until the end is recorded (init, which
				// reaps the command and reports, is frozen too).
				p.Cgroup.thaw()
				defer p.Cgroup.freeze(5 * time.Second)
			}
			p.Cgroup.killCommand(p.ExecID, jobPID)
			continue
		case m, ok := <-msgs:
			if ok && len(m.data) == 1 && (m.data[0] == ctlPlaced || m.data[0] == ctlPlacedAhead) && jobPID == 0 {
				// Kill writes its marker before it kills what is in the
				// command's group: either it sees the command there now,
				// or the command never goes.
				jobPID = m.pid
				if cgDir == "" { // one with a group is killed through it (killExec)
					writePIDFile(fileJobPID, jobPID)
				}
				if m.data[0] == ctlPlaced {
					answer := byte(ctlGo)
					if killed() || deadlineHit.Load() {
						answer = ctlKilled
					}
					unix.Sendmsg(ctl, []byte{answer}, nil, nil, unix.MSG_NOSIGNAL)
				}
				continue
			}
			var rec exitRecord
			if ok {
				// The command's end, or why it could not start (the first
				// report: init's report after it is the same end again).
				w.quiet(copied, [2]int{outP[0], errP[0]})
				bridge.flush()
				rec = p.record(w, m.data, nil, nil, deadlineHit.Load(), log)
			} else {
				// Nobody holds the command's socket any more without a
				// word: init has ended (the sandbox was destroyed, or its
				// lifetime is over), and every process of it with it.
				<-copied
				rec = p.record(w, nil, nil, errors.New("the sandbox ended before the command did"), deadlineHit.Load(), log)
				rec.Code, rec.Signo = 128+int(unix.SIGKILL), int(unix.SIGKILL)
				if killed() {
					rec.Killed, rec.Reason = true, ""
				}
			}
			if n, err := p.Cgroup.oomKills(); err == nil {
				rec.OOMKilled = n > ooms
			}
			code := finish(rec)
			unix.Close(ctl)
			// What the command left in the background may still write: it
			// is kept (within the limit) until it closes its output.
			<-copied
			return code
		}
	}
}

// sendRequest sends a command's request, with its descriptors, to the
// keeper of the sandbox whose directory is two levels up.
func sendRequest(head []byte, fds []int) error {
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	to := &unix.SockaddrUnix{Name: filepath.Join(execUp, fileControl)}
	for {
		err = unix.Sendmsg(sock, head, unix.UnixRights(fds...), to, 0)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// killCommand kills one command of a kept sandbox: every process of its
// cgroup (if it has one), and its process group, the one of jobPID (0:
// none). It returns what is still alive of the command's group. (A
// frozen sandbox's processes die once thawed: see killExec.)
func (c cgroupSet) killCommand(execID string, jobPID int) []int {
	if jobPID > 0 {
		unix.Kill(-jobPID, unix.SIGKILL)
		unix.Kill(jobPID, unix.SIGKILL)
	}
	if group := c.commandGroup(execID); dirExists(group) {
		return killGroup(group, c.Version, 2*time.Second)
	}
	return nil
}
