package mcpserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type withBearer struct{ next http.RoundTripper }

func (b withBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer some-issuer-token")
	return b.next.RoundTrip(r)
}

// TestCredentialsWithoutAPrincipal: a request whose credentials another
// verifier vouched for, naming no principal of delegate's, gets none of
// the local user's rights (a stdio or unguarded request's): every tool
// needs a scope it does not have. Before, it ran as the local operator.
func TestCredentialsWithoutAPrincipal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	called := false
	svc := &mock.JobService{ListFn: func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		called = true
		return &delegate.JobPage{}, nil
	}, WatchFn: func(ctx context.Context) <-chan string {
		ch := make(chan string)
		close(ch)
		return ch
	}}
	verify := func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: "mallory", Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := auth.RequireBearerToken(verify, nil)(mcpserver.HTTPHandler(newServer(ctx, svc, nil).Server, time.Minute, nil))
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: withBearer{http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_jobs", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	text := ""
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if !res.IsError || !strings.Contains(text, "needs the jobs scope, which mallory's token does not have") || called {
		t.Errorf("list_jobs with credentials naming no principal: %q (service called: %v)", text, called)
	}
}
