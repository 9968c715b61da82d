package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The status channel: a FIFO in the sandbox directory, bound at
// StatusFile inside, so that a job with no network can still report in
// one line of shell (echo "step 2" > "$DELEGATE_STATUS_FILE"). The shim,
// which outlives the server, copies what arrives into the events file,
// where the engine reads it like the output.
const (
	// StatusFile is the channel's path inside the sandbox.
	StatusFile = "/run/delegate/status"
	// maxEventsBytes caps the events file: status lines are small.
	maxEventsBytes = 1 << 20
)

// makeStatusFIFO creates the channel, writable by the job's user only.
func makeStatusFIFO(dir string) error {
	p := filepath.Join(dir, fileStatusFIFO)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	if err := os.Chown(p, hostJobID, hostJobID); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	return nil
}

// bindStatusFIFO makes the channel appear at StatusFile in the new root
// (before the root is made read-only).
func bindStatusFIFO(root string) error {
	if _, err := os.Lstat(fileStatusFIFO); errors.Is(err, os.ErrNotExist) {
		return nil // a sandbox made before the channel existed
	}
	dir := filepath.Join(root, filepath.Dir(StatusFile))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("status channel: %w", err)
	}
	target := filepath.Join(root, StatusFile)
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("status channel: %w", err)
	}
	f.Close()
	if err := unix.Mount(fileStatusFIFO, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("status channel: %w", err)
	}
	return nil
}

// statusBridge copies status lines from the FIFO into the events file
// until stop, keeping at most maxEventsBytes.
type statusBridge struct {
	fifo *os.File
	done chan struct{}
}

// startStatusBridge opens the FIFO read-write, so that it never reports
// end-of-file between two writers, and starts copying.
func startStatusBridge() (*statusBridge, error) {
	fifo, err := os.OpenFile(fileStatusFIFO, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the status channel: %w", err)
	}
	out, err := os.OpenFile(fileEvents, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		fifo.Close()
		return nil, fmt.Errorf("open the events file: %w", err)
	}
	b := &statusBridge{fifo: fifo, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		defer out.Close()
		io.Copy(&cappedWriter{w: out, limit: maxEventsBytes}, fifo)
	}()
	return b, nil
}

// stop lets what the job wrote before it ended be copied, then closes.
// The job is gone, so nothing more can arrive: once the pipe is empty the
// copy is ended at once (a read deadline in the past).
func (b *statusBridge) stop() {
	if b == nil {
		return
	}
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end) && b.pending() > 0; {
		time.Sleep(time.Millisecond)
	}
	b.fifo.SetReadDeadline(time.Now())
	<-b.done
	b.fifo.Close()
}

// pending is how many bytes wait in the pipe (FIONREAD, alias TIOCINQ).
func (b *statusBridge) pending() int {
	n := 0
	if rc, err := b.fifo.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	}
	return n
}

// cappedWriter keeps the first limit bytes and swallows the rest.
type cappedWriter struct {
	w     io.Writer
	limit int64
	n     int64
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if room := c.limit - c.n; room > 0 {
		k := min(int64(len(p)), room)
		if _, err := c.w.Write(p[:k]); err != nil {
			return 0, err
		}
		c.n += k
	}
	return len(p), nil
}
