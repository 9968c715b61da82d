//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// initCloneFlags are the namespaces init is born in.
const initCloneFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
	syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// The shim's descriptors: the plan (plan.go) and, for a C shim whose
// plan says Netns, the network namespace to join.
const (
	planFD  = 3
	netnsFD = 4
)

// errKilledBeforeStart: Kill came before the job was released.
var errKilledBeforeStart = errors.New("killed before start")

// initCmd prepares init: the shim's own binary (through /proc/self/exe,
// which needs no search permission on the directories above it, unlike
// SelfExe's path for an unprivileged uid), in fresh namespaces, as uid 0
// of a user namespace mapped to an unprivileged host range (hostID and
// size: the plan's; the probe has none and uses the defaults).
func initCmd(stdin, stdout, stderr *os.File, extra []*os.File, hostID, size uint32, newNet bool, args ...string) *exec.Cmd {
	flags := uintptr(initCloneFlags)
	if !newNet {
		flags &^= syscall.CLONE_NEWNET // joined by the shim already
	}
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(hostID), Size: int(size)}}
	return &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{"delegate-sandbox-init", initCommand}, args...),
		Env:        helperEnv(false),
		Stdin:      stdin,
		Stdout:     stdout,
		Stderr:     stderr,
		ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  flags,
			UidMappings: idMap,
			GidMappings: idMap,
			// setgroups stays allowed so init can give the job an empty
			// group list; the mapping is written by a privileged parent, so
			// this opens nothing.
			GidMappingsEnableSetgroups: true,
			// Without an explicit uid 0 the child would be the overflow uid
			// and lose its capabilities in its own namespace at exec.
			Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
			// Nobody would collect the output or the exit status of a
			// sandbox whose shim is gone; end it rather than orphan it.
			Pdeathsig: syscall.SIGKILL,
		},
	}
}

// runShim supervises one sandboxed command (the Go helper; see
// shim_linux.c for the C one). It runs in a session of its own so that
// a server crash or restart does not end the job, and it keeps
// everything (pids, output, exit status) in the sandbox directory, its
// working directory, for the server to find. The plan comes on
// descriptor 3.
func runShim(args []string) int {
	closeInherited(serverFD + 1)
	// init's parent-death signal fires when the thread that forked it
	// exits, so that thread must live as long as the shim.
	runtime.LockOSThread()
	if len(args) == 2 && args[0] == probeArg {
		return shimProbe(args[1])
	}
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintln(os.Stderr, "usage: "+shimCommand+" <absolute sandbox dir> (a plan on descriptor 3)")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", filepath.Base(args[0]))
	// init runs as an unprivileged host uid that cannot search the
	// root-only directories above the sandbox directory. It inherits this
	// working directory (translated into its new mount namespace) and
	// reaches the workspace, rootfs and template through relative paths.
	if err := os.Chdir(args[0]); err != nil {
		log.Error("shim cannot enter the sandbox directory", "err", err)
		return 1
	}
	p, planData, planFile, loadErr := readPlan()
	if loadErr == nil && p.Mode != modeSandbox {
		defer planFile.Close()
		if p.Mode == modeKeeper {
			return runKeeper(log, p, planData)
		}
		return runCommandShim(log, p, planFile)
	}
	if planFile != nil {
		planFile.Close()
	}
	rec := supervise(log, p, planData, loadErr)
	if err := writeJSONAtomic(fileExit, rec); err != nil {
		log.Error("shim cannot record the exit status", "err", err)
		return 1
	}
	return 0
}

