package cli_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mock"
)

type netJobs struct {
	*mock.JobService
	mock.NetworkService
}

// TestJobsNetworkAndAllow: `jobs network ID` prints the policy, the counts
// and each entry (a job's text made safe for the terminal); `jobs allow ID
// NAME...` widens through the service as "cli", and a bad rule is a usage
// error naming it.
func TestJobsNetworkAndAllow(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	svc := &netJobs{JobService: &mock.JobService{}}
	var opts delegate.NetworkLogOptions
	svc.NetworkFn = func(ctx context.Context, id string, o delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
		opts = o
		return &delegate.NetworkReport{JobID: id, Network: id, Policy: delegate.Allowlist("pypi.org"), Inject: []string{"GH"},
			Summary: delegate.NetworkSummary{Allowed: 2, Denied: 1, Sent: 10, Received: 99, DeniedNames: []string{"evil.test:443"}},
			Entries: []delegate.NetworkEntry{
				{Seq: 1, Time: at, Via: "connect", Name: "pypi.org", Addr: "203.0.113.5", Port: 443, Allowed: true, Rule: "allow pypi.org", Sent: 10, Received: 99},
				{Seq: 2, Time: at, Via: "dns", Name: "evil\x1b[2J.test", QType: "A", Rule: "not in allowlist"},
			}, Next: 2}, nil
	}
	var allowed []string
	svc.AllowNetworkFn = func(ctx context.Context, id string, rules []string, by string) (*delegate.NetworkReport, error) {
		if by != "cli" {
			t.Errorf("by %q", by)
		}
		if rules[0] == "http://x/" {
			return nil, &delegate.FieldError{Field: "allow[0]", Rule: `"http://x/": a host name, not a URL`}
		}
		allowed = append(allowed, rules...)
		return &delegate.NetworkReport{Policy: delegate.Allowlist(append([]string{"pypi.org"}, rules...)...)}, nil
	}
	h := newHarness()
	h.other = svc
	r := h.run(t, "jobs", "network", "job-1", "--denied", "--limit", "5")
	if r.code != 0 || !opts.Denied || opts.Limit != 5 {
		t.Fatalf("exit %d, opts %+v: %s", r.code, opts, r.stderr)
	}
	for _, want := range []string{"network job-1 (live): allowlist pypi.org", "injected secrets: GH", "2 allowed, 1 denied",
		"denied: evil.test:443", "allow pypi.org", `evil\x1b[2J.test A`, "more: --after 2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "\x1b") {
		t.Error("a raw escape reached the terminal")
	}
	if r := h.run(t, "jobs", "network", "job-1", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"denied_names"`) {
		t.Errorf("--json: %d %s", r.code, r.stdout)
	}
	r = h.run(t, "jobs", "allow", "job-1", "*.pythonhosted.org", "github.com:443")
	if r.code != 0 || !slices.Equal(allowed, []string{"*.pythonhosted.org", "github.com:443"}) || !strings.Contains(r.stdout, "github.com:443") {
		t.Errorf("allow: exit %d, %v: %s%s", r.code, allowed, r.stdout, r.stderr)
	}
	r = h.run(t, "jobs", "allow", "job-1", "http://x/")
	if r.code != 2 || !strings.Contains(r.stderr, "allow[0]") || !strings.Contains(r.stderr, "not a URL") {
		t.Errorf("a bad rule: exit %d: %s", r.code, r.stderr)
	}
	if r := h.run(t, "jobs", "allow", "job-1"); r.code != 2 || !strings.Contains(r.stderr, "missing NAME") {
		t.Errorf("no name: exit %d: %s", r.code, r.stderr)
	}
	// A service without networks says so.
	if r := newHarness().run(t, "jobs", "network", "job-1"); r.code == 0 || !strings.Contains(r.stderr, "no network logs") {
		t.Errorf("without networks: %d %s", r.code, r.stderr)
	}
}
