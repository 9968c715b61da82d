// Package metrics exposes delegate's metrics in the Prometheus text format
// (the official client library). Job counts are read from the store at
// each scrape, so every server sharing a data dir reports the same
// figures; durations, sandbox starts, callbacks and Proxmox requests are
// counted as this process sees them, through small hooks: the engine's
// Observer, pve's Observer and the callback handler's Answered.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// JobCounter counts the stored jobs in each status (sqlite.JobStore does it
// with one query over its status index).
type JobCounter interface {
	CountJobs(ctx context.Context) (map[delegate.Status]int, error)
}

// PoolCounter reports a warm pool's VMs (the Proxmox backend's, through
// an adapter in cmd/delegate); CountPool fills
// delegate_pool_vms{template,state} from it.
type PoolCounter interface {
	PoolVMs(ctx context.Context) ([]PoolVMs, error)
}

// PoolVMs is how many of a template's pooled VMs are in one state (the
// Proxmox pool's: starting, ready, claiming, retiring).
type PoolVMs struct {
	Template, State string
	Count           int
}

// Options tune the metrics.
type Options struct {
	// ScrapeTimeout bounds the store queries of one scrape; default 5s.
	ScrapeTimeout time.Duration
	Logger        *slog.Logger
}

// Metrics is delegate's registry. Its methods are the hooks' ends; all
// are safe for concurrent use.
type Metrics struct {
	reg          *prometheus.Registry
	log          *slog.Logger
	timeout      time.Duration
	jobDuration  *prometheus.HistogramVec
	sandboxStart *prometheus.HistogramVec
	callbacks    *prometheus.CounterVec
	proxmox      *prometheus.CounterVec
}

// Buckets, in seconds. Jobs run from a fraction of a second to the
// longest timeout (a day); sandboxes start in tens of milliseconds (local)
// to tens of seconds (a Proxmox clone that boots).
var (
	jobBuckets     = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400}
	sandboxBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60, 120, 300}
)

// New builds the registry: delegate's metrics, delegate_build_info (the
// version every other place shows, see internal/buildinfo), and the Go
// runtime's and the process's from the client library.
func New(opts Options) *Metrics {
	if opts.ScrapeTimeout <= 0 {
		opts.ScrapeTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{
		reg:     prometheus.NewRegistry(),
		log:     opts.Logger,
		timeout: opts.ScrapeTimeout,
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delegate_job_duration_seconds",
			Help:    "How long the jobs this server ran took, from start to end, by sandbox backend.",
			Buckets: jobBuckets,
		}, []string{"backend"}),
		sandboxStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delegate_sandbox_start_seconds",
			Help:    "How long creating a job's sandbox took, by sandbox backend.",
			Buckets: sandboxBuckets,
		}, []string{"backend"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delegate_callbacks_total",
			Help: "Callbacks from jobs answered by this server, by HTTP status.",
		}, []string{"code"}),
		proxmox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delegate_proxmox_requests_total",
			Help: "Proxmox VE API requests (each attempt), by class (method and path pattern) and HTTP status (0: no answer).",
		}, []string{"class", "code"}),
	}
	build := buildinfo.Get()
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "delegate_build_info",
		Help: "Always 1; its labels say which delegate this is: version, VCS revision and Go version.",
	}, []string{"version", "revision", "goversion"})
	buildInfo.WithLabelValues(build.Version, build.Revision, build.GoVersion).Set(1)
	m.reg.MustRegister(
		buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.jobDuration, m.sandboxStart, m.callbacks, m.proxmox,
	)
	return m
}

// CountJobs adds delegate_jobs_total, delegate_jobs and
// delegate_queue_length, read from the store at each scrape. Call it once.
func (m *Metrics) CountJobs(c JobCounter) {
	m.reg.MustRegister(&jobsCollector{jobs: c, timeout: m.timeout})
}

// CountPool adds delegate_pool_vms, read from the warm pool at each
// scrape. Call it once.
func (m *Metrics) CountPool(p PoolCounter) {
	m.reg.MustRegister(&poolCollector{pool: p, timeout: m.timeout})
}

// CountSessions adds delegate_mcp_sessions. Call it once.
func (m *Metrics) CountSessions(live func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "delegate_mcp_sessions",
		Help: "Live MCP sessions over Streamable HTTP (at most --max-sessions).",
	}, func() float64 { return float64(live()) }))
}

// Handler serves the metrics in the Prometheus text format. A failed
// store query is logged and its metrics left out; the rest is served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slogPrinter{m.log},
	})
}

