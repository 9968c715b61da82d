//go:build linux

package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
	"golang.org/x/sys/unix"
)

var (
	_ sandbox.Archiver      = (*sbox)(nil)
	_ sandbox.HostWorkspace = (*sbox)(nil)
)

// The extract helper (extractCommand) unpacks an archive into a sandbox's
// workspace: this binary re-executed, placed in the sandbox's cgroups
// before it reads a byte, so that the workspace's pages (a tmpfs: memory)
// are charged to the job's memory limit and not to the server's. A
// thread of the server could not do that: the kernel charges a tmpfs page
// to the memory cgroup of the writing process, not of its thread.

// extractResult is what the helper prints on its stdout.
type extractResult struct {
	Files   int      `json:"files"`
	Dirs    int      `json:"dirs"`
	Bytes   int64    `json:"bytes"`
	Skipped []string `json:"skipped,omitempty"`
	Error   string   `json:"error,omitempty"`
	// Bad: the archive broke a rule (a name, a link in the way), not the
	// helper.
	Bad bool `json:"bad,omitempty"`
}

// WorkspaceDir implements sandbox.HostWorkspace: the workspace's tmpfs.
func (s *sbox) WorkspaceDir() string { return s.path(dirWorkspace) }

// PutArchive implements sandbox.Archiver with workspace.Extract, in the
// extract helper (see extractCommand): as the workspace's owner (the
// job's user), beneath it, never through a link.
func (s *sbox) PutArchive(ctx context.Context, r io.Reader) (sandbox.Unpacked, error) {
	if s.gone() {
		return sandbox.Unpacked{}, fmt.Errorf("sandbox %s: %w", s.id, sandbox.ErrGone)
	}
	st, err := s.state()
	if err != nil {
		return sandbox.Unpacked{}, s.goneOr(fmt.Errorf("put archive: %w", err))
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(s.b.shims.selfExe, extractCommand, s.path(dirWorkspace))
	// Nothing of the server's environment: the C helpers' constructor
	// must not take it for a shim.
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return sandbox.Unpacked{}, fmt.Errorf("put archive: %w", err)
	}
	// The parent-death signal fires when the thread that forked the helper
	// ends, not the process, and the server ends threads (a goroutine that
	// made a network namespace exits locked to its thread). Held until the
	// helper is waited for, the forking thread is this goroutine's alone.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return sandbox.Unpacked{}, fmt.Errorf("put archive: start the helper: %w", err)
	}
	if err := st.Cgroup.addProc(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return sandbox.Unpacked{}, fmt.Errorf("put archive: charge the helper to the sandbox: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	_, copyErr := copyToHelper(stdin, r)
	stdin.Close()
	waitErr := cmd.Wait()
	var res extractResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		if ctx.Err() != nil {
			return sandbox.Unpacked{}, ctx.Err()
		}
		return sandbox.Unpacked{}, s.goneOr(fmt.Errorf("put archive: the helper failed (%v): %s", waitErr, strings.TrimSpace(errOut.String())))
	}
	got := sandbox.Unpacked{Files: res.Files, Dirs: res.Dirs, Bytes: res.Bytes, Skipped: res.Skipped}
	switch {
	case res.Bad:
		return got, fmt.Errorf("%w: %s", sandbox.ErrBadArchive, res.Error)
	case res.Error != "":
		return got, s.goneOr(fmt.Errorf("put archive: %s", res.Error))
	case copyErr != nil && !errors.Is(copyErr, syscall.EPIPE):
		// The stream failed (the engine's archive of a source that
		// changed meanwhile, say): what was unpacked is not all of it.
		return got, fmt.Errorf("put archive: %w", copyErr)
	}
	return got, nil
}

// helperPipeSize is the size asked for the pipe to the extract helper
// (the kernel's default is 64 KiB; 1 MiB is what an unprivileged process
// may ask for by default): the archive's writer and the helper hand each
// other a pipe's worth at a time, each hand-off a wake-up on both sides.
const helperPipeSize = 1 << 20

