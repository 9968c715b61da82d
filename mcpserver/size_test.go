package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/mcpserver"
)

// maxToolsListBytes is what the default toolset may cost an agent session:
// the compact JSON of tools/list's tools array. It is the one budget of
// every tool of the default toolset, present and to come, enforced here
// alone (docs/mcp.md lists what each tool costs). 8,000 bytes: "under 8 KB", and room kept for what comes.
const maxToolsListBytes = 8000

// TestToolsListSize prints the bytes of tools/list as the server writes
// them (through the stdio transport, raw) and fails above the budget.
//
//	go test -run ToolsListSize -v ./mcpserver/
func TestToolsListSize(t *testing.T) {
	rw := rawSession(t)
	rw.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	rw.receive(t)
	rw.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	rw.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	var resp struct {
		Result struct {
			Tools json.RawMessage `json:"tools"`
		} `json:"result"`
	}
	if err := json.Unmarshal(rw.receive(t), &resp); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, resp.Result.Tools); err != nil {
		t.Fatal(err)
	}
	var tools []json.RawMessage
	json.Unmarshal(resp.Result.Tools, &tools)
	for _, tool := range tools {
		var name struct{ Name string }
		json.Unmarshal(tool, &name)
		t.Logf("%-15s %5d bytes", name.Name, len(tool))
	}
	if os.Getenv("DUMP_TOOLS") != "" {
		os.WriteFile(os.Getenv("DUMP_TOOLS"), compact.Bytes(), 0o644)
	}
	t.Logf("tools/list: %d tools, %d bytes (budget %d)", len(tools), compact.Len(), maxToolsListBytes)
	if compact.Len() > maxToolsListBytes {
		t.Errorf("tools/list is %d bytes, over the budget of %d", compact.Len(), maxToolsListBytes)
	}
}

// rawConn speaks newline-delimited JSON-RPC to a server over the stdio
// transport, byte for byte.
type rawConn struct {
	w   io.Writer
	r   *bufio.Reader
	ctx context.Context
}

func rawSession(t *testing.T) *rawConn {
	return rawSessionWith(t, fullService(), mcpserver.Limits{}, inputs[0])
}

// An input is what a session reads from: the transport reads an OS pipe
// or socket through Go's poller, and any other reader on a goroutine of
// its own. Tests of what it reads run over both.
type input struct {
	name string
	pipe func(t *testing.T) (io.ReadCloser, io.WriteCloser)
}

var inputs = []input{
	{"OS pipe", blockingPipe}, // what `delegate serve` reads when a client starts it
	{"io.Pipe", func(*testing.T) (io.ReadCloser, io.WriteCloser) { return io.Pipe() }},
}

// rawSessionWith serves svc with the given limits, reading in.
func rawSessionWith(t *testing.T, svc *service, lim mcpserver.Limits, in input) *rawConn {
	t.Helper()
	return rawSessionLog(t, svc, lim, in, slog.New(slog.DiscardHandler))
}

// rawSessionLog is rawSessionWith with the server's log.
func rawSessionLog(t *testing.T, svc *service, lim mcpserver.Limits, in input, log *slog.Logger) *rawConn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	server := newServer(ctx, svc, log)
	inR, inW := in.pipe(t)
	outR, outW := io.Pipe()
	ss, err := server.Connect(ctx, mcpserver.StdioTransport(inR, outW, lim, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); inW.Close(); ss.Close() })
	return &rawConn{w: inW, r: newLineReader(outR), ctx: ctx}
}

func newLineReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 1<<20) }

func (c *rawConn) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.w, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// receive reads the next message the server writes.
func (c *rawConn) receive(t *testing.T) []byte {
	t.Helper()
	type line struct {
		data []byte
		err  error
	}
	ch := make(chan line, 1)
	go func() {
		b, err := c.r.ReadBytes('\n')
		ch <- line{b, err}
	}()
	select {
	case l := <-ch:
		if l.err != nil {
			t.Fatalf("reading the server: %v", l.err)
		}
		return bytes.TrimSpace(l.data)
	case <-time.After(10 * time.Second):
		t.Fatal("no message from the server in 10 s")
		return nil
	}
}

// TestSchemasAreObjects: every schema in tools/list, the tools' and their
// properties' down to the leaves, is a JSON object. JSON Schema allows
// true for "anything", and the SDK writes an empty schema so, but MCP
// clients refuse it (the conformance suite's tools-list failed on
// wait_job's timeout_seconds).
func TestSchemasAreObjects(t *testing.T) {
	rw := rawSession(t)
	rw.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	rw.receive(t)
	rw.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	rw.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	var resp struct {
		Result struct {
			Tools []struct {
				Name        string          `json:"name"`
				InputSchema json.RawMessage `json:"inputSchema"`
			} `json:"tools"`
		} `json:"result"`
	}
	if err := json.Unmarshal(rw.receive(t), &resp); err != nil {
		t.Fatal(err)
	}
	var walk func(tool, path string, raw json.RawMessage)
	walk = func(tool, path string, raw json.RawMessage) {
		var s map[string]json.RawMessage
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Errorf("%s: the schema at %s is %s, not an object", tool, path, raw)
			return
		}
		var props map[string]json.RawMessage
		json.Unmarshal(s["properties"], &props)
		for name, p := range props {
			walk(tool, path+"."+name, p)
		}
		if items, ok := s["items"]; ok {
			walk(tool, path+"[]", items)
		}
		var anyOf []json.RawMessage
		json.Unmarshal(s["anyOf"], &anyOf)
		for i, a := range anyOf {
			walk(tool, fmt.Sprintf("%s|%d", path, i), a)
		}
	}
	if len(resp.Result.Tools) == 0 {
		t.Fatal("tools/list listed no tools")
	}
	for _, tool := range resp.Result.Tools {
		walk(tool.Name, "inputSchema", tool.InputSchema)
	}
}
