package local

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
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
	// maxEventsBytes caps the events file: status lines are small. Past
	// it only the latest line is kept (fileEventsLatest).
	maxEventsBytes = 1 << 20
)

// makeStatusFIFO creates the channel, writable by the job's user only, on
// a tmpfs of its own in the server's mount namespace (unmountSandbox
// removes it). The tmpfs also holds the sandbox's passwd and group
// (passwd_linux.go): its size is a cap, not a reservation.
func makeStatusFIFO(dir string, hostJob int) error {
	ch := filepath.Join(dir, dirChannel)
	if err := os.Mkdir(ch, 0o755); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	if err := unix.Mount("tmpfs", ch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,nr_inodes=8,mode=0755"); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	if err := unix.Mount("", ch, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	p := filepath.Join(dir, fileStatusFIFO)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	if err := os.Chown(p, hostJob, hostJob); err != nil {
		return fmt.Errorf("create the status channel: %w", err)
	}
	return writeAccounts(dir)
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
// until stop. The file keeps the first maxEventsBytes of whole lines; past
// that, only the latest line is kept (in the latest file, with the count
// of lines since the cap), so that a job flooding the channel neither
// fills the disk nor hides its last word. Once over the cap the bridge
// reads at a bounded pace: the flooding writer waits on the full pipe
// instead of spinning.
type statusBridge struct {
	fifo *os.File
	copy *statusCopier
	done chan struct{}
}

const (
	// maxStatusLine cuts longer lines (they are not status lines).
	maxStatusLine = 64 << 10
	// latestEvery is how often the latest line is written while a flood
	// goes on.
	latestEvery = 100 * time.Millisecond
	// floodPause is the pause between reads once over the cap.
	floodPause = 10 * time.Millisecond
)

// startStatusBridge opens the FIFO at path read-write, so that it never
// reports end-of-file between two writers, and starts copying.
func startStatusBridge(path string) (*statusBridge, error) {
	fifo, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
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
	c := &statusCopier{out: out, latestPath: fileEventsLatest, limit: maxEventsBytes}
	if st, err := out.Stat(); err == nil {
		c.written = st.Size()
	}
	b := &statusBridge{fifo: fifo, copy: c, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		defer out.Close()
		c.run(fifo)
	}()
	return b, nil
}

// statusCopier splits the channel into lines and keeps them (see
// statusBridge).
type statusCopier struct {
	out        io.Writer
	latestPath string
	limit      int64

	stopping   atomic.Bool
	written    int64  // bytes in the events file
	partial    []byte // the start of a line not ended yet
	cut        bool   // the current line is over maxStatusLine: drop the rest
	full       bool   // the events file is at its cap
	latest     []byte // the latest line past the cap
	count      int64  // lines past the cap
	dirty      bool   // latest not written yet
	lastLatest time.Time
}

func (c *statusCopier) run(fifo *os.File) {
	buf := make([]byte, 64<<10)
	for {
		// Wake up for the latest line when one is due; stop sets
		// stopping, then a deadline in the past, which must win.
		var deadline time.Time
		if c.dirty {
			deadline = c.lastLatest.Add(latestEvery)
		}
		fifo.SetReadDeadline(deadline)
		if c.stopping.Load() {
			fifo.SetReadDeadline(time.Now())
		}
		n, err := fifo.Read(buf)
		c.feed(buf[:n])
		if c.dirty && time.Since(c.lastLatest) >= latestEvery {
			c.writeLatest()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !c.stopping.Load() {
				continue // the latest line was due
			}
			break
		}
		if c.full {
			time.Sleep(floodPause)
		}
	}
	c.end()
}

// feed takes what was read from the channel.
func (c *statusCopier) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.addPartial(b)
			return
		}
		c.addPartial(b[:i])
		b = b[i+1:]
		c.line()
		if c.full && len(b) > 0 {
			// Past the cap only the last line matters: count the others.
			if j := bytes.LastIndexByte(b, '\n'); j >= 0 {
				c.count += int64(bytes.Count(b[:j], []byte{'\n'}))
				prev := bytes.LastIndexByte(b[:j], '\n')
				c.addPartial(b[prev+1 : j])
				c.line()
				b = b[j+1:]
			}
		}
	}
}

func (c *statusCopier) addPartial(b []byte) {
	if c.cut {
		return
	}
	if room := maxStatusLine - len(c.partial); len(b) > room {
		b, c.cut = b[:room], true
	}
	c.partial = append(c.partial, b...)
}

// line ends the current line.
func (c *statusCopier) line() {
	c.cut = false
	if !c.full && c.written+int64(len(c.partial))+1 <= c.limit {
		c.partial = append(c.partial, '\n')
		if _, err := c.out.Write(c.partial); err == nil {
			c.written += int64(len(c.partial))
		}
	} else {
		c.full = true
		c.latest = append(c.latest[:0], c.partial...)
		c.count++
		c.dirty = true
	}
	c.partial = c.partial[:0]
}

// end keeps what the job wrote last without a newline, and the latest
// line.
func (c *statusCopier) end() {
	if len(c.partial) > 0 {
		if !c.full && c.written+int64(len(c.partial)) <= c.limit {
			c.out.Write(c.partial) // as the job left it: the engine ends it
		} else {
			c.line()
		}
	}
	if c.dirty {
		c.writeLatest()
	}
}

// writeLatest publishes the latest line past the cap: its count, a
// newline, the line.
func (c *statusCopier) writeLatest() {
	data := append(strconv.AppendInt(nil, c.count, 10), '\n')
	data = append(data, c.latest...)
	if err := writeFileAtomic(c.latestPath, data, 0o600); err == nil {
		c.dirty = false
	}
	c.lastLatest = time.Now()
}

// readLatest reads what writeLatest wrote (zero when nothing was).
func readLatest(path string) (line string, count int64, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	head, rest, ok := bytes.Cut(data, []byte{'\n'})
	n, perr := strconv.ParseInt(string(head), 10, 64)
	if !ok || perr != nil {
		return "", 0, fmt.Errorf("%s: not a latest-line record", path)
	}
	return string(rest), n, nil
}

// stop lets what the job wrote before it ended be copied, then closes.
// The job is gone, so nothing more can arrive: once the pipe is empty the
// copy is ended at once (a read deadline in the past).
func (b *statusBridge) stop() {
	if b == nil {
		return
	}
	b.flush()
	b.copy.stopping.Store(true)
	b.fifo.SetReadDeadline(time.Now())
	<-b.done
	b.fifo.Close()
}

// flush waits a moment for what waits in the channel to be copied (the
// job has ended: nothing more of its own can come).
func (b *statusBridge) flush() {
	if b == nil {
		return
	}
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end) && b.pending() > 0; {
		time.Sleep(time.Millisecond)
	}
}

// pending is how many bytes wait in the pipe (FIONREAD, alias TIOCINQ).
func (b *statusBridge) pending() int {
	n := 0
	if rc, err := b.fifo.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	}
	return n
}