// closeInherited closes the descriptors from on that this process
// inherited (those without close-on-exec: every one Go opens has it)
// beyond what the server gives a shim (planFD, netnsFD, serverFD): one
// the server's own parent left open passes through the server's exec of
// the shim, and a shim (a keeper: a kept sandbox's life) would hold it
// for as long as it runs (the lock of a script that ran the server's
// tests, for one). close_strays in helper_linux.c.
func closeInherited(from int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < from {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// shimProbe starts an init that only checks it is pid 1 and uid 0, in a
// user namespace owned by host uid base (the first of the sandboxes'
// range) as a sandbox's is, to prove (at server start) that this binary
// re-executes into the helpers and that this kernel allows the
// namespaces.
func shimProbe(base string) int {
	id, err := strconv.ParseUint(base, 10, 32)
	if err != nil || id == 0 {
		fmt.Fprintf(os.Stderr, "sandbox init probe: bad host uid %q\n", base)
		return 2
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer devnull.Close()
	cmd := initCmd(devnull, os.Stderr, os.Stderr, nil, uint32(id), slotSize, true, probeArg)
	err = startAsOwner(cmd, uint32(id))
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init probe: %v\n", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// readPlan reads the plan the server writes into descriptor 3, which it
// returns open (a kept sandbox's command hands it on to init).
func readPlan() (*plan, []byte, *os.File, error) {
	f := os.NewFile(planFD, "plan")
	if f == nil {
		return nil, nil, nil, errors.New("no plan: descriptor 3 is not open")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxPlanBytes+1))
	if err != nil {
		return nil, nil, f, fmt.Errorf("read the plan: %w", err)
	}
	if len(data) == 0 {
		return nil, nil, f, errors.New("no plan: the server went away before it sent one")
	}
	if len(data) > maxPlanBytes {
		return nil, nil, f, fmt.Errorf("the plan is larger than %d bytes", maxPlanBytes)
	}
	p, err := unmarshalPlan(data)
	return p, data, f, err
}

// outputWriter keeps the first limit bytes of the job's stdout and
// stderr, in the order it is given them, with a record of which stream
// they are from (streams.go), and counts all of them. It never fails, so
// the pipes keep draining and the job is never blocked or killed by
// SIGPIPE because its output is too large. Its files are made with the
// first byte to keep, the record of streams first: a quiet job leaves
// none, as with the C shim.
type outputWriter struct {
	busy     atomic.Bool // copyOutput has read output it has not written yet: see quiet
	mu       sync.Mutex  // the two streams are copied by two goroutines
	f, sf    *os.File    // the output and its stream records
	limit, n int64
	cur      sandbox.Stream // the stream of the last byte kept
	recs     int64          // stream records written
	err      error          // first error; later output is only counted
}

// stream is an io.Writer of one stream into w.
type stream struct {
	w *outputWriter
	s sandbox.Stream
}

func (s stream) Write(p []byte) (int, error) {
	s.w.write(s.s, p)
	return len(p), nil
}

func (w *outputWriter) write(s sandbox.Stream, p []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if keep := w.limit - w.n; keep > 0 && len(p) > 0 && w.err == nil {
		w.keep(s, p[:min(int64(len(p)), keep)])
	}
	w.n += int64(len(p))
}

func (w *outputWriter) keep(s sandbox.Stream, p []byte) {
	if w.f == nil {
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC | syscall.O_CLOEXEC | syscall.O_NOFOLLOW
		if w.sf, w.err = os.OpenFile(fileStreams, flags, 0o600); w.err != nil {
			return
		}
		if w.f, w.err = os.OpenFile(fileOutput, flags, 0o600); w.err != nil {
			return
		}
	}
	if s != w.cur && w.recs < maxStreamRecords(w.limit) {
		if w.recs++; w.recs == maxStreamRecords(w.limit) {
			s = sandbox.Combined // the rest, told apart no more
		}
		rec := encodeStreamRecord(w.n, s)
		if _, w.err = w.sf.Write(rec[:]); w.err != nil {
			return
		}
		w.cur = s
	}
	_, w.err = w.f.Write(p)
}

func (w *outputWriter) close() {
	for _, f := range []*os.File{w.f, w.sf} {
		if f != nil {
			f.Close()
		}
	}
}

// copyOutput copies the job's stdout and stderr (the read ends of two
// pipes, which it closes) into w until both are closed, as the C shim
// does: through an epoll set, which lists ready descriptors in the order
// they became ready, so that when both streams have something the one
// written to first is read first (poll over two pipes cannot tell; the
// kernel keeps no order between them). Each ready stream is read once
// per round, up to a buffer.
func copyOutput(w *outputWriter, stdout, stderr int, log *slog.Logger) {
	fds := [2]int{stdout, stderr}
	streams := [2]sandbox.Stream{sandbox.Stdout, sandbox.Stderr}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	for i := 0; err == nil && i < 2; i++ {
		err = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fds[i], &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)})
	}
	if err != nil {
		// Never leave the pipes unread (a job would block on a full one).
		log.Warn("epoll: the output is read without its order across streams", "err", err)
		var wg sync.WaitGroup
		for i := range fds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(stream{w, streams[i]}, os.NewFile(uintptr(fds[i]), streams[i].String()))
			}()
		}
		wg.Wait()
		return
	}
	defer unix.Close(ep)
	buf := make([]byte, 64<<10)
	events := make([]unix.EpollEvent, 2)
	for open := 2; open > 0; w.busy.Store(false) {
		n, err := unix.EpollWait(ep, events, -1)
		w.busy.Store(true)
		if err != nil {
			if !errors.Is(err, unix.EINTR) {
				log.Warn("wait for the output", "err", err)
				time.Sleep(10 * time.Millisecond) // ENOMEM passes; giving up would block the job
			}
			continue
		}
		for _, ev := range events[:n] {
			i := ev.Fd
			if i < 0 || i > 1 || fds[i] < 0 {
				continue
			}
			k, err := unix.Read(fds[i], buf)
			if k > 0 {
				w.write(streams[i], buf[:k])
			} else if k == 0 || !errors.Is(err, unix.EINTR) {
				unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fds[i], nil)
				unix.Close(fds[i])
				fds[i], open = -1, open-1
			}
		}
	}
}

