package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/delegate-dev/delegate/internal/jsonin"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/semaphore"
)

// StdioTransport serves MCP over newline-delimited JSON-RPC on r and w
// (stdin and stdout), in place of the SDK's, whose reader ends the session
// on the first message over 16 MiB or that is not JSON: here a message up
// to lim.MaxMessage is read, a larger or malformed one is answered with a
// JSON-RPC error that says why, and the session goes on. The bytes of the
// messages being handled are bounded by lim.InFlight.
func StdioTransport(r io.ReadCloser, w io.Writer, lim Limits, log *slog.Logger) mcp.Transport {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &stdioTransport{r: r, w: w, lim: lim.withDefaults(), log: log}
}

type stdioTransport struct {
	r   io.ReadCloser
	w   io.Writer
	lim Limits
	log *slog.Logger
}

func (t *stdioTransport) Connect(context.Context) (mcp.Connection, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &stdioConn{
		r: t.r, w: t.w, lim: t.lim, log: t.log,
		budget: semaphore.NewWeighted(t.lim.InFlight),
		held:   map[jsonrpc.ID]int64{},
		closed: make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
	if f, ok := t.r.(*os.File); ok {
		polled, restore, err := pollable(f)
		if err == nil {
			c.polled, c.restore = polled, restore
			c.in = bufio.NewReaderSize(polled, 64<<10)
			return c, nil
		}
		t.log.Debug("MCP input read by a goroutine of its own", "input", f.Name(), "reason", err)
	}
	c.in = bufio.NewReaderSize(t.r, 64<<10)
	c.msgs = make(chan readResult)
	go c.readLoop()
	return c, nil
}

type readResult struct {
	msg jsonrpc.Message
	err error
}

// stdioConn is an mcp.Connection over a byte stream. It answers bad
// messages itself; the SDK sees only good ones. A pipe or a socket is read
// through Go's poller on the SDK's reading goroutine (polled); any other
// input by a goroutine of its own, so that Close can end a Read that waits
// on it, which no close of a blocking descriptor does.
type stdioConn struct {
	r   io.ReadCloser
	w   io.Writer
	lim Limits
	log *slog.Logger
	in  *bufio.Reader
	dec jsonin.Decoder

	polled  *os.File // r's pollable twin, or nil
	restore func()   // puts r back in blocking mode, if it was

	// budget holds the bytes of the messages read and not yet answered;
	// held says how many each request holds until its response is written.
	budget *semaphore.Weighted
	mu     sync.Mutex
	held   map[jsonrpc.ID]int64

	writeMu sync.Mutex

	msgs      chan readResult
	closed    chan struct{}
	closeOnce sync.Once
	ctx       context.Context // ends with Close: stops waiting for budget
	cancel    context.CancelFunc
}

func (c *stdioConn) SessionID() string { return "" }

func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	if c.polled != nil {
		// The SDK calls Read from one goroutine, which then hands the
		// message on: read here, and no thread waits in the kernel while
		// that goroutine waits for a thread.
		select {
		case <-c.closed:
			return nil, io.EOF
		default:
		}
		msg, err := c.next()
		if errors.Is(err, os.ErrClosed) {
			err = io.EOF // Close ended the read
		}
		return msg, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, io.EOF
	case r := <-c.msgs:
		return r.msg, r.err
	}
}

func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("encoding a message: %w", err)
	}
	err = c.writeLine(data)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		n := c.held[resp.ID]
		delete(c.held, resp.ID)
		c.mu.Unlock()
		c.release(n)
	}
	return err
}

func (c *stdioConn) writeLine(data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	// One write per message: data and its newline together.
	if _, err := c.w.Write(append(data, '\n')); err != nil {
		return err
	}
	return nil
}

func (c *stdioConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		c.cancel()
		if c.polled != nil {
			c.polled.Close() // ends a Read that waits
			c.restore()
		}
		err = c.r.Close()
		c.mu.Lock()
		var n int64
		for id, w := range c.held {
			n += w
			delete(c.held, id)
		}
		c.mu.Unlock()
		c.release(n)
	})
	return err
}

func (c *stdioConn) release(n int64) {
	if n > 0 {
		c.budget.Release(n)
	}
}

// readLoop reads messages until the input ends or the connection closes.
func (c *stdioConn) readLoop() {
	for {
		msg, err := c.next()
		select {
		case c.msgs <- readResult{msg, err}:
		case <-c.closed:
			return
		}
		if err != nil {
			return
		}
	}
}

// budgetStep is the granularity of what a message being read takes from
// the budget.
const budgetStep = 64 << 10

