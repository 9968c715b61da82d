//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// workspaceResolve confines every lookup below the workspace root and
// refuses symlinks outright: the job owns the workspace and may have
// planted links (to /etc, to the server's files) or swap them in while we
// look, and only the kernel can resolve a path atomically.
const workspaceResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// workspaceRel maps an absolute sandbox path inside /workspace to a path
// relative to the workspace root, or explains why it is not allowed.
func workspaceRel(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("path %q must be absolute", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q contains a NUL byte", p)
	}
	rel, ok := strings.CutPrefix(path.Clean(p), "/workspace/")
	if !ok {
		return "", fmt.Errorf("path %q is outside /workspace, the only place the local backend reads and writes", p)
	}
	return rel, nil
}

// openWorkspace opens the workspace root, making sure it is the tmpfs,
// or the overlay of a sandbox with checkpoints (layers_linux.go), and
// not the empty directory under it, after an unmount.
func openWorkspace(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open workspace: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.TMPFS_MAGIC && st.Type != unix.OVERLAYFS_SUPER_MAGIC {
		unix.Close(fd)
		return -1, errors.New("the sandbox workspace is not mounted")
	}
	return fd, nil
}

// explain turns the errors of a confined lookup into words.
func explain(op, p string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s %s: the path contains a symlink, which is not followed: %w", op, p, err)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s %s: the path leaves the workspace: %w", op, p, err)
	case errors.Is(err, unix.ENXIO):
		return fmt.Errorf("%s %s: not a regular file: %w", op, p, err)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// checkRegular checks that fd is a regular file (not a FIFO a job planted
// to block us, nor a device).
func checkRegular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("not a regular file")
	}
	return nil
}