// quiet waits until what the command wrote before its end is kept: its
// pipes (fds, the read ends) hold nothing unread and copyOutput has
// written what it read, or the output has ended (copied closed), or a
// few seconds have passed (a process that writes on and on). What the
// command left in the background may hold the pipes open: their end is
// not waited for, and what it writes later is kept after the record.
func (w *outputWriter) quiet(copied <-chan struct{}, fds [2]int) {
	give := time.After(3 * time.Second)
	for {
		select {
		case <-copied:
			return
		default:
		}
		if !w.busy.Load() && unread(fds[0]) == 0 && unread(fds[1]) == 0 && !w.busy.Load() {
			return
		}
		select {
		case <-copied:
			return
		case <-give:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// unread is how many bytes wait in the pipe fd (FIONREAD, alias
// TIOCINQ); 0 when it cannot say (closed).
func unread(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ)
	if err != nil {
		return 0
	}
	return n
}

// supervise runs the command of a sandbox of one (the plan p, read as
// planData, or why it could not be read) and returns how it ended. Paths
// are relative to the shim's directory, the sandbox's.
func supervise(log *slog.Logger, p *plan, planData []byte, loadErr error) exitRecord {
	w := &outputWriter{limit: DefaultOutputLimit} // unreadable plan: still show why
	if loadErr == nil && p.OutputLimit > 0 {
		w.limit = p.OutputLimit
	}
	defer w.close()
	fail := func(err error) exitRecord { return w.failed(err, log) }
	if loadErr != nil {
		return fail(loadErr)
	}
	if p.Netns {
		// A network namespace the server made (a kept sandbox's, which
		// its commands share): joined by this thread, which clones init.
		if err := unix.Setns(netnsFD, unix.CLONE_NEWNET); err != nil {
			return fail(fmt.Errorf("join the sandbox's network namespace: %w", err))
		}
		unix.Close(netnsFD)
	}
	// Whatever this shim was given beyond its plan must not reach the
	// network helper nor init (closeOnExecFrom3).
	if err := closeOnExecFrom3(); err != nil {
		return fail(err)
	}
	// Supplementary groups would follow init and the job into the sandbox
	// and still grant host group access (root's group!) there.
	if err := syscall.Setgroups(nil); err != nil {
		return fail(fmt.Errorf("drop supplementary groups: %w", err))
	}

	syncR, syncW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	// The job's stdout and stderr: plain blocking pipes, which copyOutput
	// polls as the C shim does.
	var outP, errP [2]int
	if err := unix.Pipe2(outP[:], unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("pipe: %w", err))
	}
	if err := unix.Pipe2(errP[:], unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("pipe: %w", err))
	}
	outW, errW := os.NewFile(uintptr(outP[1]), "stdout"), os.NewFile(uintptr(errP[1]), "stderr")
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	cmd := initCmd(devnull, outW, errW, []*os.File{syncR, statusW}, p.HostIDBase, p.IDRange, !p.Netns)
	startErr := startAsOwner(cmd, p.HostIDBase)
	for _, f := range []*os.File{syncR, statusW, outW, errW, devnull} {
		f.Close()
	}
	if startErr != nil {
		syncW.Close()
		unix.Close(outP[0])
		unix.Close(errP[0])
		return fail(fmt.Errorf("start the sandbox init: %w", startErr))
	}
	copied := make(chan struct{})
	go func() {
		copyOutput(w, outP[0], errP[0], log)
		close(copied)
	}()
	bridge, err := startStatusBridge(fileStatusFIFO)
	if err != nil {
		// The job runs without its status channel rather than not at all.
		log.Warn("status channel", "err", err)
	}

	pid := cmd.Process.Pid
	var net *netHelper // the network helper, when the sandbox has network
	killed := func() bool {
		_, err := os.Stat(fileKilled)
		return err == nil
	}
	release := func() error {
		// One write: a reader sees no pid yet, or all of it.
		if err := writePIDFile(fileInitPID, pid); err != nil {
			return err
		}
		if err := p.Cgroup.addProc(pid); err != nil {
			return fmt.Errorf("place the sandbox in its cgroups: %w", err)
		}
		if p.Net.Name != "" {
			// Configured while init still waits, so the job starts with
			// its network.
			h, err := startNetHelper(p.Net, pid, p.Cgroup)
			if err != nil {
				if killed() {
					return errKilledBeforeStart // Kill ended init or the helper
				}
				return fmt.Errorf("network: %w", err)
			}
			net = h
		}
		// Kill writes the marker before it kills what is in the cgroups:
		// either it sees init there now, or init is never released.
		if killed() {
			return errKilledBeforeStart
		}
		_, err := syncW.Write(planData)
		return err
	}
	var deadlineHit atomic.Bool
	var deadline *time.Timer
	relErr := release()
	if relErr != nil {
		// Killed before the EOF below, so init never gets to act on it.
		cmd.Process.Kill()
	} else if d := p.deadlineTime(); !d.IsZero() {
		// The backstop for a job that no server watches any more.
		deadline = time.AfterFunc(time.Until(d), func() {
			deadlineHit.Store(true)
			if err := killSandbox(".", p.Cgroup); err != nil {
				log.Error("kill at deadline", "err", err)
			}
		})
		defer deadline.Stop()
	}
	syncW.Close() // EOF: the go-ahead
	statusData, _ := io.ReadAll(statusR)
	statusR.Close()
	cmd.Wait()
	if net != nil {
		// The job is over (init's end took every process of the sandbox
		// with it); its network goes too, before the end is recorded.
		net.stop()
	}
	<-copied
	bridge.stop()

	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return p.record(w, statusData, &ws, relErr, deadlineHit.Load(), log)
}

