package egress

import (
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Via says how an attempt reached the proxy.
type Via string

const (
	ViaConnect      Via = "connect"          // HTTP CONNECT (proxy variables)
	ViaHTTP         Via = "http"             // plain HTTP (proxy variables)
	ViaTransparent  Via = "transparent-tls"  // a redirected connection, named by its TLS SNI
	ViaTransparentH Via = "transparent-http" // a redirected connection, named by its Host header
	ViaDNS          Via = "dns"              // a query to the sandbox's resolver
	ViaCallback     Via = "callback"         // the forward to the server's callback address
	ViaPolicy       Via = "policy"           // not an attempt: the policy changed (Rule says how)
	ViaLog          Via = "log"              // not an attempt: entries were lost (Rule says how many)
)

// Entry is one line of a job's network log: one connection (or one
// upstream connection of a plain HTTP client), one DNS query, one denial.
type Entry struct {
	Time     time.Time // when the attempt began
	Via      Via
	Name     string     // the host name asked for; "" for a raw address
	QType    string     // DNS: the query's type (A, AAAA, TXT, …)
	Addr     netip.Addr // the address connected to (for DNS: the first answered)
	Port     uint16
	Sent     int64 // bytes from the job to the destination
	Received int64 // bytes from the destination to the job
	Allowed  bool
	// Rule is what decided: "allow *.pythonhosted.org", "egress",
	// "not in allowlist", "link-local 169.254.0.0/16 (cloud metadata)", …
	Rule string
	// Injected names the header set from an operator's secret (never its
	// value); "" when none was.
	Injected string
	Duration time.Duration // how long an allowed connection lasted
	Err      string        // why an allowed attempt failed, or how it ended
	Dropped  int64         // Via "log": how many entries were lost
}

// Sink receives every job's network log. The engine implements it (the
// job's result, an MCP resource, the CLI and the dashboard read from it).
// Record is called from a single goroutine, in order; a slow Record does
// not slow connections down: the proxy keeps a bounded queue
// (Config.LogQueue entries waiting, and as many being delivered) and, when
// it is full, counts what it drops and says so in an entry of its own (Via
// "log").
type Sink interface {
	Record(token string, e Entry)
}

type queued struct {
	token string
	e     Entry
}

// logQueue is the bounded queue between connections and the sink.
type logQueue struct {
	sink Sink
	max  int

	mu      sync.Mutex
	wake    *sync.Cond
	q       []queued
	dropped map[string]int
	closed  bool
	done    chan struct{}
}

func newLogQueue(sink Sink, max int) *logQueue {
	l := &logQueue{sink: sink, max: max, dropped: map[string]int{}, done: make(chan struct{})}
	l.wake = sync.NewCond(&l.mu)
	go l.run()
	return l
}

func (l *logQueue) add(token string, e Entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if len(l.q) >= l.max {
		l.dropped[token]++
	} else {
		l.q = append(l.q, queued{token, e})
	}
	l.wake.Signal()
}

func (l *logQueue) run() {
	defer close(l.done)
	for {
		l.mu.Lock()
		for len(l.q) == 0 && len(l.dropped) == 0 && !l.closed {
			l.wake.Wait()
		}
		if len(l.q) == 0 && len(l.dropped) == 0 {
			l.mu.Unlock()
			return // closed and drained
		}
		var batch []queued
		for token, n := range l.dropped {
			batch = append(batch, queued{token, Entry{Time: time.Now(), Via: ViaLog, Dropped: int64(n),
				Rule: strconv.Itoa(n) + " entries dropped: the log queue was full"}})
		}
		clear(l.dropped)
		batch = append(batch, l.q...)
		l.q = l.q[:0:0] // let a burst's backing array go
		l.mu.Unlock()
		for _, it := range batch {
			l.sink.Record(it.token, it.e)
		}
	}
}

// close delivers what is queued, then stops.
func (l *logQueue) close() {
	l.mu.Lock()
	l.closed = true
	l.wake.Signal()
	l.mu.Unlock()
	<-l.done
}

// Recorder is a Sink that keeps each job's log in memory, bounded: the
// newest entries, the counts of all, and the names that were denied. The
// engine may use it as is, or keep its own.
type Recorder struct {
	max  int
	mu   sync.Mutex
	jobs map[string]*jobLog
}

type jobLog struct {
	entries []Entry // a ring of the newest max entries
	next    int
	sum     Summary
}

// Summary counts a job's network log.
type Summary struct {
	Allowed, Denied int64 // attempts (connections and DNS queries)
	Sent, Received  int64 // bytes, all connections
	Dropped         int64 // entries lost before reaching the log
	// DeniedNames lists what was denied ("denied.test:443", or an address),
	// once each, the first 100.
	DeniedNames []string
}

const maxDeniedNames = 100

// NewRecorder keeps at most max entries per job.
func NewRecorder(max int) *Recorder {
	return &Recorder{max: max, jobs: map[string]*jobLog{}}
}

func (r *Recorder) Record(token string, e Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.jobs[token]
	if j == nil {
		j = &jobLog{}
		r.jobs[token] = j
	}
	switch e.Via {
	case ViaLog:
		j.sum.Dropped += e.Dropped
	case ViaPolicy:
	default:
		if e.Allowed {
			j.sum.Allowed++
		} else {
			j.sum.Denied++
			what := e.Name
			if what == "" && e.Addr.IsValid() {
				what = e.Addr.String()
			}
			if e.Port != 0 && e.Via != ViaDNS {
				what += ":" + strconv.Itoa(int(e.Port))
			}
			if len(j.sum.DeniedNames) < maxDeniedNames && !slices.Contains(j.sum.DeniedNames, what) {
				j.sum.DeniedNames = append(j.sum.DeniedNames, what)
			}
		}
		j.sum.Sent += e.Sent
		j.sum.Received += e.Received
	}
	if len(j.entries) < r.max {
		j.entries = append(j.entries, e)
		return
	}
	if r.max > 0 {
		j.entries[j.next] = e
		j.next = (j.next + 1) % r.max
	}
}

// Entries returns a job's kept entries, oldest first.
func (r *Recorder) Entries(token string) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.jobs[token]
	if j == nil {
		return nil
	}
	return append(slices.Clone(j.entries[j.next:]), j.entries[:j.next]...)
}

// Summary returns a job's counts.
func (r *Recorder) Summary(token string) Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.jobs[token]
	if j == nil {
		return Summary{}
	}
	s := j.sum
	s.DeniedNames = slices.Clone(s.DeniedNames)
	return s
}

// Forget drops a job's log (once it is stored with the job's result).
func (r *Recorder) Forget(token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.jobs, token)
}
