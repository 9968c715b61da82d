package dashboard_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/dashboard"
	"github.com/delegate-dev/delegate/mock"
)

type netJobs struct {
	*mock.JobService
	mock.NetworkService
}

// TestJobPageNetwork: a running job whose network goes through the proxy
// shows its policy, counts and denied attempts (a name a job chose is
// escaped), and links its whole log as JSON.
func TestJobPageNetwork(t *testing.T) {
	j := runningJob(delegate.StatusModeDetailed)
	j.Manifest.Network = delegate.Allowlist("pypi.org", "*.pythonhosted.org")
	svc := &netJobs{JobService: &mock.JobService{
		GetFn:      func(ctx context.Context, id string) (*delegate.Job, error) { return j, nil },
		TimelineFn: func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil },
	}}
	rep := &delegate.NetworkReport{JobID: "job-1", Network: "job-1", Policy: j.Manifest.Network, Inject: []string{"GH_TOKEN"},
		Summary: delegate.NetworkSummary{Allowed: 7, Denied: 2, Sent: 2048, Received: 1 << 20},
		Entries: []delegate.NetworkEntry{{Seq: 3, Time: t0, Via: "dns", Name: "evil" + hostile, QType: "A", Rule: "not in allowlist"},
			{Seq: 5, Time: t0, Via: "transparent-http", Addr: "169.254.169.254", Port: 80, Rule: "link-local 169.254.0.0/16 (cloud metadata)"}}}
	var asked []delegate.NetworkLogOptions
	svc.NetworkFn = func(ctx context.Context, id string, o delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
		asked = append(asked, o)
		return rep, nil
	}
	h := handler(svc, dashboard.Options{})
	page := get(t, h, "/jobs/job-1").Body.String()
	for _, want := range []string{
		"<h2>Network</h2>", "allowlist pypi.org, *.pythonhosted.org", "the proxy injects GH_TOKEN", "7 allowed, 2 denied",
		"evil&lt;script&gt;", "169.254.169.254:80", "cloud metadata", `href="/jobs/job-1/network" download`,
		"network allowlist pypi.org, *.pythonhosted.org",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	noInlineCode(t, page)
	if len(asked) != 1 || !asked[0].Denied {
		t.Errorf("the page read the log with %+v, want the denied attempts", asked)
	}
	w := get(t, h, "/jobs/job-1/network")
	var got delegate.NetworkReport
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &got) != nil || got.Summary.Allowed != 7 {
		t.Errorf("the whole log: %d %s", w.Code, w.Body)
	}
	// A job with no network has no section.
	j.Manifest.Network = delegate.Network{Mode: delegate.NetworkNone}
	if page := get(t, h, "/jobs/job-1").Body.String(); strings.Contains(page, "<h2>Network</h2>") {
		t.Error("a job without network shows a network section")
	}
}