// failed is the record of a command that could not start: why, in the
// output (on stderr: the sandbox machinery's own words) and the record.
func (w *outputWriter) failed(err error, log *slog.Logger) exitRecord {
	fmt.Fprintf(stream{w, sandbox.Stderr}, "%s%v\n", setupPrefix, err)
	log.Error("sandbox setup failed", "err", err)
	w.mu.Lock()
	defer w.mu.Unlock()
	return exitRecord{Code: codeSetupFailed, Reason: err.Error(), OutputBytes: w.n, Truncated: w.n > w.limit, EndedAt: time.Now().UnixNano()}
}

// record is how the command ended: from init's report (statusData),
// else from init's wait status ws.
func (p *plan) record(w *outputWriter, statusData []byte, ws *syscall.WaitStatus, relErr error, deadlineHit bool, log *slog.Logger) exitRecord {
	stderr := stream{w, sandbox.Stderr}
	rec := exitRecord{EndedAt: time.Now().UnixNano()} // init has reported or exited: the command has ended
	s, haveStatus := decodeInitStatus(statusData)
	switch {
	case haveStatus:
		rec.Code, rec.Signo, rec.Reason = s.Code, s.Signo, s.Reason
	case ws != nil && ws.Signaled():
		rec.Code, rec.Signo = 128+int(ws.Signal()), int(ws.Signal())
	case ws != nil:
		rec.Code = ws.ExitStatus()
	}
	if relErr != nil && !errors.Is(relErr, errKilledBeforeStart) {
		fmt.Fprintf(stderr, "%s%v\n", setupPrefix, relErr)
		log.Error("sandbox setup failed", "err", relErr)
		rec.Code, rec.Signo, rec.Reason = codeSetupFailed, 0, relErr.Error()
	}
	if _, err := os.Stat(fileKilled); err == nil {
		// A Kill that came after the job had ended on its own changes
		// nothing: only a job that died of a signal was killed.
		rec.Killed = !haveStatus || s.Signo != 0
	}
	// Likewise for the deadline: a job that ended on its own just as the
	// deadline came was not killed by it.
	rec.DeadlineExceeded = deadlineHit && (!haveStatus || s.Signo != 0)
	if n, err := p.Cgroup.oomKills(); err != nil {
		log.Warn("read oom counter", "err", err)
	} else {
		rec.OOMKilled = n > 0
	}
	w.mu.Lock()
	rec.OutputBytes, rec.Truncated = w.n, w.n > w.limit
	werr := w.err
	w.mu.Unlock()
	if werr != nil {
		log.Error("write output file", "err", werr)
	}
	return rec
}
