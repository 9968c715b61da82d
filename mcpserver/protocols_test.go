package mcpserver_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestHTTPProtocols: over HTTPHandler, each protocol version is served
// (2025-06-18 and 2025-11-25 with a session, 2026-07-28 without), and a
// call whose client goes away is cancelled in each: wait_job's wait ends.
func TestHTTPProtocols(t *testing.T) {
	s := newService()
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
	}
	waits := make(chan context.Context, 1)
	s.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		waits <- ctx
		<-ctx.Done()
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := httptest.NewServer(mcpserver.HTTPHandler(newServer(ctx, s, slog.New(slog.DiscardHandler)).Server, time.Minute, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ asked, want string }{{"2025-06-18", "2025-06-18"}, {"2025-11-25", "2025-11-25"}, {"", "2026-07-28"}} {
		t.Run(tc.want, func(t *testing.T) {
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: tc.asked})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != tc.want {
				t.Fatalf("negotiated %s, want %s", got, tc.want)
			}
			if (cs.ID() == "") != (tc.want == "2026-07-28") {
				t.Errorf("session id %q on %s", cs.ID(), tc.want)
			}
			callCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "wait_job", Arguments: map[string]any{"job_id": "job-1"}})
				done <- err
			}()
			var wait context.Context
			select {
			case wait = <-waits:
			case <-time.After(10 * time.Second):
				t.Fatal("wait_job did not reach the service")
			}
			stop()
			select {
			case <-wait.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the client went away and wait_job kept waiting")
			}
			<-done
		})
	}
}
