//go:build linux

package local

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// sbox is one sandbox directory. It holds no state of its own: everything
// is in the directory, so any number of sbox values (and servers, one
// after another) can refer to the same sandbox.
type sbox struct {
	b   *Backend
	id  string
	dir string

	// st is the sandbox's state once read: Create writes it before it
	// returns the sandbox, and nothing changes it after, so that a kept
	// sandbox's commands need not read it each.
	stMu sync.Mutex
	st   *sandboxState
}

// state is the sandbox's state (Backend.state), read once.
func (s *sbox) state() (sandboxState, error) {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	if s.st != nil {
		return *s.st, nil
	}
	st, err := s.b.state(s.dir, s.id)
	if err == nil {
		s.st = &st
	}
	return st, err
}

var _ sandbox.Instance = (*sbox)(nil)

func (s *sbox) ID() string { return s.id }

func (s *sbox) Destroy(ctx context.Context) error { return s.b.destroy(s.id) }

func (s *sbox) path(name string) string { return filepath.Join(s.dir, name) }

// gone reports whether the sandbox directory has disappeared.
func (s *sbox) gone() bool {
	_, err := os.Lstat(s.dir)
	return errors.Is(err, os.ErrNotExist)
}

// WriteFile implements sandbox.Files; see writeWorkspaceFile.
func (s *sbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := writeWorkspaceFile(s.path(dirWorkspace), p, data, mode); err != nil {
		return s.goneOr(err)
	}
	return nil
}

// ReadFile implements sandbox.Files; see readWorkspaceFile.
func (s *sbox) ReadFile(ctx context.Context, p string, offset, max int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data, err := readWorkspaceFile(s.path(dirWorkspace), p, offset, max)
	if err != nil {
		return nil, s.goneOr(err)
	}
	return data, nil
}

func (s *sbox) goneOr(err error) error {
	if s.gone() {
		return fmt.Errorf("sandbox %s: %w", s.id, sandbox.ErrGone)
	}
	return err
}

// validateCommand rejects what execve could not take, with a clear error
// now instead of an obscure one from inside the sandbox.
func validateCommand(cmd sandbox.Command) (execRecord, error) {
	if len(cmd.Args) == 0 || cmd.Args[0] == "" {
		return execRecord{}, errors.New("exec: the command has no program (Args[0] is empty)")
	}
	for i, a := range cmd.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return execRecord{}, fmt.Errorf("exec: argument %d contains a NUL byte", i)
		}
	}
	for i, e := range cmd.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return execRecord{}, fmt.Errorf("exec: environment entry %d is not KEY=VALUE without NUL bytes", i)
		}
	}
	if err := validateInputs(cmd.Inputs, cmd.Stdin); err != nil {
		return execRecord{}, err
	}
	dir := cmd.Dir
	if dir == "" {
		dir = "/workspace"
	}
	if !path.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0 {
		return execRecord{}, fmt.Errorf("exec: working directory %q must be an absolute path", dir)
	}
	limit := cmd.OutputLimit
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	return execRecord{Args: cmd.Args, Env: cmd.Env, Dir: path.Clean(dir), OutputLimit: limit, Deadline: cmd.Deadline}, nil
}

