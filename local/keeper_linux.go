//go:build linux

package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A kept sandbox (Spec.MultiExec) has one init for all its commands (the
// Go helpers here and in command_linux.go; keeper_linux.c and
// command_linux.c have the same for the C ones; doc.go tells the whole):
//
//	server → keeper (SelfExe __sandbox-shim <dir>, a plan of modeKeeper)
//	       → init (pid 1 of the sandbox, as long as the sandbox lives)
//	         → each command, forked by init
//	server → command shim (SelfExe __sandbox-shim <dir>/execs/<id>,
//	         modeCommand): its request to init, its output, its end
//	         (the C keeper, asked by the server with spawnMagic, makes
//	         the request to init itself and then starts the shim, which
//	         finds it made: no fork and exec of the server, and no
//	         shim set-up before the command starts; keeper_start in
//	         keeper_linux.c. That shim is a fork of the keeper, or the
//	         shim of an earlier command, which waits for the next once
//	         its command is recorded and its output closed: shim_idle)
//
// A command's shim sends its request as one datagram to the keeper's
// socket (fileControl in the sandbox directory, root's alone), with
// descriptors: its plan (the memfd the server wrote), the write ends of
// the command's stdout and stderr, one end of a socket pair of its own
// with the command (ctl), and the command's child cgroup's cgroup.procs,
// open for writing (cgroup v2: the shim makes the group), or the
// command's id (v1: the keeper makes the group, or names the spare's
// after the command, see spare_child in command_linux.c). The keeper
// checks that the sender is root and relays the request to init over a
// socket pair; init forks the command (or hands the request to its
// spare), which places itself in its cgroup through that descriptor,
// says so on ctl ("p"; the kernel adds its pid as the host sees it),
// waits for the shim's go-ahead ("g", or "k": killed before it
// started; a C spare, in its group ahead of the request, says "P" and
// goes on: the keeper looked for the kill marker after it named the
// spare's group after the command), takes its plan's steps (a mount
// namespace and a /run of its
// own, its inputs, the seccomp filter), drops to the job's user and
// executes the job. init reports the job's end on ctl (an initStatus),
// as the command process itself does when it cannot start.

// Descriptors of a command shim and a keeper beside their plan.
const (
	// serverFD: a keeper writes "ok" or why its sandbox could not be
	// made, then closes it; a command's shim closes it once it has
	// recorded the command's end, so that the server's Wait needs no
	// polling.
	serverFD = 5
	// The descriptors of a command's process between init's fork and its
	// exec (and of the Go helpers' __sandbox-exec): stdin, stdout and
	// stderr, then these.
	execCtlFD    = 3
	execPlanFD   = 4
	execCgroupFD = 5
)

// requestMagic starts a command's request ("DSR1"); requestCgroup says
// that the descriptor of a child cgroup is the last one; requestID that
// the command's id follows the head (cgroup v1: the keeper gives the
// command its group, see commandGroupFD); requestSpare (keeper to the C
// init) that the command is init's spare, in its group already.
const (
	requestMagic  = 0x44535231
	requestCgroup = 1
	requestID     = 2
	requestSpare  = 4
	// requestKilled (keeper to the C init, with requestSpare): the
	// command was killed before its request came; the spare ends
	// unstarted.
	requestKilled = 8
	requestFDs    = 4 // plan, stdout, stderr, ctl (and the cgroup's)
	// spareMagic ("DSS1") starts the C keeper's word to its init that
	// the next command's group is made (its cgroup.procs attached).
	spareMagic = 0x44535331
	// spawnMagic ("DSX1") starts the server's request that a C keeper
	// start a command's shim itself (a fork, no exec, or a shim that
	// waits: start_shim in keeper_linux.c), followed by the command's
	// id, with spawnFDs
	// descriptors: the plan and the server's pipe (serverFD).
	spawnMagic = 0x44535831
	spawnFDs   = 2
)

// ctlGo and ctlKilled are the shim's answers once the command has placed
// itself; ctlPlaced is the command's word that it has.
const (
	ctlPlaced = 'p'
	ctlGo     = 'g'
	ctlKilled = 'k'
	// ctlPlacedAhead is a C spare's word that it is the command, placed
	// in its group ahead of the request, and goes on without an answer:
	// the keeper checked the kill marker after it gave that group the
	// command's name, and a kill after that finds the command there.
	ctlPlacedAhead = 'P'
)

// runKeeper is a kept sandbox's supervisor (the Go helper): it starts the
// sandbox's init in the sandbox's namespaces, says on serverFD whether the
// sandbox could be made, then relays command requests from fileControl
// to init until init ends (a kill, Destroy) or p.Until, when it kills
// init, and with it every process of the sandbox.
func runKeeper(log *slog.Logger, p *plan, planData []byte) int {
	ready := os.NewFile(serverFD, "ready")
	fail := func(err error) int {
		log.Error("kept sandbox", "err", err)
		if ready != nil {
			fmt.Fprintf(ready, "%v", err)
			ready.Close()
		}
		return 1
	}
	syscall.CloseOnExec(serverFD)
	if err := closeOnExecFrom3(); err != nil {
		return fail(err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fail(fmt.Errorf("drop supplementary groups: %w", err))
	}
	ctl, err := listenControl()
	if err != nil {
		return fail(err)
	}
	defer unix.Close(ctl)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("socket pair: %w", err))
	}
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	initEnd := os.NewFile(uintptr(pair[1]), "requests")
	cmd := initCmd(devnull, devnull, devnull, []*os.File{syncR, initEnd}, p.HostIDBase, p.IDRange, false)
	// init is born in the sandbox's network namespace, which this thread
	// leaves again at once: the keeper itself stays on the host's side.
	err = startInNetns(func() error { return startAsOwner(cmd, p.HostIDBase) })
	for _, f := range []*os.File{syncR, initEnd, devnull} {
		f.Close()
	}
	if err != nil {
		syncW.Close()
		return fail(fmt.Errorf("start the sandbox init: %w", err))
	}
	pid := cmd.Process.Pid
	relErr := func() error {
		if err := writePIDFile(fileInitPID, pid); err != nil {
			return err
		}
		if err := p.Cgroup.addProc(pid); err != nil {
			return fmt.Errorf("place the sandbox in its cgroups: %w", err)
		}
		if _, err := os.Stat(fileKilled); err == nil {
			return errKilledBeforeStart
		}
		_, err := syncW.Write(planData)
		return err
	}()
	syncW.Close()
	if relErr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fail(relErr)
	}
	// init's first word: its root is built (code 0), or why not.
	buf := make([]byte, 64<<10)
	n, err := unix.Read(pair[0], buf)
	st, ok := decodeInitStatus(buf[:max(n, 0)])
	if err != nil || !ok || st.Code != 0 {
		cmd.Process.Kill()
		cmd.Wait()
		if ok {
			return fail(errors.New(st.Reason))
		}
		return fail(fmt.Errorf("the sandbox init ended while it was set up (%v)", err))
	}
	ready.Write([]byte("ok"))
	ready.Close()
	ready = nil

	ended := make(chan struct{})
	go func() {
		cmd.Wait()
		close(ended)
	}()
	go relay(log, p.Cgroup, ctl, pair[0])
	var until <-chan time.Time
	if p.Until != 0 {
		t := time.NewTimer(time.Until(time.Unix(0, p.Until)))
		defer t.Stop()
		until = t.C
	}
	select {
	case <-ended:
		log.Info("the sandbox init ended", "status", cmd.ProcessState.String())
	case <-until:
		// The sandbox's lifetime is over, server or not: init's end takes
		// every process of the sandbox along (a frozen one once thawed).
		log.Info("the sandbox's lifetime ended")
		p.Cgroup.thaw()
		cmd.Process.Kill()
		<-ended
	}
	unix.Unlink(fileControl)
	return 0
}