// next reads lines until one is a message for the SDK, answering the
// others; it returns an error only when the input fails or ends.
func (c *stdioConn) next() (jsonrpc.Message, error) {
	for {
		frame, taken, err := c.readFrame()
		if err != nil {
			return nil, err
		}
		if frame == nil {
			continue // answered already
		}
		if len(frame) > 0 && frame[0] == '[' {
			c.release(taken)
			c.answer(findID(frame), &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
				Message: "invalid request: JSON-RPC batches are not supported (MCP has none since 2025-06-18)"})
			continue
		}
		msg, id, jerr := decodeMessage(&c.dec, frame)
		if jerr != nil {
			c.release(taken)
			c.answer(id, jerr)
			continue
		}
		// A request holds its bytes until its response is written; the rest
		// is done with once the SDK has it (and small).
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			c.mu.Lock()
			c.held[req.ID] += taken
			c.mu.Unlock()
		} else {
			c.release(taken)
		}
		return msg, nil
	}
}

// readFrame reads one line. It returns the line (nil for an empty one, or
// one too large, which it has answered) and how much of the budget it took.
func (c *stdioConn) readFrame() (frame []byte, taken int64, err error) {
	take := func(size int) error {
		need := (int64(size) + budgetStep - 1) / budgetStep * budgetStep
		if need > taken {
			if err := c.budget.Acquire(c.ctx, need-taken); err != nil {
				return io.EOF // closed while waiting
			}
			taken = need
		}
		return nil
	}
	// A long line is kept in blocks and joined once, at its size: growing
	// one slice would copy it over and over.
	var blocks [][]byte
	size := 0
	for {
		chunk, rerr := c.in.ReadSlice('\n')
		if int64(size+len(chunk)) > c.lim.MaxMessage+2 { // +2: the line's \r\n
			c.release(taken)
			c.skipLine(blocks, chunk, rerr)
			return nil, 0, nil
		}
		if err := take(size + len(chunk)); err != nil {
			c.release(taken)
			return nil, 0, err
		}
		if rerr == nil && blocks == nil {
			// The usual case: the whole line was in the reader's buffer.
			frame = bytes.Clone(chunk)
			break
		}
		blocks = appendBlock(blocks, chunk)
		size += len(chunk)
		if rerr == nil {
			frame = join(blocks, size)
			break
		}
		if errors.Is(rerr, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(rerr, io.EOF) && len(bytes.TrimSpace(blocks[0])) > 0 {
			frame = join(blocks, size) // a last message without its newline
			break
		}
		c.release(taken)
		return nil, 0, rerr
	}
	frame = bytes.TrimSpace(frame)
	if len(frame) == 0 {
		c.release(taken)
		return nil, 0, nil
	}
	return frame, taken, nil
}

// appendBlock adds p to the last block, or to a new one twice as large.
func appendBlock(blocks [][]byte, p []byte) [][]byte {
	if n := len(blocks); n > 0 && cap(blocks[n-1])-len(blocks[n-1]) >= len(p) {
		blocks[n-1] = append(blocks[n-1], p...)
		return blocks
	}
	size := 256 << 10
	if n := len(blocks); n > 0 {
		size = min(2*cap(blocks[n-1]), 16<<20)
	}
	return append(blocks, append(make([]byte, 0, max(size, len(p))), p...))
}

func join(blocks [][]byte, size int) []byte {
	if len(blocks) == 1 {
		return blocks[0]
	}
	out := make([]byte, 0, size)
	for _, b := range blocks {
		out = append(out, b...)
	}
	return out
}

// skipLine discards the rest of a line too large to read, finding the
// request's id on the way, and answers it.
func (c *stdioConn) skipLine(blocks [][]byte, chunk []byte, rerr error) {
	var ids idScanner
	size := int64(len(chunk))
	for _, b := range blocks {
		ids.write(b)
		size += int64(len(b))
	}
	ids.write(chunk)
	for errors.Is(rerr, bufio.ErrBufferFull) {
		chunk, rerr = c.in.ReadSlice('\n')
		ids.write(chunk)
		size += int64(len(chunk))
	}
	c.log.Warn("MCP message over the size limit refused", "bytes", size, "limit", c.lim.MaxMessage)
	c.answer(ids.id(), c.lim.tooLarge(fmt.Sprintf("%d bytes", size)))
}

// answer writes an error response for a message the SDK will not see.
func (c *stdioConn) answer(id json.RawMessage, e *jsonrpc.Error) {
	c.log.Debug("MCP message refused", "id", string(id), "error", e.Message)
	if err := c.writeLine(errorResponse(id, e)); err != nil {
		c.log.Warn("answering a refused MCP message", "err", err)
	}
}
