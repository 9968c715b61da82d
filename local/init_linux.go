//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// defaultJobPath is searched when the command's environment has no PATH.
const defaultJobPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Inherited descriptors of init (set up by the shim).
const (
	initSyncFD   = 3 // read: the plan, then EOF = "you are in your cgroups, go"
	initStatusFD = 4 // write: one initStatus just before init exits; a kept sandbox's init: its requests (keeper_linux.go)
)

// runInit is pid 1 of the sandbox, uid 0 of its user namespace (the Go
// helper; init_linux.c has the same for the C one). It waits for the
// shim's go-ahead, which brings the plan, carries out the plan's steps
// (root filesystem, restrictions), starts the job as an unprivileged
// user, reaps zombies until the job has exited, and exits with the job's
// status. When init exits the kernel kills everything left in the pid
// namespace.
//
// Setup failures go to stderr (the job's stderr) with setupPrefix, so a
// user sees why a job did not run instead of a bare exit code.
func runInit(args []string) int {
	// unshare and the job's fork must happen on the same OS thread:
	// namespaces belong to threads, and the job inherits from the one that
	// forks it.
	runtime.LockOSThread()
	if len(args) == 1 && args[0] == probeArg {
		if os.Getpid() == 1 && os.Getuid() == 0 {
			return 0
		}
		fmt.Fprintf(os.Stderr, "%sprobe: pid %d uid %d, want pid 1 uid 0\n", setupPrefix, os.Getpid(), os.Getuid())
		return codeSetupFailed
	}
	// init remounts and pivots the root: only ever in the fresh namespaces
	// the shim made, never when someone runs the hidden command by hand.
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "%s%s is internal: it runs only as pid 1 of a new sandbox\n", setupPrefix, initCommand)
		return codeSetupFailed
	}
	// A known umask for the root we build and for the job, whatever the
	// server's was.
	syscall.Umask(0o022)
	syscall.CloseOnExec(initSyncFD)
	syscall.CloseOnExec(initStatusFD)
	syncPipe := os.NewFile(initSyncFD, "sync")
	statusPipe := os.NewFile(initStatusFD, "status")

	report := func(s initStatus) int {
		statusPipe.Write(s.encode())
		statusPipe.Close()
		return s.Code
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(os.Stderr, "%s%v\n", setupPrefix, err)
		return report(initStatus{Code: code, Reason: err.Error()})
	}

	data, err := io.ReadAll(syncPipe)
	syncPipe.Close()
	if err != nil {
		return fail(codeSetupFailed, fmt.Errorf("read instructions: %w", err))
	}
	if len(data) == 0 {
		return fail(codeSetupFailed, errors.New("the sandbox was never released (its shim went away)"))
	}
	p, err := unmarshalPlan(data)
	if err != nil {
		return fail(codeSetupFailed, err)
	}
	if p.Mode == modeKeeper {
		// A kept sandbox's init: its root, then its commands (fd 4 is
		// the socket of their requests; its first message says ready).
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
		if err := closeOnExecFrom3(); err != nil {
			return fail(codeSetupFailed, err)
		}
		if err := runOps(p.Ops, nil); err != nil {
			return fail(codeSetupFailed, err)
		}
		return serveCommands(statusPipe)
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return fail(codeSetupFailed, errors.New("no command"))
	}
	// Only stdin, stdout and stderr go to the job (the C init closes the
	// rest; the Go one cannot, its runtime owns some).
	if err := closeOnExecFrom3(); err != nil {
		return fail(codeSetupFailed, err)
	}
	// The job starts with every signal at its default disposition, as
	// with the C init. Ignored signals survive exec, and the Go runtime
	// leaves SIGHUP and SIGINT ignored when it was started so (a server
	// run with nohup, or in the background by a shell); handled here,
	// they are reset at the job's exec like every other.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
	if err := runOps(p.Ops, p.Seccomp); err != nil {
		return fail(codeSetupFailed, err)
	}
	path, code, err := commandPath(p)
	if err != nil {
		return fail(code, err)
	}
	stdin := 0 // /dev/null, from the shim
	if p.Stdin != "" {
		// One of the command's inputs, opened by init (the job's user
		// could too: it is that user's file).
		if stdin, err = unix.Open(p.Stdin, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return fail(codeSetupFailed, fmt.Errorf("standard input %s: %w", p.Stdin, err))
		}
	}
	pid, err := syscall.ForkExec(path, p.Args, &syscall.ProcAttr{
		Dir:   p.Dir,
		Env:   p.Env,
		Files: []uintptr{uintptr(stdin), 1, 2}, // and the shim's stdout and stderr pipes
		Sys: &syscall.SysProcAttr{
			// Leaving uid 0 for a non-zero uid clears every capability, so
			// the job runs with none even inside its user namespace.
			Credential: &syscall.Credential{Uid: p.JobID, Gid: p.JobID, Groups: []uint32{}},
		},
	})
	if err != nil {
		return fail(execFailed(p, err))
	}
	return report(reap(pid))
}

