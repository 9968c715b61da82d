package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A real MCP server behind the real Streamable HTTP handler, as serve
// wires it, with the limiter in front.
func limitedServer(t testing.TB, max int) (*mcp.Server, *httpapi.SessionLimiter, *httptest.Server) {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: 30 * time.Minute})
	lim := httpapi.LimitSessions(h, max, 30*time.Minute)
	srv := httptest.NewServer(lim)
	t.Cleanup(srv.Close)
	return server, lim, srv
}

func liveSessions(s *mcp.Server) int {
	n := 0
	for range s.Sessions() {
		n++
	}
	return n
}

// waitSessions waits for the server's own count of sessions to be want
// (closing an evicted one happens beside the request that evicted it).
func waitSessions(t testing.TB, s *mcp.Server, want int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("the MCP server to hold %d sessions", want), func() bool { return liveSessions(s) == want })
}

// initialize opens a session as a bare client would, and returns its id.
func initialize(t testing.TB, url string) string {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || id == "" {
		t.Fatalf("initialize: %s, session %q", resp.Status, id)
	}
	return id
}

func connect(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestSessionCapHolds(t *testing.T) {
	const max = 10
	server, lim, srv := limitedServer(t, max)
	for i := range 5 * max {
		initialize(t, srv.URL)
		if n := lim.Len(); n > max {
			t.Fatalf("after %d initialize calls the limiter counts %d sessions, cap %d", i+1, n, max)
		}
	}
	waitSessions(t, server, max)
	if n := lim.Len(); n != max {
		t.Errorf("limiter counts %d sessions, want %d", n, max)
	}
}

func TestSessionCapClosesTheLongestIdle(t *testing.T) {
	const max = 3
	server, lim, srv := limitedServer(t, max)
	// The limiter orders sessions by the clock: its own here, a second
	// later at each read, so that no two uses are at one time.
	var (
		mu    sync.Mutex
		clock = time.Now()
	)
	lim.SetClock(func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	})
	ctx := context.Background()
	a, b, c := connect(t, srv.URL), connect(t, srv.URL), connect(t, srv.URL)
	// a was opened first, but it is b that has been idle the longest once
	// a and c have been used.
	for _, cs := range []*mcp.ClientSession{a, c} {
		if err := cs.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitSessions(t, server, max)
	d := connect(t, srv.URL) // one too many
	waitSessions(t, server, max)
	if err := b.Ping(ctx, nil); err == nil {
		t.Fatal("the longest idle session (b) still answers")
	}
	for name, cs := range map[string]*mcp.ClientSession{"a": a, "c": c, "d": d} {
		if err := cs.Ping(ctx, nil); err != nil {
			t.Errorf("session %s was closed: %v", name, err)
		}
	}
	var ids []string
	for ss := range server.Sessions() {
		ids = append(ids, ss.ID())
	}
	for _, cs := range []*mcp.ClientSession{a, c, d} {
		if !strings.Contains(strings.Join(ids, " "), cs.ID()) {
			t.Errorf("session %s missing from the server's %v", cs.ID(), ids)
		}
	}
}

func TestSessionCapForgetsDeletedSessions(t *testing.T) {
	const max = 2
	server, lim, srv := limitedServer(t, max)
	a := connect(t, srv.URL)
	b := connect(t, srv.URL)
	if err := a.Close(); err != nil { // sends DELETE
		t.Fatal(err)
	}
	waitSessions(t, server, 1)
	if n := lim.Len(); n != 1 {
		t.Fatalf("limiter counts %d sessions after a DELETE, want 1", n)
	}
	// There is room again: the next session closes nobody.
	connect(t, srv.URL)
	waitSessions(t, server, 2)
	if err := b.Ping(context.Background(), nil); err != nil {
		t.Errorf("b was closed though the cap was not reached: %v", err)
	}
}

// BenchmarkInitializeFlood prints what 5,000 initialize calls leave on
// the heap, with the cap and without (a cap above the number of calls).
func BenchmarkInitializeFlood(b *testing.B) {
	for _, max := range []int{httpapi.DefaultMaxSessions, 1 << 30} {
		name := fmt.Sprintf("cap=%d", max)
		if max == 1<<30 {
			name = "uncapped"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				server, lim, srv := limitedServer(b, max)
				for range 5000 {
					initialize(b, srv.URL)
				}
				lim.Wait() // evictions run beside the requests
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MB-retained")
				b.ReportMetric(float64(liveSessions(server)), "sessions")
				srv.Close()
			}
		})
	}
}
