//go:build unix

package workspace

import (
	"context"
	"errors"
	"io"
	"sync"
)

// Stream is a tree's archive as a reader, for a sandbox's PutArchive:
// written straight into the writer WriteTo is given (the pipe to the
// local backend's extract helper: no hand-off between goroutines on the
// way), or, read with Read, through a pipe from a goroutine of its own.
// Result says what Archive said.
type Stream struct {
	ctx  context.Context
	t    *Tree
	opts ArchiveOptions

	once sync.Once
	pr   *io.PipeReader // Read's
	done chan struct{}  // closed when Archive has returned
	base *Baseline
	err  error
}

// errNotRead is a Stream's Result when nothing ever read it.
var errNotRead = errors.New("the archive was not read")

// Stream returns the tree's archive (Archive's, with opts) as a reader.
func (t *Tree) Stream(ctx context.Context, opts ArchiveOptions) *Stream {
	return &Stream{ctx: ctx, t: t, opts: opts, done: make(chan struct{})}
}

// WriteTo writes the whole archive to w (io.Copy prefers it to Read); a
// stream that Read has begun to read is copied from there.
func (s *Stream) WriteTo(w io.Writer) (int64, error) {
	var n int64
	ran := false
	s.once.Do(func() {
		ran = true
		cw := &countingWriter{w: w}
		s.base, s.err = s.t.Archive(s.ctx, cw, s.opts)
		n = cw.n
		close(s.done)
	})
	if !ran {
		return io.Copy(w, s.pr)
	}
	return n, s.err
}

// Read reads the archive, which a goroutine writes into a pipe.
func (s *Stream) Read(p []byte) (int, error) {
	s.once.Do(func() {
		pr, pw := io.Pipe()
		s.pr = pr
		go func() {
			s.base, s.err = s.t.Archive(s.ctx, pw, s.opts)
			pw.CloseWithError(s.err)
			close(s.done)
		}()
	})
	if s.pr == nil {
		return 0, io.EOF // WriteTo wrote it
	}
	return s.pr.Read(p)
}

// Close ends the stream: the goroutine that Read started stops writing
// (its reader stopped reading) and is waited for.
func (s *Stream) Close() error {
	s.once.Do(func() {
		s.err = errNotRead
		close(s.done)
	})
	if s.pr != nil {
		s.pr.CloseWithError(errors.New("the archive's reader stopped reading"))
	}
	<-s.done
	return nil
}

// Result is the baseline of what was written, or why the archive failed;
// it waits for Archive, so call it after the stream was read or closed.
func (s *Stream) Result() (*Baseline, error) {
	<-s.done
	return s.base, s.err
}

// countingWriter counts what it writes.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
