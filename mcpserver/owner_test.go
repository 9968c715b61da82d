package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// byName stands for an issuer: the bearer is the principal's name; "op"
// is an operator.
type byName struct{}

func (byName) Authenticate(_ context.Context, bearer string) (*delegate.Principal, error) {
	if bearer == "op" {
		return &delegate.Principal{Name: "op", Scopes: []delegate.Scope{delegate.ScopeAdmin}}, nil
	}
	return &delegate.Principal{Name: bearer, Scopes: []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}}, nil
}

type bearerOf struct {
	token string
	next  http.RoundTripper
}

func (b bearerOf) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestOperatorSeesOwners: list_jobs and list_sandboxes name each item's
// principal to an operator (admin scope), and to no one else: a
// principal's own list says nothing of whose it is.
func TestOperatorSeesOwners(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	svc := &struct {
		mock.JobService
		mock.SandboxService
	}{}
	svc.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		return &delegate.JobPage{Jobs: []delegate.JobSummary{
			{ID: "job-a", Status: delegate.StatusRunning, AgentType: delegate.AgentScript, CreatedAt: now, Principal: "alice"},
			{ID: "job-b", Status: delegate.StatusPending, AgentType: delegate.AgentScript, CreatedAt: now, Principal: "bob"},
		}}, nil
	}
	svc.ListSandboxesFn = func(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
		return []delegate.Sandbox{{ID: "sbx-a", State: delegate.SandboxIdle, Principal: "alice"}}, nil
	}
	svc.WatchFn = func(ctx context.Context) <-chan string {
		ch := make(chan string)
		close(ch)
		return ch
	}
	guard := &httpauth.Guard{Extra: []httpauth.Authenticator{byName{}}}
	srv := httptest.NewServer(guard.Require(mcpserver.HTTPHandler(newServer(ctx, svc, nil).Server, time.Minute, nil)))
	defer srv.Close()
	lists := func(token string) (jobs mcpserver.ListOut, sbs mcpserver.ListSandboxesOut) {
		t.Helper()
		client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1,
			HTTPClient: &http.Client{Transport: bearerOf{token, http.DefaultTransport}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		for _, c := range []struct {
			tool string
			out  any
		}{{"list_jobs", &jobs}, {"list_sandboxes", &sbs}} {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: map[string]any{}})
			if err != nil || res.IsError {
				t.Fatalf("%s as %s: %v %+v", c.tool, token, err, res)
			}
			raw, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(raw, c.out); err != nil {
				t.Fatal(err)
			}
		}
		return jobs, sbs
	}
	jobs, sbs := lists("op")
	if len(jobs.Jobs) != 2 || jobs.Jobs[0].Principal != "alice" || jobs.Jobs[1].Principal != "bob" ||
		len(sbs.Sandboxes) != 1 || sbs.Sandboxes[0].Principal != "alice" {
		t.Errorf("the operator's lists: %+v %+v; want each item's principal named", jobs, sbs)
	}
	jobs, sbs = lists("alice")
	if len(jobs.Jobs) != 2 || jobs.Jobs[0].Principal != "" || len(sbs.Sandboxes) != 1 || sbs.Sandboxes[0].Principal != "" {
		t.Errorf("a principal's lists: %+v %+v; want no principal named", jobs, sbs)
	}
}
