package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Resolver looks names up for the proxy; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config is the operator's part of the proxy: what no job may change.
type Config struct {
	// Policies gives each job's policy by its token. Required.
	Policies Policies
	// Sink receives the network log; nil discards it.
	Sink Sink
	// Asker is asked about requests an allowlist denies, for jobs whose
	// policy says Ask; nil: nobody is asked.
	Asker Asker
	// Resolver resolves names for jobs (and for the sandbox's DNS); nil is
	// net.DefaultResolver, the host's own.
	Resolver Resolver
	// RootCAs verify the hosts the proxy injects credentials for; nil is
	// the system's roots.
	RootCAs *x509.CertPool
	// Callback is the server's callback address as the proxy dials it: the
	// one address and port of the host jobs reach (with any policy but
	// None). Zero: none.
	Callback netip.AddrPort
	// Allow lists ranges jobs may reach although they are always denied
	// (a package mirror at 10.1.2.3/32, say). It cannot widen an allowlist:
	// it only lifts the address rules.
	Allow []netip.Prefix
	// AllowPrivate lets jobs reach 10/8, 172.16/12, 192.168/16, 100.64/10
	// and fc00::/7 (never link-local, metadata or the host's own addresses).
	AllowPrivate bool
	// AskWait is how long a denied request is held for an answer (30 s).
	AskWait time.Duration
	// DialTimeout bounds one upstream connection attempt (10 s).
	DialTimeout time.Duration
	// LogQueue is how many log entries may wait for a slow Sink (4096).
	LogQueue int
	// MaxConnsPerJob bounds a job's connections open at once through the
	// proxy, every listener of its sandbox and the shared one together
	// (DefaultMaxConnsPerJob); past it a connection is refused (closed at
	// once, or 503 on the shared listener) and the refusal logged.
	MaxConnsPerJob int
	// ConnRate bounds the connections a job opens a second, with a burst
	// of twice as many (DefaultConnRate).
	ConnRate int
	// IdleTimeout ends a tunnel (CONNECT, transparent TLS, the callback's,
	// a WebSocket) that carried no byte either way for this long, and
	// bounds the wait for a response's head (DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxConns bounds the connections of all jobs together; 0: a quarter
	// of the server's open-file limit, so that the proxy (two descriptors
	// a connection) holds at most half of the server's descriptors and
	// the rest is left to run jobs.
	MaxConns int
	// Logger gets the proxy's own troubles (never a secret); nil discards.
	Logger *slog.Logger
}

const (
	defaultAskWait     = 30 * time.Second
	defaultDialTimeout = 10 * time.Second
	defaultLogQueue    = 4096
	// headerTimeout bounds reading a request's head or a TLS ClientHello:
	// a client that says nothing does not hold a connection for ever.
	headerTimeout = 30 * time.Second
	// maxHeaderBytes bounds a request's head (net/http's default).
	maxHeaderBytes = 1 << 20
)

// Proxy is the egress proxy. One serves every job: each listener it serves
// is tied to one job's token (a per-sandbox listener) or asks each client
// for its token (Proxy-Authorization), and every decision asks
// Config.Policies.
type Proxy struct {
	cfg    Config
	guard  *guard
	log    *logQueue
	out    outside
	asks   askTable
	conns  connTable
	limits *limits
	closed chan struct{}
	once   sync.Once
}

// New checks the configuration and starts the log's delivery.
func New(cfg Config) (*Proxy, error) {
	if cfg.Policies == nil {
		return nil, fmt.Errorf("%w: Config.Policies is required", ErrInvalid)
	}
	if cfg.AskWait < 0 || cfg.DialTimeout < 0 || cfg.LogQueue < 0 || cfg.MaxConnsPerJob < 0 || cfg.ConnRate < 0 || cfg.IdleTimeout < 0 || cfg.MaxConns < 0 {
		return nil, fmt.Errorf("%w: AskWait, DialTimeout, LogQueue, MaxConnsPerJob, ConnRate, IdleTimeout and MaxConns cannot be negative", ErrInvalid)
	}
	for _, p := range cfg.Allow {
		if !p.IsValid() || p != p.Masked() {
			return nil, fmt.Errorf("%w: Allow: %s is not a range like 10.1.2.0/24", ErrInvalid, p)
		}
	}
	if cfg.Callback.IsValid() && cfg.Callback.Port() == 0 {
		return nil, fmt.Errorf("%w: Callback %s needs a port", ErrInvalid, cfg.Callback)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.AskWait == 0 {
		cfg.AskWait = defaultAskWait
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	if cfg.LogQueue == 0 {
		cfg.LogQueue = defaultLogQueue
	}
	if cfg.MaxConnsPerJob == 0 {
		cfg.MaxConnsPerJob = DefaultMaxConnsPerJob
	}
	if cfg.ConnRate == 0 {
		cfg.ConnRate = DefaultConnRate
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = defaultMaxConns()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, guard: newGuard(&cfg), closed: make(chan struct{})}
	p.limits = newLimits(&p.cfg, p.record)
	if cfg.Sink != nil {
		p.log = newLogQueue(cfg.Sink, cfg.LogQueue)
	}
	p.out.resolver = cfg.Resolver
	p.out.dialer = net.Dialer{
		Timeout:   cfg.DialTimeout,
		KeepAlive: 30 * time.Second,
		// The last word, at connect time: whatever path led here, the
		// address being connected to is checked once more.
		ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("egress: unexpected address %q: %w", address, err)
			}
			if rule, ok := p.guard.check(ap.Addr(), ap.Port()); !ok {
				return &deniedError{rule: rule}
			}
			return nil
		},
	}
	return p, nil
}

