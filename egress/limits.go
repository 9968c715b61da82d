package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of the per-job limits (Config).
const (
	DefaultMaxConnsPerJob = 256
	DefaultConnRate       = 50
	DefaultIdleTimeout    = 5 * time.Minute
	// connDescriptors is what one connection through the proxy may hold
	// of the server's descriptors: the job's side and the destination's.
	connDescriptors = 2
	// minMaxConns is the proxy's cap when the descriptor limit is tiny.
	minMaxConns = 16
	// idleChunk is how much a tunnel copies between two looks at its
	// idle deadline (spliced in the kernel all the same).
	idleChunk = 4 << 20
)

// defaultMaxConns is the proxy's cap of connections, all jobs together,
// when Config.MaxConns is 0: half of the server's descriptors (its soft
// RLIMIT_NOFILE, which the Go runtime raises to the hard limit at start)
// at two a connection; the other half is the server's, to run jobs (their
// output pipes, the store, the sandboxes' listeners).
func defaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return minMaxConns
	}
	n := lim.Cur / 2 / connDescriptors
	if n > 1<<20 {
		n = 1 << 20
	}
	return max(int(n), minMaxConns)
}

// limits admits connections: at most max at once in all, and per job at
// most perJob at once and rate a second (a token bucket holding 2×rate).
type limits struct {
	max, perJob int
	rate        float64

	// record, policies and logger say what was refused (the proxy's).
	record   func(token string, e Entry)
	policies Policies
	logger   *slog.Logger

	mu      sync.Mutex
	n       int
	jobs    map[string]*jobConns
	sweepAt int // sweep jobs when it holds this many
}

type jobConns struct {
	n       int
	tokens  float64
	last    time.Time
	refused int       // refusals since the last one logged
	logged  time.Time // when a refusal was last logged
}

func newLimits(cfg *Config, record func(string, Entry)) *limits {
	return &limits{max: cfg.MaxConns, perJob: cfg.MaxConnsPerJob, rate: float64(cfg.ConnRate), record: record, policies: cfg.Policies, logger: cfg.Logger,
		jobs: map[string]*jobConns{}, sweepAt: 64}
}

// admitAll takes a place in the proxy's cap, for a connection whose job is
// not known yet; "" and a release, or why not.
func (l *limits) admitAll() (func(), string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.max {
		return nil, fmt.Sprintf("the proxy's cap of %d connections at once, all jobs together", l.max)
	}
	l.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.n--
			l.mu.Unlock()
		})
	}, ""
}

// count is the connections admitted and not yet released, all jobs
// together.
func (l *limits) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// admitJob takes a place in token's cap and rate.
func (l *limits) admitJob(token string) (func(), string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if len(l.jobs) >= l.sweepAt {
		// Forget the jobs that hold nothing and whose bucket is full
		// again (a token seen once, a job ended).
		for tok, j := range l.jobs {
			if j.n == 0 && now.Sub(j.last).Seconds() >= 2 {
				delete(l.jobs, tok)
			}
		}
		l.sweepAt = max(64, 2*len(l.jobs))
	}
	j := l.jobs[token]
	if j == nil {
		j = &jobConns{tokens: 2 * l.rate, last: now}
		l.jobs[token] = j
	}
	j.tokens = min(2*l.rate, j.tokens+now.Sub(j.last).Seconds()*l.rate)
	j.last = now
	switch {
	case j.n >= l.perJob:
		return nil, fmt.Sprintf("the job's cap of %d connections at once", l.perJob)
	case j.tokens < 1:
		return nil, fmt.Sprintf("the job's rate of %s a second", plural(int(l.rate), "connection"))
	}
	j.tokens--
	j.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			j.n--
		})
	}, ""
}

// admit takes a place in the proxy's cap and, with a token, in the job's.
func (l *limits) admit(token string) (func(), string) {
	all, why := l.admitAll()
	if why != "" || token == "" {
		return all, why
	}
	job, why := l.admitJob(token)
	if why != "" {
		all()
		return nil, why
	}
	return func() { job(); all() }, ""
}