// Exec implements sandbox.Instance: it records the command (without its
// environment) and starts the shim, which runs it from the plan written
// into its descriptor 3 (in a kept sandbox, the sandbox's init forks it:
// execKept). The shim is not tied to ctx nor to this process: the job
// outlives a server restart.
func (s *sbox) Exec(ctx context.Context, cmd sandbox.Command) (sandbox.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec, err := validateCommand(cmd)
	if err != nil {
		return nil, err
	}
	if s.gone() {
		return nil, fmt.Errorf("sandbox %s: %w", s.id, sandbox.ErrGone)
	}
	st, err := s.state()
	if err != nil {
		return nil, s.goneOr(fmt.Errorf("exec: %w", err))
	}
	if rec.ID, err = newID("ex-", 4); err != nil {
		return nil, err
	}
	if st.Multi {
		return s.execKept(st, rec, cmd)
	}
	// The C helpers take sandboxes without network when this binary has
	// them; the Go ones the others (only the Go shim starts a network
	// helper), and all of them when the tests ask.
	c := s.b.shims.cFor(st)
	var netns *os.File
	if st.Proxy != nil {
		// The namespace the server made, where the proxy's listeners are.
		fd, err := unix.Open(filepath.Join(s.dir, fileNetns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, s.goneOr(fmt.Errorf("exec: the sandbox's network namespace: %w", err))
		}
		netns = os.NewFile(uintptr(fd), "netns")
		defer netns.Close()
	} else if c {
		netns = s.b.nets.pool.take()
		if netns != nil {
			defer netns.Close() // the shim has its own once started
		}
	}
	pl, err := s.b.plans.buildPlan(s.dir, st, rec, cmd, netns != nil)
	if err != nil {
		return nil, s.goneOr(fmt.Errorf("exec: %w", err))
	}
	rec.CacheMisses = busyMisses(st)
	// O_EXCL makes "one command per sandbox" hold across goroutines and
	// server processes alike.
	if err := writeExecRecord(s.dir, rec, false); errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("exec: sandbox %s already ran its one command (it was not made to run many: Spec.MultiExec)", s.id)
	} else if err != nil {
		return nil, err
	}
	shim, err := s.b.shims.start(s.dir, pl, c, netns, nil)
	if err != nil {
		os.Remove(filepath.Join(s.dir, fileExec))
		return nil, fmt.Errorf("exec: %w", err)
	}
	return s.started(rec.ID, s.dir, shim, nil), nil
}

// execKept starts one command of a kept sandbox: a directory of its own
// (execs/<id>: its exec.json, output, exit.json), its status channel (a
// FIFO in the sandbox's dirChannel) and its shim, which asks the
// sandbox's init for it (keeper_linux.go).
func (s *sbox) execKept(st sandboxState, rec execRecord, cmd sandbox.Command) (sandbox.Process, error) {
	if !st.Init {
		return nil, fmt.Errorf("sandbox %s was kept by an earlier delegate, whose kept sandboxes cannot run more commands: release it and open another: %w", s.id, sandbox.ErrGone)
	}
	c := s.b.shims.cCommands()
	spawn := st.Spawns && c // the keeper's socket says whether it is there (spawnShim)
	if !spawn {
		if _, alive := shimAlive(s.dir); !alive {
			return nil, s.goneOr(fmt.Errorf("sandbox %s: its init has ended (its lifetime is over, or it was killed): %w", s.id, sandbox.ErrGone))
		}
	}
	execDir, ahead, err := takeExecDir(s, st, &rec)
	if err != nil {
		return nil, err
	}
	// Its caches, for its run (cachecmd_linux.go).
	if rec.CacheMisses, err = s.b.caches.enter(s.id, s.dir, st); err != nil {
		return nil, s.goneOr(fmt.Errorf("exec: %w", err))
	}
	entered := true
	defer func() {
		if entered {
			s.b.caches.leave(s.id, s.dir, st)
		}
	}()
	channel := filepath.Join(s.dir, dirChannel, rec.ID)
	// The shim closes its end of this pipe once it has recorded the
	// command's end (or ends): Wait wakes up then, without polling.
	recordedR, recordedW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	pl := s.b.plans.execPlan(s.dir, st, rec, cmd)
	var shim *exec.Cmd
	if spawn {
		if err = spawnShim(s.dir, rec.ID, pl, recordedW); errors.Is(err, sandbox.ErrGone) {
			err = fmt.Errorf("sandbox %s: %w", s.id, err)
		}
	} else {
		shim, err = s.b.shims.start(execDir, pl, c, nil, recordedW)
	}
	recordedW.Close()
	if err != nil {
		recordedR.Close()
		os.Remove(channel)
		return nil, fmt.Errorf("exec: %w", err)
	}
	recorded := make(chan struct{})
	p := s.started(rec.ID, execDir, shim, recorded)
	entered = false // given back at its end, before Wait returns
	go func() {
		// The C shim writes the command's exit record here before the
		// file (write_exit); what else may come is read and dropped.
		p.told, _ = io.ReadAll(io.LimitReader(recordedR, maxToldExit))
		io.Copy(io.Discard, recordedR)
		recordedR.Close()
		s.b.caches.leave(s.id, s.dir, st)
		close(recorded)
		// Its end is told: a later Process finds it on the disk. The
		// backend forgets it, or a long-lived sandbox's every command
		// would stay in memory until the sandbox goes.
		s.b.live.drop(execDir, p)
	}()
	// Once the command is on its way: its record is for a later server
	// (Process), which learns the command's id only after Exec returns;
	// nothing in the sandbox reads it. In a directory made ahead, the file
	// is there already: filling it costs a write, creating it on the data
	// directory's filesystem most of a command's round trip's ext4 time.
	if err := writeExecRecord(execDir, rec, ahead); err != nil {
		p.Kill(context.Background())
		return nil, err
	}
	// The next command's directory, while this one starts; not in a
	// process that ends after this command (Config.OneShot).
	if s.b.oneShot {
		return p, nil
	}
	if err := s.makeSpareExecDir(st); err != nil && !s.gone() {
		s.b.log.Warn("make the next command's directory ahead", "sandbox", s.id, "err", err)
	}
	return p, nil
}

