package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/mcpserver"
)

type wireResponse struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (c *rawConn) response(t *testing.T) wireResponse {
	t.Helper()
	data := c.receive(t)
	var r wireResponse
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("response %s: %v", data, err)
	}
	return r
}

func (c *rawConn) initialize(t *testing.T) {
	t.Helper()
	c.send(t, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if r := c.response(t); r.Error != nil {
		t.Fatalf("initialize: %+v", r.Error)
	}
	c.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
}

// alive checks that the session still answers.
func (c *rawConn) alive(t *testing.T, id int) {
	t.Helper()
	c.send(t, `{"jsonrpc":"2.0","id":`+itoa(id)+`,"method":"tools/call","params":{"name":"get_job_status","arguments":{"job_id":"job-1"}}}`)
	if r := c.response(t); r.Error != nil || string(r.ID) != itoa(id) || !strings.Contains(string(r.Result), `\"status\":\"failed\"`) {
		t.Fatalf("the session does not answer after a bad message: %+v %s", r.Error, r.Result)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestStdioBadMessages: a message that is too large, not JSON, not
// JSON-RPC, or has a key twice is answered with a JSON-RPC error saying
// so (with its id when it can be found), and the session goes on.
func TestStdioBadMessages(t *testing.T) {
	const limit = 1 << 20
	big := strings.Repeat("a", limit)
	tests := []struct {
		name, line string
		id         string // the id the error response must carry
		code       int
		want       string
	}{
		{"too large, id last (as the TypeScript SDK writes)",
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"` + big + `"}}},"id":"req-7"}`,
			`"req-7"`, -32600, "request too large: 1048" /* …bytes */},
		{"too large, id first", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"x":"` + big + `"}}`, `8`, -32600, "over delegate's limit of 1048576 bytes (1 MiB; the files of a manifest may total 64 MiB)"},
		{"not JSON", `{"jsonrpc":"2.0","id":3,"method":`, `3`, -32700, "not valid JSON"},
		{"garbage", `hello`, `null`, -32700, "not valid JSON"},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"params\":{\"a\":\"\xff\"}}", `4`, -32700, "params.a: not valid UTF-8"},
		{"method twice", `{"jsonrpc":"2.0","id":5,"method":"ping","method":"tools/call"}`, `5`, -32600, "method: duplicate key"},
		{"arguments twice", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"get_job_status","arguments":{"job_id":"a"},"arguments":{"job_id":"b"}}}`,
			`6`, -32602, "params.arguments: duplicate key"},
		{"a key twice deep down", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"a","task":"b"}}}}`,
			`9`, -32602, "params.arguments.manifest.task: duplicate key"},
		{"escaped twin", `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"get_job_status","arguments":{"job_id":"a","job\u005fid":"b"}}}`,
			`10`, -32602, "params.arguments.job_id: duplicate key"},
		{"not JSON-RPC 2.0", `{"jsonrpc":"1.0","id":11,"method":"ping"}`, `11`, -32600, `jsonrpc: must be "2.0"`},
		{"unknown member", `{"jsonrpc":"2.0","id":12,"method":"ping","extra":1}`, `12`, -32600, "extra: unknown field"},
		{"batch", `[{"jsonrpc":"2.0","id":13,"method":"ping"}]`, `null`, -32600, "batches are not supported"},
		{"not an object", `"ping"`, `null`, -32600, "must be an object"},
	}
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			rw := rawSessionWith(t, fullService(), mcpserver.Limits{MaxMessage: limit}, in)
			rw.initialize(t)
			for i, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					rw.send(t, tc.line)
					r := rw.response(t)
					if r.Error == nil || string(r.ID) != tc.id || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.want) {
						t.Errorf("response id %s error %+v; want id %s, code %d, %q", r.ID, r.Error, tc.id, tc.code, tc.want)
					}
					rw.alive(t, 100+i)
				})
			}
			// Blank lines and CRLF line ends are fine.
			rw.send(t, "")
			rw.send(t, `{"jsonrpc":"2.0","id":"crlf","method":"ping"}`+"\r")
			if r := rw.response(t); r.Error != nil || string(r.ID) != `"crlf"` {
				t.Errorf("ping with CRLF: %s %+v", r.ID, r.Error)
			}
		})
	}
}

// TestStdioLargeMessage: a message just under the limit is read whole.
func TestStdioLargeMessage(t *testing.T) {
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) { stdioLargeMessage(t, in) })
	}
}

func stdioLargeMessage(t *testing.T, in input) {
	const limit = 4 << 20
	svc := fullService()
	var got atomic.Int64
	svc.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		got.Store(int64(len(m.Task)))
		return &delegate.Job{ID: "job-1", Status: delegate.StatusPending}, nil
	}
	rw := rawSessionWith(t, svc, mcpserver.Limits{MaxMessage: limit}, in)
	rw.initialize(t)
	head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"`
	tail := `"}}}}`
	task := strings.Repeat("x", limit-len(head)-len(tail))
	rw.send(t, head+task+tail)
	if r := rw.response(t); r.Error != nil || got.Load() != int64(len(task)) {
		t.Fatalf("a message of exactly the limit: %+v, task of %d bytes", r.Error, got.Load())
	}
}

// TestStdioInFlightBound: while large requests are being handled, reading
// the next one waits until their bytes are answered for.
func TestStdioInFlightBound(t *testing.T) {
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) { stdioInFlightBound(t, in) })
	}
}

func stdioInFlightBound(t *testing.T, in input) {
	const size = 600 << 10
	svc := fullService()
	release := make(chan struct{})
	var started atomic.Int32
	svc.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		started.Add(1)
		<-release
		return &delegate.Job{ID: "job-1", Status: delegate.StatusPending}, nil
	}
	rw := rawSessionWith(t, svc, mcpserver.Limits{MaxMessage: 1 << 20, InFlight: 1 << 20}, in)
	rw.initialize(t)
	submit := func(id int) string {
		return `{"jsonrpc":"2.0","id":` + itoa(id) + `,"method":"tools/call","params":{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"` +
			strings.Repeat("x", size) + `"}}}}`
	}
	rw.send(t, submit(1))
	testkit.Eventually(t, 10*time.Second, "the first request handled", func() bool { return started.Load() == 1 })
	sent := make(chan struct{})
	go func() {
		rw.send(t, submit(2)) // the pipe takes it only as fast as the server reads
		close(sent)
	}()
	// What no event announces: a read that should not happen. A moment
	// for it to, if the bound let it.
	time.Sleep(300 * time.Millisecond)
	select {
	case <-sent:
		t.Fatal("a second 600 KiB request was read while the first held 600 KiB of a 1 MiB bound")
	default:
	}
	if started.Load() != 1 {
		t.Fatal("the second request was handled before the first was answered")
	}
	close(release)
	for _, want := range []string{"1", "2"} {
		if r := rw.response(t); r.Error != nil || string(r.ID) != want {
			t.Fatalf("response %s %+v, want id %s", r.ID, r.Error, want)
		}
	}
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the second request was never read")
	}
}