// listenControl makes the keeper's socket, fileControl in its working
// directory: a datagram socket that only root can send to, which asks
// the kernel for each sender's credentials.
func listenControl() (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("control socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("control socket: %w", err)
	}
	unix.Unlink(fileControl)
	old := unix.Umask(0o077)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: fileControl})
	unix.Umask(old)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("control socket: %w", err)
	}
	return fd, nil
}

// startInNetns runs start with this thread in the network namespace on
// netnsFD, and brings the thread back into its own after.
func startInNetns(start func() error) error {
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer unix.Close(own)
	if err := unix.Setns(netnsFD, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join the sandbox's network namespace: %w", err)
	}
	unix.Close(netnsFD)
	err = start()
	if serr := unix.Setns(own, unix.CLONE_NEWNET); serr != nil && err == nil {
		err = fmt.Errorf("leave the sandbox's network namespace: %w", serr)
	}
	return err
}

// relay passes each request that comes on ctl from root to init, with
// its descriptors, until ctl fails. A request that names its command
// (requestID) gets the command's group here. (The C keeper also has a
// spare command placed in its group ahead of the request: see
// spare_child in command_linux.c.)
func relay(log *slog.Logger, cg cgroupSet, ctl, init int) {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace((requestFDs+1)*4)+unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			log.Error("control socket", "err", err)
			return
		}
		fds, cred := parseControl(oob[:oobn])
		var head uint32
		if n >= 8 {
			head = binary.NativeEndian.Uint32(buf[4:])
		}
		named := head&requestID != 0 && head&requestCgroup == 0 && len(fds) == requestFDs && execIDPattern().Match(buf[8:max(n, 8)])
		switch {
		case cred == nil || cred.Uid != 0:
			log.Warn("a request not from root, dropped")
		case flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 || (n != 8 && !named) || binary.NativeEndian.Uint32(buf) != requestMagic:
			log.Warn("a malformed request, dropped")
		default:
			if named {
				head = 0
				if fd, err := commandGroupFD(cg.commandGroup(string(buf[8:n]))); err != nil {
					log.Warn("no cgroup of the command's own", "err", err)
				} else {
					fds = append(fds, fd)
					head = requestCgroup
				}
				binary.NativeEndian.PutUint32(buf[4:], head)
				n = 8
			}
			// A failure is the command's shim's to see: its socket with
			// the command closes unanswered.
			if err := unix.Sendmsg(init, buf[:n], unix.UnixRights(fds...), nil, unix.MSG_NOSIGNAL); err != nil {
				log.Warn("relay a request to the sandbox init", "err", err)
			}
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// execIDPattern is a command's id as newID makes them ("ex-" and 8 hex
// digits): the name of its group.
var execIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^ex-[0-9a-f]{8}$`) })

// commandGroupFD makes a command's group at dir and opens its
// cgroup.procs, through which the command places itself.
func commandGroupFD(dir string) (int, error) {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, err
	}
	return unix.Open(filepath.Join(dir, "cgroup.procs"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
}

// parseControl takes the descriptors and the credentials a message came
// with.
func parseControl(oob []byte) (fds []int, cred *unix.Ucred) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, nil
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET {
			continue
		}
		switch m.Header.Type {
		case unix.SCM_RIGHTS:
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		case unix.SCM_CREDENTIALS:
			if c, err := unix.ParseUnixCredentials(&m); err == nil {
				cred = c
			}
		}
	}
	return fds, cred
}

// serveCommands is a kept sandbox's init (the Go helper) once its root is
// made: it says so on requests, then starts each command that comes
// there and reports each one's end on the command's socket, reaping
// every orphan of the sandbox meanwhile, until the keeper goes.
func serveCommands(requests *os.File) int {
	req := int(requests.Fd())
	sigc := make(chan os.Signal, 64)
	signal.Notify(sigc, syscall.SIGCHLD)
	if _, err := unix.Write(req, initStatus{}.encode()); err != nil {
		return codeSetupFailed
	}
	type request struct {
		data []byte
		fds  []int
	}
	reqs := make(chan request)
	go func() {
		defer close(reqs)
		for {
			buf := make([]byte, 64)
			oob := make([]byte, unix.CmsgSpace((requestFDs+1)*4))
			n, oobn, _, _, err := unix.Recvmsg(req, buf, oob, unix.MSG_CMSG_CLOEXEC)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || n == 0 {
				return // the keeper is gone: so is the sandbox
			}
			fds, _ := parseControl(oob[:oobn])
			reqs <- request{buf[:n], fds}
		}
	}()
	running := map[int]int{} // a command's pid: its ctl
	for {
		select {
		case r, ok := <-reqs:
			if !ok {
				return 0
			}
			pid, ctl := startCommand(r.data, r.fds)
			if pid > 0 {
				running[pid] = ctl
			}
		case <-sigc:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
				if ctl, ok := running[pid]; ok {
					unix.Sendmsg(ctl, exitStatus(ws).encode(), nil, nil, unix.MSG_NOSIGNAL)
					unix.Close(ctl)
					delete(running, pid)
				}
			}
		}
	}
}

// startCommand starts the command of one request (see the top of this
// file), and returns its pid and its ctl, which init keeps for the
// command's end; 0 when it did not start (its shim is told why).
func startCommand(data []byte, fds []int) (int, int) {
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	want := requestFDs
	if len(data) == 8 && binary.NativeEndian.Uint32(data[4:])&requestCgroup != 0 {
		want++
	}
	if len(data) != 8 || binary.NativeEndian.Uint32(data) != requestMagic || len(fds) != want {
		return 0, -1 // not from a shim of ours: nobody to tell
	}
	planFD, out, errw, ctl := fds[0], fds[1], fds[2], fds[3]
	cg := -1
	if want > requestFDs {
		cg = fds[4]
	}
	// The Go runtime cannot run in a fork: the command is this binary
	// again (init's own, /proc/self/exe), which takes its steps and
	// executes the job (runExec).
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"delegate-sandbox-exec", execCommand}, &syscall.ProcAttr{
		Env:   helperEnv(false),
		Files: []uintptr{0, uintptr(out), uintptr(errw), uintptr(ctl), uintptr(planFD), uintptr(cg)},
		// A session (and process group) of its own: what the command
		// starts is told apart from the other commands' by it too.
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		msg := fmt.Sprintf("start the command: %v", err)
		unix.Write(errw, []byte(setupPrefix+msg+"\n"))
		unix.Sendmsg(ctl, initStatus{Code: codeSetupFailed, Reason: msg}.encode(), nil, nil, unix.MSG_NOSIGNAL)
		return 0, -1
	}
	fds[3] = -1 // kept, for the report
	return pid, ctl
}
