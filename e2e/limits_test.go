package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestLargeRequests: a submit_job carrying the documented maximum of
// files (64 MiB, 85 MiB of base64) passes both transports and its files
// arrive byte for byte; a larger request is refused with a JSON-RPC
// error that names the limit, and the session goes on.
func TestLargeRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few hundred MiB")
	}
	const size = 64 << 20 // delegate.MaxFileBytesTotal
	data := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{7})
	rng.Read(data)
	sum := sha256.Sum256(data)
	content := base64.StdEncoding.EncodeToString(data)
	data = nil
	over := content + strings.Repeat("A", 12<<20) // 97 MiB of base64: over the 96 MiB limit

	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			dataDir := t.TempDir()
			var cs *mcp.ClientSession
			if transport == "stdio" {
				cs, _, _ = stdioSession(t, dataDir, "")
			} else {
				cs = httpSession(t, httpServer(t, dataDir), "2025-11-25")
			}
			manifest := func(content string) map[string]any {
				return map[string]any{
					"agentType": "script",
					"task":      "wc -c < big.bin; sha256sum big.bin | cut -d' ' -f1",
					"files":     []map[string]string{{"path": "big.bin", "content": content}},
					"resources": map[string]any{"disk": "256M", "memory": "512M"},
					"timeout":   300,
				}
			}
			start := time.Now()
			sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": manifest(content)})
			t.Logf("submit_job with %d MiB of files (%d MiB of base64) over %s: %v", size>>20, len(content)>>20, transport, time.Since(start))
			st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
			for !strings.Contains("success failed timeout cancelled", st.Status) {
				st = call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
			}
			res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
			if want := fmt.Sprintf("%d\n%s\n", size, hex.EncodeToString(sum[:])); res.Status != "success" || res.Output != want {
				t.Fatalf("the job saw %q (%s, %s), want %q", res.Output, res.Status, res.Error, want)
			}

			_, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "submit_job", Arguments: map[string]any{"manifest": manifest(over)}})
			if err == nil || !strings.Contains(err.Error(), "request too large") || !strings.Contains(err.Error(), "limit of 100663296 bytes (96 MiB") {
				t.Fatalf("a 97 MiB request: %v, want an error naming the limit", err)
			}
			// The session, and the server, go on.
			if st := call[statusOut](t, cs, "get_job_status", map[string]any{"job_id": sub.JobID}); st.Status != "success" {
				t.Fatalf("after the refused request: %+v", st)
			}
		})
	}
}

// TestMalformedMessages: a line of stdio or an HTTP body that is not
// JSON, or has a key twice, is answered with a JSON-RPC error; the server
// does not exit and the session goes on.
func TestMalformedMessages(t *testing.T) {
	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(binary, "serve")
		cmd.Env = serverEnv(t.TempDir())
		stderr := &syncBuffer{}
		cmd.Stderr = stderr
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stdin.Close()
			cmd.Wait()
			if t.Failed() {
				t.Logf("server stderr:\n%s", stderr)
			}
		})
		lines := bufio.NewReader(stdout)
		exchange := func(line string) map[string]any {
			t.Helper()
			if _, err := io.WriteString(stdin, line+"\n"); err != nil {
				t.Fatalf("write: %v (did the server exit?)", err)
			}
			got := make(chan []byte, 1)
			go func() { b, _ := lines.ReadBytes('\n'); got <- b }()
			select {
			case b := <-got:
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatalf("server wrote %q: %v", b, err)
				}
				return m
			case <-time.After(20 * time.Second):
				t.Fatal("no answer in 20 s")
				return nil
			}
		}
		exchange(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		io.WriteString(stdin, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
		for _, tc := range []struct{ line, want string }{
			{`{"jsonrpc":"2.0","id":2,"method":"tools/list"`, "not valid JSON"},
			{"\x00\x01garbage", "not valid JSON"},
			{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"echo a","task":"echo b"}}}}`,
				"params.arguments.manifest.task: duplicate key"},
		} {
			m := exchange(tc.line)
			e, _ := m["error"].(map[string]any)
			if msg, _ := e["message"].(string); !strings.Contains(msg, tc.want) {
				t.Errorf("%q: answered %v, want an error saying %q", tc.line, m, tc.want)
			}
		}
		m := exchange(`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`)
		if tools, _ := m["result"].(map[string]any)["tools"].([]any); len(tools) != 12 {
			t.Fatalf("tools/list after bad messages: %v", m)
		}
	})

	t.Run("http", func(t *testing.T) {
		url := httpServer(t, t.TempDir())
		cs := httpSession(t, url, "2025-11-25")
		for _, tc := range []struct{ body, want string }{
			{`{"jsonrpc":"2.0","id":2,"method":"tools/list"`, "not valid JSON"},
			{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_job_status","arguments":{"job_id":"a"},"arguments":{"job_id":"b"}}}`,
				"params.arguments: duplicate key"},
		} {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Session-Id", cs.ID())
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var m struct{ Error struct{ Message string } }
			if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &m) != nil || !strings.Contains(m.Error.Message, tc.want) {
				t.Errorf("%s: %d %s, want 400 and a JSON-RPC error saying %q", tc.body, resp.StatusCode, body, tc.want)
			}
		}
		if res, err := cs.ListTools(testContext(t), nil); err != nil || len(res.Tools) != 12 {
			t.Fatalf("the session after bad messages: %v", err)
		}
	})
}
