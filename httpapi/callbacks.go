package httpapi

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// The callback server faces the jobs, which are untrusted, and, where
// deployments bind it to every interface (Proxmox VMs must reach it),
// the network: what a stranger can make it hold is bounded. A request is
// authenticated from its headers before its body is read (a bad token
// gets its 401 at once and the connection is closed); connections that
// have not sent a valid token are capped (the oldest is closed past the
// cap); one job keeps a few connections open at most; and one job's
// callbacks are rate-limited.
const (
	// DefaultMaxUnauthenticated is large enough for every running job of
	// a busy server to reconnect at once (after a restart, or as 50 jobs
	// of 2 connections each open them together): at 64, 100 connections
	// opened at once closed each other in turn before their first
	// request was read (scripts/bench-callbacks-ts: 110 connection
	// errors, a p50 of 1 s). An idle one costs a few KiB and ends at
	// HeaderTimeout.
	DefaultMaxUnauthenticated = 1024
	DefaultMaxConnsPerJob     = 8
	DefaultRate               = 50 // a second
	DefaultBurst              = 200
)

// CallbackServer is the http.Server of the callback endpoints (Handler),
// with the bounds above and the body and header timeouts of this
// package. Serve it on a listener of its own.
func CallbackServer(svc Services, opts Options) *http.Server {
	h := newHandler(svc, opts)
	return &http.Server{
		Handler:           BodyTimeout(h.mux, BodyIdleTimeout, BodyTotalTimeout),
		ReadHeaderTimeout: HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		ConnContext:       h.conns.connContext,
		ConnState:         h.conns.connState,
	}
}

// connGuard tracks a CallbackServer's connections: the unauthenticated
// ones in the order they came, and how many each job keeps.
type connGuard struct {
	maxUnauth, maxPerJob int

	mu     sync.Mutex
	conns  map[net.Conn]*connInfo
	unauth *list.List // of net.Conn, oldest first
	perJob map[string]int
}

type connInfo struct {
	elem *list.Element // in unauth; nil once authenticated
	job  string        // the job it counts for, once authenticated
}

type connKey struct{}

func newConnGuard(opts Options) *connGuard {
	g := &connGuard{maxUnauth: opts.MaxUnauthenticated, maxPerJob: opts.MaxConnsPerJob,
		conns: map[net.Conn]*connInfo{}, unauth: list.New(), perJob: map[string]int{}}
	if g.maxUnauth <= 0 {
		g.maxUnauth = DefaultMaxUnauthenticated
	}
	if g.maxPerJob <= 0 {
		g.maxPerJob = DefaultMaxConnsPerJob
	}
	return g
}

func (g *connGuard) connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// connState counts a new connection as unauthenticated (closing the
// oldest such past the cap) and forgets a closed one.
func (g *connGuard) connState(c net.Conn, state http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateNew:
		if g.unauth.Len() >= g.maxUnauth {
			oldest := g.unauth.Front()
			g.unauth.Remove(oldest)
			old := oldest.Value.(net.Conn)
			g.conns[old].elem = nil
			old.Close() // the server forgets it with StateClosed
		}
		g.conns[c] = &connInfo{elem: g.unauth.PushBack(c)}
	case http.StateClosed, http.StateHijacked:
		info := g.conns[c]
		if info == nil {
			return
		}
		if info.elem != nil {
			g.unauth.Remove(info.elem)
		}
		if info.job != "" {
			if g.perJob[info.job]--; g.perJob[info.job] <= 0 {
				delete(g.perJob, info.job)
			}
		}
		delete(g.conns, c)
	}
}

// authenticated records that the request's connection sent job's valid
// token. It returns false when job already keeps as many connections as
// it may: the answer should close this one. A request served without a
// CallbackServer (no connection in its context) is always fine.
func (g *connGuard) authenticated(ctx context.Context, job string) bool {
	c, ok := ctx.Value(connKey{}).(net.Conn)
	if !ok {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	info := g.conns[c]
	if info == nil || info.job == job {
		return true
	}
	if info.job != "" || g.perJob[job] >= g.maxPerJob {
		return false // another job's connection before, or enough of this one's
	}
	if info.elem != nil {
		g.unauth.Remove(info.elem)
		info.elem = nil
	}
	info.job = job
	g.perJob[job]++
	return true
}

// rateLimit is a token bucket per job.
type rateLimit struct {
	rate  float64
	burst int

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimit(opts Options) *rateLimit {
	r := &rateLimit{rate: opts.Rate, burst: opts.Burst, buckets: map[string]*bucket{}}
	if r.rate <= 0 {
		r.rate = DefaultRate
	}
	if r.burst <= 0 {
		r.burst = DefaultBurst
	}
	return r
}

// allow takes one of job's tokens, or says how long until there is one.
func (r *rateLimit) allow(job string) (time.Duration, bool) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buckets) > 4096 {
		// Full buckets say nothing a new one would not: drop them.
		for id, b := range r.buckets {
			if b.tokens+now.Sub(b.last).Seconds()*r.rate >= float64(r.burst) {
				delete(r.buckets, id)
			}
		}
	}
	b := r.buckets[job]
	if b == nil {
		b = &bucket{tokens: float64(r.burst), last: now}
		r.buckets[job] = b
	}
	b.tokens = min(float64(r.burst), b.tokens+now.Sub(b.last).Seconds()*r.rate)
	b.last = now
	if b.tokens < 1 {
		return time.Duration((1 - b.tokens) / r.rate * float64(time.Second)), false
	}
	b.tokens--
	return 0, true
}
