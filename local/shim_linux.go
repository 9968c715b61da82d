//go:build linux

package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// initCloneFlags are the namespaces init is born in.
const initCloneFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
	syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// errKilledBeforeStart: Kill came before the job was released.
var errKilledBeforeStart = errors.New("killed before start")

// initCmd prepares init: the shim's own binary (through /proc/self/exe,
// which needs no search permission on the directories above it, unlike
// SelfExe's path for an unprivileged uid), in fresh namespaces, as uid 0
// of a user namespace mapped to an unprivileged host range.
func initCmd(stdin, out *os.File, extra []*os.File, args ...string) *exec.Cmd {
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostIDBase, Size: idRange}}
	return &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{"delegate-sandbox-init", initCommand}, args...),
		Env:        helperEnv(),
		Stdin:      stdin,
		Stdout:     out,
		Stderr:     out,
		ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  initCloneFlags,
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

// runShim supervises one sandboxed command. It runs in a session of its
// own so that a server crash or restart does not end the job, and it
// keeps everything (pids, output, exit status) in the sandbox directory
// for the server to find.
func runShim(args []string) int {
	// init's parent-death signal fires when the thread that forked it
	// exits, so that thread must live as long as the shim.
	runtime.LockOSThread()
	if len(args) == 1 && args[0] == probeArg {
		return shimProbe()
	}
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintln(os.Stderr, "usage: "+shimCommand+" <absolute sandbox dir>")
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
	rec := supervise(log)
	if err := writeJSONAtomic(fileExit, rec); err != nil {
		log.Error("shim cannot record the exit status", "err", err)
		return 1
	}
	return 0
}

// shimProbe starts an init that only checks it is pid 1 and uid 0, to
// prove (at server start) that this binary re-executes into the helpers
// and that this kernel allows the namespaces.
func shimProbe() int {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer devnull.Close()
	if err := initCmd(devnull, os.Stderr, nil, probeArg).Run(); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init probe: %v\n", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// outputWriter keeps the first limit bytes and counts all of them. It
// never fails, so the pipe keeps draining and the job is never blocked or
// killed by SIGPIPE because its output is too large.
type outputWriter struct {
	f        *os.File
	limit, n int64
	err      error // first write error; later output is only counted
}

func (w *outputWriter) Write(p []byte) (int, error) {
	if keep := w.limit - w.n; keep > 0 && w.err == nil && w.f != nil {
		if _, err := w.f.Write(p[:min(int64(len(p)), keep)]); err != nil {
			w.err = err
		}
	}
	w.n += int64(len(p))
	return len(p), nil
}

// supervise runs the command and returns how it ended. Paths are relative
// to the sandbox directory.
func supervise(log *slog.Logger) exitRecord {
	if err := writeFileAtomic(fileShimPID, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		log.Error("record shim pid", "err", err)
	}
	var st sandboxState
	var ex execRecord
	loadErr := errors.Join(readJSON(fileState, &st), readJSON(fileExec, &ex))
	w := &outputWriter{limit: ex.OutputLimit}
	if w.limit <= 0 {
		w.limit = DefaultOutputLimit // unreadable exec.json: still show why
	}
	out, err := os.OpenFile(fileOutput, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		log.Error("open output file", "err", err)
	} else {
		w.f = out
		defer out.Close()
	}
	fail := func(err error) exitRecord {
		fmt.Fprintf(w, "%s%v\n", setupPrefix, err)
		log.Error("sandbox setup failed", "err", err)
		return exitRecord{Code: codeSetupFailed, Reason: err.Error(), OutputBytes: w.n, Truncated: w.n > w.limit}
	}
	if loadErr != nil {
		return fail(loadErr)
	}
	// The environment often carries the job's secrets. init gets it
	// through a pipe below; on disk it is no longer needed.
	scrubbed := ex
	scrubbed.Env = nil
	if err := writeJSONAtomic(fileExec, scrubbed); err != nil {
		log.Warn("remove the environment from exec.json", "err", err)
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
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	cmd := initCmd(devnull, outW, []*os.File{syncR, statusW})
	startErr := cmd.Start()
	for _, f := range []*os.File{syncR, statusW, outW, devnull} {
		f.Close()
	}
	if startErr != nil {
		syncW.Close()
		return fail(fmt.Errorf("start the sandbox init: %w", startErr))
	}
	copied := make(chan struct{})
	go func() {
		io.Copy(w, outR)
		close(copied)
	}()
	bridge, err := startStatusBridge()
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
		if err := writeFileAtomic(fileInitPID, []byte(strconv.Itoa(pid)), 0o600); err != nil {
			return err
		}
		if err := st.Cgroup.addProc(pid); err != nil {
			return fmt.Errorf("place the sandbox in its cgroups: %w", err)
		}
		if st.Network != nil {
			// Configured while init still waits, so the job starts with
			// its network.
			h, err := startNetHelper(*st.Network, pid, st.Cgroup)
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
		data, err := json.Marshal(initConfig{
			Args:     ex.Args,
			Env:      ex.Env,
			Dir:      ex.Dir,
			Template: st.Template != "",
			TmpBytes: min(st.DiskBytes, maxTmpBytes),
			Network:  st.Network != nil,
		})
		if err != nil {
			return err
		}
		_, err = syncW.Write(data)
		return err
	}
	relErr := release()
	if relErr != nil {
		// Killed before the EOF below, so init never gets to act on it.
		cmd.Process.Kill()
	} else if !ex.Deadline.IsZero() {
		// The backstop for a job that no server watches any more.
		deadline := time.AfterFunc(time.Until(ex.Deadline), func() {
			if err := os.WriteFile(fileDeadline, nil, 0o600); err != nil {
				log.Error("deadline marker", "err", err)
			}
			if err := killSandbox(".", st.Cgroup); err != nil {
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
	outR.Close()
	bridge.stop()

	var rec exitRecord
	var s initStatus
	haveStatus := len(statusData) > 0 && json.Unmarshal(statusData, &s) == nil
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case haveStatus:
		rec.Code, rec.Signal, rec.Reason = s.Code, s.Signal, s.Reason
	case ws.Signaled():
		rec.Code, rec.Signal = 128+int(ws.Signal()), ws.Signal().String()
	default:
		rec.Code = ws.ExitStatus()
	}
	if relErr != nil && !errors.Is(relErr, errKilledBeforeStart) {
		fmt.Fprintf(w, "%s%v\n", setupPrefix, relErr)
		log.Error("sandbox setup failed", "err", relErr)
		rec.Code, rec.Signal, rec.Reason = codeSetupFailed, "", relErr.Error()
	}
	if killed() {
		// A Kill that came after the job had ended on its own changes
		// nothing: only a job that died of a signal was killed.
		rec.Killed = !haveStatus || s.Signal != ""
	}
	if _, err := os.Stat(fileDeadline); err == nil {
		rec.DeadlineExceeded = true
	}
	if n, err := st.Cgroup.oomKills(); err != nil {
		log.Warn("read oom counter", "err", err)
	} else {
		rec.OOMKilled = n > 0
	}
	rec.OutputBytes, rec.Truncated = w.n, w.n > w.limit
	if w.err != nil {
		log.Error("write output file", "err", w.err)
	}
	return rec
}