// Close stops the proxy's log once it has delivered what is queued, and
// releases requests held for an answer. Serve calls end with their
// contexts.
func (p *Proxy) Close() error {
	p.once.Do(func() {
		close(p.closed)
		if p.log != nil {
			p.log.close()
		}
	})
	return nil
}

// PolicyChanged tells the proxy that the engine changed a job's policy
// (Policy.Widen): requests held for an answer look again, and the change
// goes into the job's network log, for its timeline.
func (p *Proxy) PolicyChanged(token string, ch Change) {
	p.record(token, Entry{Time: time.Now(), Via: ViaPolicy, Allowed: true, Rule: ch.String()})
	p.asks.changed(token)
}

// Revoke closes every connection a job has open through the proxy (its
// policy must already refuse the token, or new ones follow). Per-sandbox
// listeners end with their Serve context instead.
func (p *Proxy) Revoke(token string) {
	p.conns.closeAll(token)
}

func (p *Proxy) record(token string, e Entry) {
	if p.log != nil {
		p.log.add(token, e)
	}
}

type clientKey struct{}

// ClientAddr is where a connection or a DNS query came from, in the
// context Policies.Policy receives. On a shared listener a token alone
// names the job; where the network vouches for source addresses (Proxmox's
// ipfilter pins each VM to its own), the engine may also check that a
// job's token comes from its VM.
func ClientAddr(ctx context.Context) (netip.AddrPort, bool) {
	ap, ok := ctx.Value(clientKey{}).(netip.AddrPort)
	return ap, ok
}