// copyToHelper copies the archive r to the helper's stdin w: with r's
// WriteTo when it has one (the archive written straight into the pipe),
// else in 256 KiB reads (io.Copy's own, 32 KiB, made eight times the
// hand-offs with the archive's writer).
func copyToHelper(w io.Writer, r io.Reader) (int64, error) {
	if f, ok := w.(*os.File); ok {
		// Fd puts the pipe in blocking mode: a full pipe blocks the
		// writing thread in the kernel, which the helper's read wakes,
		// instead of parking the goroutine for the runtime's poller to
		// wake (one more thread's wake-up each time, a scheduling delay
		// each on a busy host).
		unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, helperPipeSize) // best effort
	}
	if wt, ok := r.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.CopyBuffer(struct{ io.Writer }{w}, r, make([]byte, 256<<10))
}

// runExtract is the extract helper: it unpacks the archive on its stdin
// into the directory it is given, as the directory's owner, and prints
// an extractResult.
func runExtract(args []string) int {
	if len(args) != 1 || !strings.HasPrefix(args[0], "/") {
		fmt.Fprintln(os.Stderr, "usage: "+extractCommand+" <absolute workspace dir> <archive"+" (internal)")
		return 2
	}
	// The workspace's tmpfs bounds the bytes and the files (its size and
	// inodes are the job's disk).
	got, err := workspace.Extract(context.Background(), rawReader(0), args[0], workspace.ExtractOptions{MaxBytes: math.MaxInt64, MaxFiles: math.MaxInt32})
	var res extractResult
	if got != nil {
		res = extractResult{Files: got.Files, Dirs: got.Dirs, Bytes: got.Bytes}
		for _, sk := range got.Skipped {
			res.Skipped = append(res.Skipped, sk.Path+": "+sk.Reason)
		}
	}
	if err != nil {
		res.Error = err.Error()
		res.Bad = badArchive(err)
	}
	json.NewEncoder(os.Stdout).Encode(res)
	if err != nil {
		return 1
	}
	return 0
}

// badArchive tells an archive that breaks a rule from a failure of the
// helper's own.
func badArchive(err error) bool {
	for _, e := range []error{workspace.ErrBadArchive, workspace.ErrSymlink, workspace.ErrRefused, workspace.ErrOutside,
		workspace.ErrNotDirectory, syscall.ENOTDIR, syscall.ELOOP, syscall.EEXIST} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// GetArchive implements sandbox.Archiver: the workspace as it is, read as
// its owner beneath it (workspace.Scan and Archive), as a plain tar.
func (s *sbox) GetArchive(ctx context.Context) (io.ReadCloser, error) {
	return archiveOf(ctx, s, "")
}

var _ sandbox.DirArchiver = (*sbox)(nil)

// GetDirArchive implements sandbox.DirArchiver: the directory's tree
// alone, opened beneath the workspace without following a link on the
// way (workspace.ScanOptions.Within).
func (s *sbox) GetDirArchive(ctx context.Context, dir string) (io.ReadCloser, error) {
	if !fs.ValidPath(dir) || dir == "." {
		return nil, fmt.Errorf("get archive of %q: not a clean relative path", dir)
	}
	return archiveOf(ctx, s, dir)
}

// archiveOf is the tree of the workspace's directory sub ("": all).
func archiveOf(ctx context.Context, s *sbox, sub string) (io.ReadCloser, error) {
	dir := s.path(dirWorkspace)
	fd, err := openWorkspace(dir)
	if err != nil {
		return nil, s.goneOr(fmt.Errorf("get archive: %w", err))
	}
	syscall.Close(fd)
	opts := workspace.ScanOptions{IncludeIgnored: true, MaxBytes: math.MaxInt64, MaxFiles: math.MaxInt32}
	root := dir
	if sub != "" {
		root, opts.Within = filepath.Join(dir, filepath.FromSlash(sub)), dir
	}
	tree, err := workspace.Scan(ctx, root, opts)
	if err != nil {
		return nil, s.goneOr(fmt.Errorf("get archive: %w", err))
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := tree.Archive(ctx, pw, workspace.ArchiveOptions{NoBaseline: true})
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// rawReader reads a blocking descriptor with raw system calls: the
// runtime does not see them (no hand-off of the processor while the
// pipe waits for the server, no wake-ups of sysmon after one). For the
// extract helper only, a process that does nothing else.
type rawReader int

func (r rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(r), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return os.Stdin.Read(p) // not blocking after all: the runtime's way
		case e != 0:
			return 0, e
		case n == 0:
			return 0, io.EOF
		}
		return int(n), nil
	}
}