// commandPath finds a command's program and checks its working
// directory, as init and a kept sandbox's command both do before they
// execute it (command_path in init_linux.c): the path, or the code
// and the error to report.
func commandPath(p *plan) (string, int, error) {
	path, err := jobPath(p.Args[0], p.Env, p.Dir)
	if err != nil {
		return "", codeNotFound, err
	}
	if st, err := os.Stat(p.Dir); err != nil || !st.IsDir() {
		return "", codeCannotExec, fmt.Errorf("working directory %s does not exist in the sandbox", p.Dir)
	}
	return path, 0, nil
}

// execFailed is the code and the error to report of a command whose
// program could not be executed.
func execFailed(p *plan, err error) (int, error) {
	code := codeCannotExec
	if errors.Is(err, syscall.ENOENT) {
		code = codeNotFound
	}
	return code, fmt.Errorf("cannot run %q: %w", p.Args[0], err)
}

// closeRangeCloexec is CLOSE_RANGE_CLOEXEC of close_range(2), which
// golang.org/x/sys/unix does not name.
const closeRangeCloexec = 1 << 2

// closeOnExecFrom3 marks every descriptor from 3 up close-on-exec. A
// helper may hold descriptors nobody meant it to have: the server's own
// parent (a shell, an MCP client) may have left some without
// close-on-exec, and such a descriptor passes through every exec after
// it, into the job (a directory of the host's would let it out of its
// root) and into the network helper.
func closeOnExecFrom3() error {
	err := unix.CloseRange(3, math.MaxUint32, closeRangeCloexec)
	if err == nil {
		return nil
	}
	// Before Linux 5.11: one by one, as /proc lists them.
	if lerr := closeOnExecListed(); lerr != nil {
		return fmt.Errorf("close inherited descriptors: %w (and one by one: %v)", err, lerr)
	}
	return nil
}

// closeOnExecListed is closeOnExecFrom3 without close_range.
func closeOnExecListed() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// The listing's own descriptor is closed by now (EBADF).
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("descriptor %d: %w", fd, err)
		}
	}
	return nil
}

// dropBoundingSet empties the capability bounding set, so nothing the job
// executes can ever gain a capability, even a file capability.
func dropBoundingSet() error {
	for c := 0; c < 64; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return nil // past the last capability this kernel knows
		}
		if err != nil {
			return fmt.Errorf("capability %d: %w", c, err)
		}
	}
	return nil
}

// jobPath resolves the command like execvp would in the job: on the PATH
// of the job's environment (not init's), relative entries against the
// job's working directory.
func jobPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil // execve resolves it against the working directory
	}
	pathEnv, found := defaultJobPath, false
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok && !found {
			pathEnv, found = v, true // the first one, as getenv(3) sees it
		}
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: command not found in PATH %q", name, pathEnv)
}

// reap waits for any child (pid 1 inherits every orphan of the sandbox and
// must collect them) until the job itself has exited.
func reap(job int) initStatus {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return initStatus{Code: codeSetupFailed, Reason: fmt.Sprintf("wait: %v", err)}
		}
		if pid != job {
			continue
		}
		return exitStatus(ws)
	}
}

// exitStatus is how a process ended, as init reports it.
func exitStatus(ws syscall.WaitStatus) initStatus {
	if ws.Signaled() {
		return initStatus{Code: 128 + int(ws.Signal()), Signo: int(ws.Signal())}
	}
	return initStatus{Code: ws.ExitStatus()}
}
