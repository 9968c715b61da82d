package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/delegate-dev/delegate/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type counts map[delegate.Status]int

func (c counts) CountJobs(context.Context) (map[delegate.Status]int, error) { return c, nil }

type failing struct{}

func (failing) CountJobs(context.Context) (map[delegate.Status]int, error) {
	return nil, errors.New("database is locked")
}

type pool []metrics.PoolVMs

func (p pool) PoolVMs(context.Context) ([]metrics.PoolVMs, error) { return p, nil }

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("scrape: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	b, _ := io.ReadAll(w.Body)
	return string(b)
}

func wantLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains("\n"+text, "\n"+l+"\n") {
			t.Errorf("missing line %q", l)
		}
	}
}

func TestJobCountsFromTheStore(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.CountJobs(counts{delegate.StatusPending: 4, delegate.StatusRunning: 2, delegate.StatusSuccess: 10, delegate.StatusFailed: 3})
	text := scrape(t, m)
	wantLines(t, text,
		"# TYPE delegate_jobs_total counter",
		`delegate_jobs_total{status="success"} 10`,
		`delegate_jobs_total{status="failed"} 3`,
		`delegate_jobs_total{status="timeout"} 0`,
		`delegate_jobs_total{status="cancelled"} 0`,
		"# TYPE delegate_jobs gauge",
		`delegate_jobs{status="pending"} 4`,
		`delegate_jobs{status="provisioning"} 0`,
		`delegate_jobs{status="running"} 2`,
		"delegate_queue_length 4",
	)
	// Live statuses are not totals, finished ones not gauges.
	for _, bad := range []string{`delegate_jobs_total{status="running"}`, `delegate_jobs{status="success"}`} {
		if strings.Contains(text, bad) {
			t.Errorf("unexpected series %s", bad)
		}
	}
	if strings.Contains(text, "delegate_pool_vms") || strings.Contains(text, "delegate_mcp_sessions") {
		t.Error("pool or sessions metrics without a source")
	}
	if !strings.Contains(text, "go_goroutines") || !strings.Contains(text, "process_") {
		t.Error("the runtime and process collectors are missing")
	}
}

// TestBuildInfo: delegate_build_info says the version every other place
// shows (internal/buildinfo), with its revision and Go version.
func TestBuildInfo(t *testing.T) {
	b := buildinfo.Get()
	wantLines(t, scrape(t, metrics.New(metrics.Options{})),
		"# TYPE delegate_build_info gauge",
		fmt.Sprintf(`delegate_build_info{goversion=%q,revision=%q,version=%q} 1`, b.GoVersion, b.Revision, b.Version),
	)
}

func TestHooks(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.CountSessions(func() int { return 7 })
	m.SandboxStarted("local", 30*time.Millisecond)
	m.SandboxStarted("proxmox", 20*time.Second)
	m.JobEnded("local", delegate.StatusSuccess, 2*time.Second)
	m.JobEnded("local", delegate.StatusFailed, 90*time.Second)
	for _, code := range []int{200, 200, 401, 409} {
		m.CallbackAnswered(code)
	}
	m.ProxmoxRequest("POST /nodes/{node}/qemu/{vmid}/clone", 200)
	m.ProxmoxRequest("POST /nodes/{node}/qemu/{vmid}/clone", 200)
	m.ProxmoxRequest("GET /nodes/{node}/qemu/{vmid}/agent/ping", 500)
	m.ProxmoxRequest("GET /version", 0)
	text := scrape(t, m)
	wantLines(t, text,
		`delegate_sandbox_start_seconds_bucket{backend="local",le="0.05"} 1`,
		`delegate_sandbox_start_seconds_bucket{backend="local",le="0.025"} 0`,
		`delegate_sandbox_start_seconds_count{backend="proxmox"} 1`,
		`delegate_sandbox_start_seconds_bucket{backend="proxmox",le="15"} 0`,
		`delegate_sandbox_start_seconds_bucket{backend="proxmox",le="20"} 1`,
		`delegate_job_duration_seconds_count{backend="local"} 2`,
		`delegate_job_duration_seconds_sum{backend="local"} 92`,
		`delegate_job_duration_seconds_bucket{backend="local",le="60"} 1`,
		`delegate_job_duration_seconds_bucket{backend="local",le="120"} 2`,
		`delegate_callbacks_total{code="200"} 2`,
		`delegate_callbacks_total{code="401"} 1`,
		`delegate_callbacks_total{code="409"} 1`,
		`delegate_proxmox_requests_total{class="POST /nodes/{node}/qemu/{vmid}/clone",code="200"} 2`,
		`delegate_proxmox_requests_total{class="GET /nodes/{node}/qemu/{vmid}/agent/ping",code="500"} 1`,
		`delegate_proxmox_requests_total{class="GET /version",code="0"} 1`,
		`delegate_mcp_sessions 7`,
	)
}

func TestPoolVMs(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.CountPool(pool{
		{Template: "debian-12", State: "ready", Count: 3},
		{Template: "debian-12", State: "booting", Count: 1},
	})
	wantLines(t, scrape(t, m),
		`delegate_pool_vms{state="ready",template="debian-12"} 3`,
		`delegate_pool_vms{state="booting",template="debian-12"} 1`,
	)
}

// A store that cannot answer costs the job counts, not the scrape.
func TestStoreErrorKeepsTheRest(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.CountJobs(failing{})
	m.CallbackAnswered(200)
	text := scrape(t, m)
	if strings.Contains(text, "delegate_jobs") {
		t.Errorf("job counts served from a failed query:\n%s", text)
	}
	wantLines(t, text, `delegate_callbacks_total{code="200"} 1`)
}

// The names, types and help texts follow Prometheus's conventions.
func TestLint(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.CountJobs(counts{})
	m.CountPool(pool{{Template: "t", State: "ready", Count: 1}})
	m.CountSessions(func() int { return 0 })
	m.SandboxStarted("local", time.Second)
	m.JobEnded("local", delegate.StatusSuccess, time.Second)
	m.CallbackAnswered(200)
	m.ProxmoxRequest("GET /version", 200)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "delegate_") {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}
