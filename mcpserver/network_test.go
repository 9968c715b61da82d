package mcpserver_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mock"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// netService is a job service that also serves networks.
type netService struct {
	*service
	mock.NetworkService
}

var report = &delegate.NetworkReport{JobID: "job-1", Network: "job-1", Policy: delegate.Allowlist("pypi.org"),
	Summary: delegate.NetworkSummary{Allowed: 3, Denied: 1, DeniedNames: []string{"evil.test:443"}},
	Entries: []delegate.NetworkEntry{{Seq: 1, Time: t0, Via: "connect", Name: "evil.test", Port: 443, Rule: "not in allowlist"}}}

// TestNetworkSurface: wait_job's allow widens the job's allowlist (through
// the service, as "mcp") before it waits; get_job_result has the network
// part; job://{id}/network is the log.
func TestNetworkSurface(t *testing.T) {
	var widened []string
	svc := &netService{service: fullService()}
	svc.AllowNetworkFn = func(ctx context.Context, id string, rules []string, by string) (*delegate.NetworkReport, error) {
		if id != "job-1" || by != "mcp" {
			t.Errorf("AllowNetwork(%s, %v, %s)", id, rules, by)
		}
		if slices.Contains(rules, "bad/") {
			return nil, &delegate.FieldError{Field: "allow[0]", Rule: `"bad/": a host name, not a URL`}
		}
		widened = append(widened, rules...)
		return report, nil
	}
	svc.NetworkFn = func(ctx context.Context, id string, opts delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
		if id != "job-1" {
			return nil, &delegate.NotFoundError{Resource: "network", ID: id}
		}
		return report, nil
	}
	svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return &delegate.JobResult{JobID: id, Status: delegate.StatusSuccess, Duration: time.Second,
			Network: &delegate.NetworkResult{Policy: report.Policy, Summary: report.Summary, Denied: report.Entries}}, nil
	}
	cs := connect(t, svc, nil)

	var w struct{ Done bool }
	structured(t, call(t, cs, "wait_job", map[string]any{"job_id": "job-1", "allow": []any{"pypi.org", "*.pythonhosted.org"}}), &w)
	if !slices.Equal(widened, []string{"pypi.org", "*.pythonhosted.org"}) || !w.Done {
		t.Errorf("widened %v, done %v", widened, w.Done)
	}
	res := call(t, cs, "wait_job", map[string]any{"job_id": "job-1", "allow": []any{"bad/"}})
	if !res.IsError || !strings.Contains(errorText(res), "allow[0]") {
		t.Errorf("a bad rule: %s", errorText(res))
	}

	var r struct {
		Network *delegate.NetworkResult `json:"network"`
	}
	structured(t, call(t, cs, "get_job_result", map[string]any{"job_id": "job-1"}), &r)
	if r.Network == nil || r.Network.Summary.Denied != 1 || len(r.Network.Denied) != 1 || r.Network.Policy.Mode != delegate.NetworkAllowlist {
		t.Errorf("result's network = %+v", r.Network)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "job://job-1/network"})
	if err != nil {
		t.Fatal(err)
	}
	var got delegate.NetworkReport
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &got); err != nil || got.Summary.Allowed != 3 || len(got.Entries) != 1 {
		t.Errorf("job://job-1/network = %s (%v)", rr.Contents[0].Text, err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "job://job-2/network"}); err == nil {
		t.Error("a job without a network log read as one")
	}
	tpls, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tp := range tpls.ResourceTemplates {
		found = found || tp.URITemplate == "job://{id}/network"
	}
	if !found {
		t.Error("job://{id}/network is not listed")
	}
}

// TestWaitAllowWithoutProxy: a server without the network service says
// so, naming allow.
func TestWaitAllowWithoutProxy(t *testing.T) {
	cs := connect(t, fullService(), nil)
	res := call(t, cs, "wait_job", map[string]any{"job_id": "job-1", "allow": []any{"pypi.org"}})
	if !res.IsError || !strings.Contains(errorText(res), "allow") {
		t.Errorf("wait_job allow without a proxy: %s", errorText(res))
	}
}

// TestResultCacheMissed: get_job_result says which caches the job had an
// empty one of, and why (issue 34, item 5), and nothing when it had them.
func TestResultCacheMissed(t *testing.T) {
	const missed = "go: in use by sandbox sb-0123456789ab: this job had an empty one of its own"
	svc := fullService()
	svc.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		r := &delegate.JobResult{JobID: id, Status: delegate.StatusSuccess}
		if id == "job-1" {
			r.CacheMissed = missed
		}
		return r, nil
	}
	cs := connect(t, svc, nil)
	for id, want := range map[string]string{"job-1": missed, "job-2": ""} {
		var r map[string]any
		structured(t, call(t, cs, "get_job_result", map[string]any{"job_id": id}), &r)
		if got, ok := r["cache"]; want == "" && ok || want != "" && got != want {
			t.Errorf("%s: get_job_result's cache is %v (present %v), want %q", id, got, ok, want)
		}
	}
}