func withClient(ctx context.Context, a net.Addr) context.Context {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return context.WithValue(ctx, clientKey{}, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	return ctx
}

// deniedError is a decision against an attempt.
type deniedError struct {
	rule string
}

func (e *deniedError) Error() string { return "denied: " + e.rule }

// attempt is what a job asked to reach.
type attempt struct {
	token string
	via   Via
	name  string     // normalized host name, or ""
	addr  netip.Addr // a raw address, when name is ""
	port  uint16
	start time.Time
}

func (a *attempt) entry() Entry {
	return Entry{Time: a.start, Via: a.via, Name: a.name, Addr: a.addr, Port: a.port}
}

// what names the destination for messages.
func (a *attempt) what() string {
	h := a.name
	if h == "" {
		h = a.addr.String()
	}
	return net.JoinHostPort(h, strconv.Itoa(int(a.port)))
}

// verdict is the policy's answer about a name (or a raw address), before
// addresses are looked at.
func verdict(pol Policy, a *attempt, cb netip.AddrPort, dns bool) (rule string, ok, askable bool) {
	switch pol.Mode {
	case None:
		return "network none", false, false
	case Egress:
		return "egress", true, false
	case Allowlist:
	default:
		return "invalid policy", false, false
	}
	if a.name == "" {
		if cb.IsValid() && a.addr.Unmap() == cb.Addr() && a.port == cb.Port() {
			return "callback " + cb.String(), true, false
		}
		return "raw address: an allowlist names hosts", false, false
	}
	var r Rule
	if dns {
		r, ok = pol.allowsName(a.name)
	} else {
		r, ok = pol.allowRule(a.name, a.port)
	}
	if !ok {
		return "not in allowlist", false, true
	}
	return "allow " + r.String(), true, false
}

// authorize decides an attempt: the policy's verdict (held for an answer
// when it may be asked), then the proxy's own resolution and the address
// rules. It returns the policy and the addresses the job may be connected
// to, or a *deniedError. The rule it returns is the entry's.
func (p *Proxy) authorize(ctx context.Context, a *attempt, dns bool) (Policy, []netip.Addr, string, error) {
	pol, err := p.cfg.Policies.Policy(ctx, a.token)
	if err != nil {
		return Policy{}, nil, "", policyErr(err)
	}
	rule, ok, askable := verdict(pol, a, p.guard.callback, dns)
	if !ok && askable && pol.Ask && p.cfg.Asker != nil {
		pol, rule, ok, err = p.hold(ctx, a, dns)
		if err != nil {
			return Policy{}, nil, "", err
		}
	}
	if !ok {
		return pol, nil, rule, &deniedError{rule: rule}
	}
	var addrs []netip.Addr
	if a.name == "" {
		addrs = []netip.Addr{a.addr}
	} else if addrs, err = p.out.resolve(ctx, a.token, a.name); err != nil {
		return pol, nil, rule, err
	}
	allowed := addrs[:0:0]
	denial := ""
	for _, ad := range addrs {
		var r string
		var ok bool
		if dns {
			r, ok = p.guard.checkAddr(ad)
		} else {
			r, ok = p.guard.check(ad, a.port)
		}
		if ok {
			if a.name == "" && r != "" {
				rule = r // the callback, or the operator's exception
			}
			allowed = append(allowed, ad)
		} else if denial == "" {
			denial = r
		}
	}
	if len(allowed) == 0 {
		return pol, nil, denial, &deniedError{rule: denial}
	}
	return pol, allowed, rule, nil
}

// policyErr turns a failed policy lookup into the attempt's denial.
func policyErr(err error) error {
	if errors.Is(err, ErrUnknownToken) {
		return &authError{err: err}
	}
	return fmt.Errorf("policy lookup: %w", err)
}

// authError: the client's token is missing or unknown.
type authError struct{ err error }

func (e *authError) Error() string { return "proxy authentication: " + e.err.Error() }
func (e *authError) Unwrap() error { return e.err }

// resolve looks a name up; "no such host" is a denial of its own, so
// that the log says so.
func (u *outside) resolve(ctx context.Context, token, name string) ([]netip.Addr, error) {
	addrs, err := u.lookup(ctx, token, "ip", name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, &deniedError{rule: "no such host"}
		}
		return nil, fmt.Errorf("resolving %s: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, &deniedError{rule: "no such host"}
	}
	return addrs, nil
}

// dial connects to the first of addrs that answers. The dialer checks each
// address once more as it connects.
func (u *outside) dial(ctx context.Context, addrs []netip.Addr, port uint16) (net.Conn, netip.Addr, error) {
	var first error
	for _, a := range addrs {
		c, err := u.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, a, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, addrs[0], first
}

// serve accepts on ln until ctx ends (then closes it and every connection
// it accepted) or ln fails. Each connection takes a place in the proxy's
// cap and, with a token (a listener of one job's), in the job's cap and
// rate; one over them is closed at once and the refusal logged (via).
func (p *Proxy) serve(ctx context.Context, ln net.Listener, token string, via Via, handle func(context.Context, net.Conn)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	go func() {
		select {
		case <-p.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: wait rather than spin.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.cfg.Logger.Warn("egress: accept", "err", err, "retry_in", backoff)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return nil
				}
				continue
			}
			return fmt.Errorf("egress: accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		release, why := p.limits.admit(token)
		if why != "" {
			c.Close()
			p.limits.refuse(token, via, why)
			continue
		}
		wg.Go(func() {
			defer release()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			handle(withClient(ctx, c.RemoteAddr()), c)
		})
	}
}

// connTable tracks connections by token, for Revoke.
type connTable struct {
	mu sync.Mutex
	m  map[string]map[io.Closer]struct{}
}

func (t *connTable) add(token string, c io.Closer) func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]map[io.Closer]struct{}{}
	}
	if t.m[token] == nil {
		t.m[token] = map[io.Closer]struct{}{}
	}
	t.m[token][c] = struct{}{}
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.m[token], c)
		if len(t.m[token]) == 0 {
			delete(t.m, token)
		}
	}
}

func (t *connTable) closeAll(token string) {
	t.mu.Lock()
	cs := t.m[token]
	delete(t.m, token)
	t.mu.Unlock()
	for c := range cs {
		c.Close()
	}
}