// takeExecDir gives a command of a kept sandbox its directory
// (execs/<id>) and status channel (a FIFO in dirChannel): the ones made
// ahead for it (ahead; its id then becomes rec.ID), or new ones.
func takeExecDir(s *sbox, st sandboxState, rec *execRecord) (dir string, ahead bool, err error) {
	if id := s.b.live.spare(s.dir, true); id != "" {
		rec.ID = id
		return filepath.Join(s.dir, dirExecs, id), true, nil
	}
	dir, err = s.makeExecDir(st, rec.ID, false)
	return dir, false, err
}

// makeSpareExecDir makes the directory and status channel of the
// sandbox's next command ahead of it, unless there are some: the next
// Exec is spared a directory made on the data directory's filesystem
// (0.04-0.4 ms here, the cost of a command's round trip most worth
// saving after the sandbox's own), and so are the files it and the
// command's shim fill (made empty here: aheadFiles). One left unused
// goes with the sandbox.
func (s *sbox) makeSpareExecDir(st sandboxState) error {
	if s.b.live.spare(s.dir, false) != "" {
		return nil
	}
	id, err := newID("ex-", 4)
	if err != nil {
		return err
	}
	if _, err := s.makeExecDir(st, id, true); err != nil {
		return err
	}
	s.b.live.putSpare(s.dir, id)
	return nil
}

// aheadFiles are the files of a command's directory made ahead, empty:
// its exec.json, which writeExecRecord fills without a truncation
// (fillFile; an empty one reads as none yet: Process), and the temporary
// file its shim's pid is written into (write_pid_file, writePIDFile)
// before it is renamed into place.
var aheadFiles = [...]string{fileExec, "." + fileShimPID + ".tmp"}