// writeWorkspaceFile writes data to p (inside /workspace), creating its
// parent directories; everything it creates belongs to the job's user,
// the owner of the workspace's root (the tmpfs is mounted so, and a job
// cannot give it away).
func writeWorkspaceFile(wsDir, p string, data []byte, mode fs.FileMode) error {
	rel, err := workspaceRel(p)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	cur, err := openWorkspace(wsDir)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer func() { unix.Close(cur) }()
	var root unix.Stat_t
	if err := unix.Fstat(cur, &root); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	uid, gid := int(root.Uid), int(root.Gid)
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		created := false
		switch err := unix.Mkdirat(cur, name, 0o755); {
		case err == nil:
			created = true
		case !errors.Is(err, unix.EEXIST):
			return explain("write", p, err)
		}
		next, err := unix.Openat2(cur, name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: workspaceResolve,
		})
		if err != nil {
			var st unix.Stat_t
			if unix.Fstatat(cur, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP // O_DIRECTORY|O_NOFOLLOW says ENOTDIR
			}
			return explain("write", p, err)
		}
		unix.Close(cur)
		cur = next
		if created {
			if err := unix.Fchown(cur, uid, gid); err != nil {
				return explain("write", p, err)
			}
		}
	}
	if mode&fs.ModeSymlink != 0 {
		// A link, as the job's user's: it resolves inside the sandbox
		// only (every lookup of ours refuses links).
		name := parts[len(parts)-1]
		if err := unix.Symlinkat(string(data), cur, name); err != nil {
			return explain("write", p, err)
		}
		if err := unix.Fchownat(cur, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return explain("write", p, err)
		}
		return nil
	}
	// No O_TRUNC before we know it is a regular file; O_NONBLOCK so a FIFO
	// cannot make us wait.
	fd, err := unix.Openat2(cur, parts[len(parts)-1], &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Mode:    0o600,
		Resolve: workspaceResolve,
	})
	if err != nil {
		return explain("write", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	for _, step := range []func() error{
		func() error { return checkRegular(fd) },
		func() error { return unix.Ftruncate(fd, 0) },
		func() error { return unix.Fchown(fd, uid, gid) },
		func() error { return unix.Fchmod(fd, uint32(mode.Perm())) },
		func() error { _, err := f.Write(data); return err },
	} {
		if err := step(); err != nil {
			return explain("write", p, err)
		}
	}
	if err := f.Close(); err != nil {
		return explain("write", p, err)
	}
	return nil
}

// readWorkspaceFile reads at most max bytes of p (inside /workspace) from
// offset on.
func readWorkspaceFile(wsDir, p string, offset, max int64) ([]byte, error) {
	if max < 0 || offset < 0 {
		return nil, fmt.Errorf("read %s: negative offset %d or max %d", p, offset, max)
	}
	rel, err := workspaceRel(p)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	ws, err := openWorkspace(wsDir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer unix.Close(ws)
	fd, err := unix.Openat2(ws, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: workspaceResolve,
	})
	if err != nil {
		return nil, explain("read", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := checkRegular(fd); err != nil {
		return nil, explain("read", p, err)
	}
	// One buffer of the size there is to read (io.ReadAll would grow one
	// step by step: a 1 MiB read took 2.6 ms instead of 0.9), one byte
	// more to see a file that grows meanwhile.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, explain("read", p, err)
	}
	want := st.Size - offset
	if want > max {
		want = max
	}
	if want < 0 {
		want = 0
	}
	data := make([]byte, 0, want+1)
	r := io.LimitReader(io.NewSectionReader(f, offset, math.MaxInt64-offset), max)
	for {
		n, err := r.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			return data, nil
		}
		if err != nil {
			return nil, explain("read", p, err)
		}
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
	}
}

// maxListed bounds a workspace listing without a limit of its own: a job
// could create millions of empty files to make the server's collection
// step slow.
const maxListed = 100000

// listWorkspace lists what is under a directory of the workspace. Every
// directory is opened beneath the one above it without following links
// (openat2), so a job that swaps a directory for a link to the host's
// /etc while it is listed gets an error, never the host's names.
func listWorkspace(ctx context.Context, wsDir string, opts sandbox.ListOptions) ([]sandbox.FileInfo, error) {
	dir := path.Clean(opts.Dir)
	if opts.Dir == "" {
		dir = delegate.Workspace
	}
	ws, err := openWorkspace(wsDir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	defer unix.Close(ws)
	start := ws
	if dir != delegate.Workspace {
		rel, err := workspaceRel(dir)
		if err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		if start, err = unix.Openat2(ws, rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: workspaceResolve,
		}); err != nil {
			return nil, explain("list", dir, err)
		}
		defer unix.Close(start)
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = maxListed
	}
	var out []sandbox.FileInfo
	var walk func(fd int, at string, level int) error
	walk = func(fd int, at string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A duplicate of the descriptor: os.File closes what it reads.
		dup, err := unix.Dup(fd)
		if err != nil {
			return err
		}
		d := os.NewFile(uintptr(dup), at)
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return explain("list", at, err)
		}
		slices.Sort(names)
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue // gone since it was listed
				}
				return explain("list", path.Join(at, name), err)
			}
			info := sandbox.FileInfo{Path: path.Join(at, name), Size: st.Size, Mode: fileMode(st.Mode),
				ModTime: time.Unix(st.Mtim.Unix())}
			if info.Mode.Type() == fs.ModeSymlink {
				buf := make([]byte, 4096)
				if n, err := unix.Readlinkat(fd, name, buf); err == nil {
					info.Link = string(buf[:n])
				}
			}
			if !opts.Regular || info.Mode.IsRegular() {
				if len(out) >= limit {
					if opts.Limit > 0 {
						return sandbox.ErrTruncated
					}
					return fmt.Errorf("more than %d entries under %s", maxListed, dir)
				}
				out = append(out, info)
			}
			if info.Mode.IsDir() && (opts.Depth <= 0 || level < opts.Depth) {
				sub, err := unix.Openat2(fd, name, &unix.OpenHow{
					Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
					Resolve: workspaceResolve,
				})
				if err != nil {
					return explain("list", info.Path, err)
				}
				err = walk(sub, info.Path, level+1)
				unix.Close(sub)
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	err = walk(start, dir, 1)
	if errors.Is(err, sandbox.ErrTruncated) {
		return out, err
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// fileMode turns a stat mode into an fs.FileMode (type and permissions).
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
