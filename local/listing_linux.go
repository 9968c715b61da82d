package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// maxListed bounds a workspace listing: a job could create millions of
// empty files to make the server's collection step slow.
const maxListed = 100000

// ListFiles implements sandbox.Sandbox: the regular files in the
// workspace, found without following symbolic links (WalkDir uses Lstat
// and does not descend into a link to a directory).
func (s *sbox) ListFiles(ctx context.Context) ([]sandbox.FileInfo, error) {
	root := s.path(dirWorkspace)
	fd, err := openWorkspace(root)
	if err != nil {
		return nil, s.goneOr(err)
	}
	unix.Close(fd)
	var out []sandbox.FileInfo
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if len(out) >= maxListed {
			return fmt.Errorf("more than %d files in /workspace", maxListed)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		out = append(out, sandbox.FileInfo{Path: path.Join("/workspace", filepath.ToSlash(rel)), Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, s.goneOr(fmt.Errorf("list /workspace: %w", err))
	}
	return out, nil
}

// ReadEvents implements sandbox.Process: the lines the job wrote to its
// status channel, which the shim keeps in the events file.
func (p *process) ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error) {
	return p.readLog(fileEvents, offset, max)
}

// LatestEvent implements sandbox.LatestEvent: the latest status line once
// the events file is full.
func (p *process) LatestEvent(ctx context.Context) (string, int64, error) {
	return readLatest(p.s.path(fileEventsLatest))
}

// readLog reads part of a file the shim appends to (output, events).
func (p *process) readLog(name string, offset int64, max int) ([]byte, error) {
	if offset < 0 || max < 0 {
		return nil, fmt.Errorf("read %s: negative offset %d or max %d", name, offset, max)
	}
	f, err := os.Open(p.s.path(name))
	if errors.Is(err, os.ErrNotExist) {
		if p.s.gone() {
			return nil, fmt.Errorf("sandbox %s: %w", p.s.id, sandbox.ErrGone)
		}
		return nil, nil // nothing written yet
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	n := min(int64(max), st.Size()-offset)
	if n <= 0 {
		return nil, nil
	}
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return buf[:got], nil
}