// Registry is the registry, for tests and for more collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SandboxStarted and JobEnded make Metrics an engine.Observer.
func (m *Metrics) SandboxStarted(backend string, d time.Duration) {
	m.sandboxStart.WithLabelValues(backend).Observe(d.Seconds())
}

// The histogram is by backend only: the status is in delegate_jobs_total.
func (m *Metrics) JobEnded(backend string, status delegate.Status, ran time.Duration) {
	m.jobDuration.WithLabelValues(backend).Observe(ran.Seconds())
}

// CallbackAnswered is the callback handler's Answered hook.
func (m *Metrics) CallbackAnswered(code int) {
	m.callbacks.WithLabelValues(strconv.Itoa(code)).Inc()
}

// ProxmoxRequest is a pve.Observer.
func (m *Metrics) ProxmoxRequest(class string, code int) {
	m.proxmox.WithLabelValues(class, strconv.Itoa(code)).Inc()
}

// jobsCollector reads the job counts at each scrape.
type jobsCollector struct {
	jobs    JobCounter
	timeout time.Duration
}

var (
	jobsTotalDesc = prometheus.NewDesc("delegate_jobs_total",
		"Jobs that have finished, by final status (counted in the store: every server on the data dir reports the same).",
		[]string{"status"}, nil)
	jobsDesc = prometheus.NewDesc("delegate_jobs",
		"Jobs now pending, provisioning or running, by status (counted in the store).",
		[]string{"status"}, nil)
	queueDesc = prometheus.NewDesc("delegate_queue_length",
		"Jobs waiting to start: submitted, not yet provisioning (pending; counted in the store).",
		nil, nil)
	poolDesc = prometheus.NewDesc("delegate_pool_vms",
		"Warm pool VMs by template and state.",
		[]string{"template", "state"}, nil)
)

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobsTotalDesc
	ch <- jobsDesc
	ch <- queueDesc
}

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	counts, err := c.jobs.CountJobs(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(jobsDesc, err)
		return
	}
	for _, st := range delegate.Statuses {
		if st.Terminal() {
			ch <- prometheus.MustNewConstMetric(jobsTotalDesc, prometheus.CounterValue, float64(counts[st]), string(st))
		} else {
			ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(counts[st]), string(st))
		}
	}
	ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(counts[delegate.StatusPending]))
}

// poolCollector reads the warm pool at each scrape.
type poolCollector struct {
	pool    PoolCounter
	timeout time.Duration
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolDesc }

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	vms, err := c.pool.PoolVMs(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(poolDesc, err)
		return
	}
	for _, v := range vms {
		ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(v.Count), v.Template, v.State)
	}
}

// slogPrinter lets promhttp log through slog.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Error("metrics scrape", "err", fmt.Sprint(v...)) }

// ServerStats is what a server sharing its store says of its lease and
// of the jobs it adopted (engine.ServerStats).
type ServerStats struct {
	Live         bool
	LeaseAge     time.Duration
	Adoptions    int64
	FencedWrites int64
	PoolKeeper   bool
}

// CountServer adds the lease metrics of a server that shares its store
// with others: delegate_lease_live, delegate_lease_age_seconds,
// delegate_adoptions_total, delegate_fenced_writes_total and
// delegate_pool_keeper, read at each scrape. Call it once.
func (m *Metrics) CountServer(read func() ServerStats) {
	gauge := func(name, help string, v func(ServerStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(read()) })
	}
	counter := func(name, help string, v func(ServerStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(read()) })
	}
	b := func(x bool) float64 {
		if x {
			return 1
		}
		return 0
	}
	m.reg.MustRegister(
		gauge("delegate_lease_live", "1 while this server trusts its lease in the shared store; 0 once it lost it (it drives no job).",
			func(s ServerStats) float64 { return b(s.Live) }),
		gauge("delegate_lease_age_seconds", "Seconds since this server's lease was last renewed (renewed every third of DELEGATE_LEASE_TTL).",
			func(s ServerStats) float64 { return s.LeaseAge.Seconds() }),
		counter("delegate_adoptions_total", "Jobs this server adopted from servers whose leases expired.",
			func(s ServerStats) float64 { return float64(s.Adoptions) }),
		counter("delegate_fenced_writes_total", "Writes of this server as a job's owner refused: another server had adopted the job, or this server's lease was no longer trusted.",
			func(s ServerStats) float64 { return float64(s.FencedWrites) }),
		gauge("delegate_pool_keeper", "1 while this server keeps the warm pool (holds its term in the shared store).",
			func(s ServerStats) float64 { return b(s.PoolKeeper) }),
	)
}
