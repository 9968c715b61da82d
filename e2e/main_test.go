// Package e2e tests the built delegate binary end to end: real MCP clients
// (the go-sdk client over stdio and Streamable HTTP, the TypeScript SDK
// client from npm) driving real jobs in the local sandbox.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/local"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var binary string

// binaryEnv names the built binary to a test binary run again by it.
const binaryEnv = "DELEGATE_E2E_BINARY"

func TestMain(m *testing.M) {
	// The Proxmox simulator's guests are local sandboxes of this binary.
	if local.Reexec() {
		return
	}
	// A test that runs again in namespaces of its own (testnet.Isolate)
	// uses the binary its parent built.
	if b := os.Getenv(binaryEnv); b != "" {
		binary = b
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "delegate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "delegate")
	os.Setenv(binaryEnv, binary)
	// As a release is built: the version set once, with -ldflags (see
	// internal/buildinfo and TestVersionIsOne).
	build := exec.Command("go", "build", "-ldflags", "-X "+versionVar+"="+e2eVersion, "-o", binary, "../cmd/delegate")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build delegate:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// serverEnv is the environment of a delegate under test: small limits and
// its own data dir.
func serverEnv(dataDir string, extra ...string) []string {
	e := append(os.Environ(), "DELEGATE_DATA_DIR="+dataDir, "DEFAULT_MEMORY=256M", "DEFAULT_DISK=64M", "DELEGATE_LOG_LEVEL=debug",
		"CALLBACK_PORT=0")
	return append(e, extra...)
}

// syncBuffer collects a process's stderr for failure messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// stdioSession starts `delegate serve` and connects the go-sdk client to it.
func stdioSession(t *testing.T, dataDir, protocol string, extraEnv ...string) (*mcp.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	return stdioSessionWith(t, dataDir, protocol, nil, extraEnv...)
}

// stdioSessionWith also takes client options (handlers for notifications).
func stdioSessionWith(t *testing.T, dataDir, protocol string, opts *mcp.ClientOptions, extraEnv ...string) (*mcp.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(binary, "serve")
	cmd.Env = serverEnv(dataDir, extraEnv...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, opts)
	cs, err := client.Connect(testContext(t), &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second},
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect over stdio: %v\nserver stderr:\n%s", err, stderr)
	}
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	return cs, cmd, stderr
}

// httpServer starts `delegate serve --http 127.0.0.1:0` and returns the
// URL of its MCP endpoint.
func httpServer(t *testing.T, dataDir string, extraEnv ...string) string {
	t.Helper()
	return startHTTP(t, dataDir, nil, extraEnv...) + "/mcp"
}

func httpSession(t *testing.T, url, protocol string) *mcp.ClientSession {
	t.Helper()
	return httpSessionWith(t, url, protocol, nil)
}

func httpSessionWith(t *testing.T, url, protocol string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-http", Version: "1"}, opts)
	cs, err := client.Connect(testContext(t), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool that must succeed and decodes its structured output.
func call[T any](t *testing.T, cs *mcp.ClientSession, tool string, args any) T {
	t.Helper()
	res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", tool, text(res))
	}
	var out T
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: structured content %s: %v", tool, raw, err)
	}
	return out
}

// callErr calls a tool that must fail and returns its error text.
func callErr(t *testing.T, cs *mcp.ClientSession, tool string, args any) string {
	t.Helper()
	res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if !res.IsError {
		t.Fatalf("%s: want a tool error, got %s", tool, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

// The server of a stdio session is reaped by the session's transport (when
// its stdout ends or the session closes). A second Wait on its command
// could block for ever: both Waits would wait for the one result of the
// command's stderr copy. So these wait for the process to exit instead.

// stopServer closes a stdio session and waits until its server has exited.
func stopServer(t *testing.T, cs *mcp.ClientSession, cmd *exec.Cmd) {
	t.Helper()
	cs.Close()
	waitExited(t, cmd.Process.Pid)
}

// killServer kills a stdio session's server at once (no chance to clean
// up) and waits until it has exited.
func killServer(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Kill()
	waitExited(t, cmd.Process.Pid)
}

// waitExited waits until process pid is a zombie or reaped.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	for range 600 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return // reaped
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			return // exited
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the server (pid %d) did not exit", pid)
}
