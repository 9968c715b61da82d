package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/delegate-dev/delegate/sandbox"
)

// ListFiles implements sandbox.Files; see listWorkspace.
func (s *sbox) ListFiles(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.FileInfo, error) {
	out, err := listWorkspace(ctx, s.path(dirWorkspace), opts)
	if err != nil && !errors.Is(err, sandbox.ErrTruncated) {
		return nil, s.goneOr(err)
	}
	return out, err
}

// ReadEvents implements sandbox.Process: the lines the job wrote to its
// status channel, which the shim keeps in the events file.
func (p *process) ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error) {
	return p.readLog(fileEvents, offset, max)
}

// LatestEvent implements sandbox.LatestEvent: the latest status line once
// the events file is full.
func (p *process) LatestEvent(ctx context.Context) (string, int64, error) {
	return readLatest(p.path(fileEventsLatest))
}

// readLog reads part of a file the shim appends to (output, events).
func (p *process) readLog(name string, offset int64, max int) ([]byte, error) {
	if offset < 0 || max < 0 {
		return nil, fmt.Errorf("read %s: negative offset %d or max %d", name, offset, max)
	}
	f, err := os.Open(p.path(name))
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