// refusedLog says whether a refusal of token's is to be logged now (at
// most one a second per job, a flood being one line), and how many were
// not logged before it.
func (l *limits) refusedLog(token string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	j := l.jobs[token]
	if j == nil {
		return true, 0
	}
	if time.Since(j.logged) < time.Second {
		j.refused++
		return false, 0
	}
	n := j.refused
	j.refused, j.logged = 0, time.Now()
	return true, n
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// refuse logs a connection refused by the limits: in the job's network
// log, at most once a second per job.
func (l *limits) refuse(token string, via Via, why string) {
	if token == "" {
		l.logger.Warn("egress: connection refused", "why", why)
		return
	}
	log, before := l.refusedLog(token)
	if !log {
		return
	}
	e := Entry{Time: time.Now(), Via: via, Rule: "over " + why}
	if before > 0 {
		e.Rule += fmt.Sprintf(" (and %d refused before, not logged)", before)
	}
	if l.policies != nil {
		// The job's policy is asked for, as for every attempt: a sink
		// (the engine's) files entries under the networks it was asked
		// about, and a job that only holds connections has asked for
		// nothing yet.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.policies.Policy(ctx, token)
		cancel()
	}
	l.record(token, e)
}

// errIdle ends a tunnel that carried nothing either way for the idle
// timeout.
var errIdle = errors.New("idle")

// idlePair watches the two ways of a tunnel: it ends when neither carried
// a byte for idle. stop ends a way early (a tunnel handed to HTTP).
type idlePair struct {
	idle  time.Duration
	quiet [2]atomic.Bool
	stop  atomic.Bool
}

// errStopped: a way stopped by idlePair.stop.
var errStopped = errors.New("stopped")

// copy copies src to dst as io.Copy does (spliced between TCP sockets, a
// chunk at a time), way being 0 or 1; errIdle when neither way moved a
// byte for the idle timeout.
func (ip *idlePair) copy(dst io.Writer, src net.Conn, way int) (int64, error) {
	if ip == nil || ip.idle <= 0 {
		return io.Copy(dst, src)
	}
	var total int64
	for {
		if ip.stop.Load() {
			return total, errStopped
		}
		src.SetReadDeadline(time.Now().Add(ip.idle))
		if ip.stop.Load() {
			return total, errStopped
		}
		n, err := io.CopyN(dst, src, idleChunk)
		total += n
		if n > 0 {
			ip.quiet[way].Store(false)
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			ip.quiet[way].Store(true) // it carries nothing more
			return total, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ip.stop.Load() {
				return total, errStopped
			}
			if n == 0 {
				// A whole idle period without a byte this way: the
				// tunnel ends if the other way had one too.
				ip.quiet[way].Store(true)
				if ip.quiet[1-way].Load() {
					return total, errIdle
				}
			}
		default:
			return total, err
		}
	}
}

// readFirst reads the client's first byte of a tunnel (way 0) from in,
// which reads client; errIdle when neither way moved for the idle
// timeout meanwhile.
func (ip *idlePair) readFirst(in io.Reader, client net.Conn, b []byte) error {
	if ip.idle <= 0 {
		_, err := io.ReadFull(in, b)
		return err
	}
	defer client.SetReadDeadline(time.Time{})
	for {
		client.SetReadDeadline(time.Now().Add(ip.idle))
		_, err := io.ReadFull(in, b)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			if err == nil {
				ip.quiet[0].Store(false)
			}
			return err
		}
		ip.quiet[0].Store(true)
		if ip.quiet[1].Load() {
			return errIdle
		}
	}
}

// limitedListener admits what it accepts as serve does, for a server that
// accepts itself (DNS over TCP).
type limitedListener struct {
	net.Listener
	p     *Proxy
	token string
	via   Via
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, why := l.p.limits.admit(l.token)
		if why == "" {
			return &releasingConn{Conn: c, release: release}, nil
		}
		c.Close()
		l.p.limits.refuse(l.token, l.via, why)
	}
}

// releasingConn gives its place back when closed.
type releasingConn struct {
	net.Conn
	release func()
}

func (c *releasingConn) Close() error {
	c.release()
	return c.Conn.Close()
}