// makeExecDir makes the directory and status channel of command id, and
// with ahead its aheadFiles.
func (s *sbox) makeExecDir(st sandboxState, id string, ahead bool) (string, error) {
	execDir := filepath.Join(s.dir, dirExecs, id)
	if err := os.Mkdir(execDir, 0o700); err != nil {
		return "", s.goneOr(fmt.Errorf("exec: %w", err))
	}
	if ahead {
		for _, name := range aheadFiles {
			f, err := os.OpenFile(filepath.Join(execDir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return "", s.goneOr(fmt.Errorf("exec: %w", err))
			}
			f.Close()
		}
	}
	channel := filepath.Join(s.dir, dirChannel, id)
	if err := unix.Mkfifo(channel, 0o600); err != nil {
		return "", s.goneOr(fmt.Errorf("exec: the status channel: %w", err))
	}
	if err := os.Chown(channel, int(st.hostBase()+jobID), int(st.hostBase()+jobID)); err != nil {
		return "", fmt.Errorf("exec: the status channel: %w", err)
	}
	return execDir, nil
}

// writeExecRecord writes the command's exec.json in dir, exclusively,
// or (made) into the empty one made ahead (aheadFiles).
func writeExecRecord(dir string, rec execRecord, made bool) error {
	rec.Env = nil // the job's secrets stay off the disk, and so do its inputs
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if made {
		flags = os.O_WRONLY
	}
	err = fillFile(filepath.Join(dir, fileExec), data, flags)
	if err != nil {
		os.Remove(filepath.Join(dir, fileExec))
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}

// fillFile writes data into the file at path, opened with flags (mode
// 0600 if it is created), which may have been made ahead: empty, it is
// written, not truncated. On ext4 a truncation to nothing marks the file
// for writeback at its close (auto_da_alloc, the guard against files
// left empty by a crash): that took 50 µs of each kept command, and a
// disk write.
func fillFile(path string, data []byte, flags int) error {
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return err
	}
	if st, serr := f.Stat(); serr != nil {
		err = serr
	} else if st.Size() != 0 {
		err = f.Truncate(0)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// pidTemp is where a pid file is written before it is renamed into
// place (write_pid_file in C names it alike); made ahead, empty, in a
// command's directory (aheadFiles).
func pidTemp(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
}

// writePIDFile writes pid whole into pidTemp(path), then renames it into
// place: a reader finds no file (no pid yet), or all of it, never one
// created and not yet written. The temporary file may have been made
// ahead, empty (fillFile); the rename, onto a name not there yet, is no
// replace-by-rename (which on ext4 starts the file's writeback).
func writePIDFile(path string, pid int) error {
	tmp := pidTemp(path)
	err := fillFile(tmp, []byte(strconv.Itoa(pid)), os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// started records a shim this server started, and returns its process.
// A shim the sandbox's keeper started (shim nil) records its own pid,
// and its end is the end of recorded (its pipe closes with it, at the
// latest).
func (s *sbox) started(id, dir string, shim *exec.Cmd, recorded chan struct{}) *process {
	p := &process{s: s, id: id, dir: dir, done: make(chan struct{}), recorded: recorded}
	if shim == nil {
		p.done = recorded
		s.b.log.Info("sandbox exec", "sandbox", s.id, "exec", id, "shim", "the keeper's")
	} else {
		if err := writePIDFile(filepath.Join(dir, fileShimPID), shim.Process.Pid); err != nil {
			s.b.log.Warn("record shim pid", "sandbox", s.id, "err", err)
		}
		go func() {
			p.shimErr = shim.Wait()
			close(p.done)
		}()
		s.b.log.Info("sandbox exec", "sandbox", s.id, "exec", id, "shim", shim.Process.Pid)
	}
	s.b.live.add(dir, p)
	return p
}

// planMemfd holds a shim's plan, complete before the shim starts: it
// reads it at once. A memfd holds it (and the job's environment) in
// memory only, for as long as a descriptor of it is open.
func planMemfd(pl *plan) (*os.File, error) {
	fd, err := unix.MemfdCreate("delegate-sandbox-plan", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	f := os.NewFile(uintptr(fd), "plan")
	if _, err := f.Write(pl.marshal()); err != nil {
		f.Close()
		return nil, fmt.Errorf("plan: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("plan: %w", err)
	}
	return f, nil
}

// keeperRequests is the socket the requests to the C keepers go out of:
// one for the process, unbound (the keepers answer nothing) and never
// closed, instead of a socket made and closed per command. A request
// waiting in a keeper's queue is charged to this socket's send buffer
// until read; a keeper that stops reading holds at most its queue's
// length of them (net.unix.max_dgram_qlen, 10 by default; a sandbox runs
// at most MaxSandboxCommands at once), a few KiB of the ~200 KiB.
var keeperRequests = sync.OnceValues(func() (int, error) {
	return unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
})

// spawnShim asks the C keeper of the sandbox at dir to start the shim of
// command id (start_shim in keeper_linux.c), with its plan and the
// server's pipe. The keeper answers nothing: a shim that never starts
// closes the pipe unanswered, which Wait reports.
func spawnShim(dir, id string, pl *plan, server *os.File) error {
	planFile, err := planMemfd(pl)
	if err != nil {
		return err
	}
	defer planFile.Close()
	sock, err := keeperRequests()
	if err != nil {
		return err
	}
	head := binary.NativeEndian.AppendUint32(nil, spawnMagic)
	head = binary.NativeEndian.AppendUint32(head, 0)
	head = append(head, id...)
	to := &unix.SockaddrUnix{Name: filepath.Join(dir, fileControl)}
	if len(to.Name) >= len(unix.RawSockaddrUnix{}.Path) {
		// Through the directory's descriptor: a socket's path has at
		// most 107 bytes, a data directory's path may have more.
		dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("ask the sandbox's keeper for the command: %w", err)
		}
		defer unix.Close(dfd)
		to.Name = fmt.Sprintf("/proc/self/fd/%d/%s", dfd, fileControl)
	}
	for {
		err = unix.Sendmsg(sock, head, unix.UnixRights(int(planFile.Fd()), int(server.Fd())), to, 0)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("its keeper is gone, and its init with it (%v): %w", err, sandbox.ErrGone)
	}
	if err != nil {
		return fmt.Errorf("ask the sandbox's keeper for the command: %w", err)
	}
	return nil
}

// Process implements sandbox.Instance.
func (s *sbox) Process(ctx context.Context, execID string) (sandbox.Process, error) {
	dir := s.dir
	if strings.HasPrefix(execID, "ex-") && !strings.ContainsAny(execID, "/.") {
		if _, err := os.Lstat(filepath.Join(s.dir, dirExecs, execID)); err == nil {
			dir = filepath.Join(s.dir, dirExecs, execID) // one command of many
		}
	}
	if p := s.b.live.get(dir); p != nil && p.id == execID {
		return p, nil
	}
	// No record, or the empty one of a directory made ahead (aheadFiles):
	// no command has that id.
	data, err := os.ReadFile(filepath.Join(dir, fileExec))
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(data) == 0) {
		return nil, fmt.Errorf("sandbox %s: process %q: %w", s.id, execID, sandbox.ErrGone)
	}
	if err != nil {
		return nil, err
	}
	var rec execRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, fileExec), err)
	}
	if rec.ID != execID {
		return nil, fmt.Errorf("sandbox %s: process %q: %w", s.id, execID, sandbox.ErrGone)
	}
	return &process{s: s, id: execID, dir: dir}, nil
}

// killSandbox ends every process of a sandbox. The marker comes first:
// the shim checks it after placing init in the cgroups and before letting
// it run, so a Kill that races with the start is never lost.
func killSandbox(dir string, cg cgroupSet) error {
	if err := os.WriteFile(filepath.Join(dir, fileKilled), nil, 0o600); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // destroyed: nothing left to kill
		}
		return fmt.Errorf("kill: %w", err)
	}
	// A frozen task takes no signal until thawed (cgroup v1).
	cg.thaw()
	pids, err := cg.procs()
	// pid 1 first: its death takes the whole pid namespace with it. Only
	// signalled if it is in the sandbox's cgroup, so a recycled pid of
	// some other process is never hit.
	if initPID, perr := readPID(filepath.Join(dir, fileInitPID)); perr == nil {
		for _, pid := range pids {
			if pid == initPID {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// The network helper, if any, is in the cgroups too; by its record
	// it dies even if it is not (yet).
	killNetHelper(dir)
	if kerr := cg.kill(); err == nil {
		err = kerr
	}
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	return nil
}

// killExec ends one command of a kept sandbox: its marker (the shim
// checks it before it lets a command go), then every process of the
// command's cgroup, and its process group while its end is not recorded
// if that pid is in the sandbox's cgroups (a pid recycled outside the
// sandbox is never hit). The sandbox's other commands go on.
func killExec(dir, execID string, cg cgroupSet) error {
	if err := os.WriteFile(filepath.Join(dir, fileKilled), nil, 0o600); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // destroyed: nothing left to kill
		}
		return fmt.Errorf("kill: %w", err)
	}
	jobPID := 0
	if _, err := os.Lstat(filepath.Join(dir, fileExit)); errors.Is(err, os.ErrNotExist) {
		if pid, err := readPID(filepath.Join(dir, fileJobPID)); err == nil {
			if pids, _ := cg.procs(); slices.Contains(pids, pid) {
				jobPID = pid
			}
		}
	}
	// A paused sandbox is thawed until the command's end is recorded: its
	// processes take no signal while frozen (cgroup v1), and its init,
	// which reaps the command and reports its end, is frozen too. Then it
	// is frozen again.
	frozen := cg.frozen()
	if frozen {
		cg.thaw()
	}
	left := cg.killCommand(execID, jobPID)
	if frozen {
		pollUntil(2*time.Second, func() bool {
			_, err := os.Lstat(filepath.Join(dir, fileExit))
			return err == nil
		})
		if err := cg.freeze(5 * time.Second); err != nil {
			return fmt.Errorf("kill: pause the sandbox again: %w", err)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("kill: processes %v of command %s still alive", left, execID)
	}
	return nil
}

// pollUntil polls cond until it holds or the timeout passes.
func pollUntil(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Pause implements sandbox.Pauser: every process of the sandbox is frozen
// (cgroup freezer), its memory kept.
func (s *sbox) Pause(ctx context.Context) error {
	st, err := s.state()
	if err != nil {
		return s.goneOr(fmt.Errorf("pause: %w", err))
	}
	if err := st.Cgroup.freeze(5 * time.Second); err != nil {
		return s.goneOr(fmt.Errorf("pause sandbox %s: %w", s.id, err))
	}
	return nil
}

// Resume implements sandbox.Pauser.
func (s *sbox) Resume(ctx context.Context) error {
	st, err := s.state()
	if err != nil {
		return s.goneOr(fmt.Errorf("resume: %w", err))
	}
	if err := st.Cgroup.thaw(); err != nil {
		return s.goneOr(fmt.Errorf("resume sandbox %s: %w", s.id, err))
	}
	return nil
}

func readPID(file string) (int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid in %s", file)
	}
	return pid, nil
}

// shimAlive reports whether the shim recorded in dir is still running.
// The pid is trusted only if that process is still the shim of this
// sandbox (pids are reused) and not a zombie.
func shimAlive(dir string) (pid int, alive bool) {
	pid, err := readPID(filepath.Join(dir, fileShimPID))
	if err != nil {
		return 0, false
	}
	return pid, isShimOf(pid, dir)
}

func isShimOf(pid int, dir string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": comm may contain anything, so look after the
	// last parenthesis.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) != 3 || args[1] != shimCommand {
		return false
	}
	if args[2] == dir {
		return true
	}
	// A command's shim that its sandbox's keeper started (start_shim in
	// keeper_linux.c) has the keeper's command line: it is the keeper's
	// child, not the keeper. (A shim that supervised an earlier command
	// is named by that command's directory too, whose end it recorded.)
	execs := filepath.Dir(dir)
	if filepath.Base(execs) != dirExecs || args[2] != filepath.Dir(execs) {
		return false
	}
	keeper, err := readPID(filepath.Join(args[2], fileShimPID))
	fields := strings.Fields(string(stat[i+2:]))
	return err == nil && keeper != pid && len(fields) > 1 && fields[1] == strconv.Itoa(keeper)
}
