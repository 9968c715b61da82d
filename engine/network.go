package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
)

// Egress is the engine's side of the egress proxy (package egress, "The
// engine's part"): it owns the proxy, answers its questions about a job's
// policy by the job's network token (egress.Policies), keeps the network
// log in the store (egress.Sink), and hears about requests an allowlist
// denies (egress.Asker). Every fact is in the store (the network's policy
// as widened, its token's hash, its CA); the policies the proxy asks for
// are cached, read again every second, so that a widening made by another
// process (the CLI) applies within that second.
//
// One Egress serves the jobs of one server: make it with NewEgress, give
// its Proxy to the backend (local.Config.Egress) and itself to the engine
// (Config.Egress), Close it after the engine.
type Egress struct {
	store    delegate.Store
	proxy    *egress.Proxy
	secret   func(string) (string, bool)
	bindings map[string]egress.Binding
	log      *slog.Logger

	mu      sync.Mutex
	byHash  map[string]*netEntry // by the token's hash
	pending map[string][]delegate.NetworkEntry
	queued  int
	// asks are the proxy's questions (Ask), for the engine that serves
	// them to take (serveAsks).
	asks chan netQuestion

	wake   chan struct{}
	stop   chan struct{}
	done   sync.WaitGroup
	closed sync.Once
}

// netEntry is one network the proxy has asked about.
type netEntry struct {
	id     string
	token  string
	policy egress.Policy
	allow  []string // the stored rules the policy was built from
	ended  bool
	seen   time.Time // last asked about
	last   time.Time // last log entry
	denied map[string]bool
}

// EgressConfig is what NewEgress needs.
type EgressConfig struct {
	// Proxy is the operator's part of the proxy's configuration; its
	// Policies, Sink and Asker are the Egress's own.
	Proxy egress.Config
	// Bindings are the operator's NAME_INJECT bindings, by secret name.
	Bindings map[string]egress.Binding
	// Secret resolves a secret's value (Config.Secret).
	Secret func(name string) (string, bool)
	Logger *slog.Logger
}

// Times of the Egress's work.
const (
	netFlushEvery   = 250 * time.Millisecond
	netRefreshEvery = time.Second
	netSweepEvery   = 30 * time.Second
	netForgetAfter  = time.Minute // an ended network's entry stays for its last log entries
	// maxNetQueue is how many log entries wait for the store; past it the
	// newest are counted as lost (the proxy's own queue is before this).
	maxNetQueue = 16384
	// maxTimelineDenials is how many denied names a job's timeline tells.
	maxTimelineDenials = 20
	// caMargin is how much longer than its job's timeout a CA is valid.
	caMargin = time.Hour
	// Placeholder is what a job's environment holds for a secret the
	// proxy injects.
	Placeholder = "delegate-injected"
)

// NewEgress makes the proxy and starts the Egress's work.
func NewEgress(store delegate.Store, cfg EgressConfig) (*Egress, error) {
	e := &Egress{store: store, secret: cfg.Secret, bindings: cfg.Bindings, log: cfg.Logger,
		byHash: map[string]*netEntry{}, pending: map[string][]delegate.NetworkEntry{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), asks: make(chan netQuestion)}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.secret == nil {
		e.secret = EnvSecret
	}
	pc := cfg.Proxy
	pc.Policies, pc.Sink, pc.Asker = e, e, e
	if pc.Logger == nil {
		pc.Logger = e.log
	}
	p, err := egress.New(pc)
	if err != nil {
		return nil, err
	}
	e.proxy = p
	e.done.Add(2)
	go e.flushLoop()
	go e.refreshLoop()
	return e, nil
}

// Proxy is the proxy, for the backend to serve.
func (e *Egress) Proxy() *egress.Proxy { return e.proxy }

// Close stops the proxy and stores what is left of the log. Running jobs'
// networks stay in the store for the next server.
func (e *Egress) Close() error {
	var err error
	e.closed.Do(func() {
		err = e.proxy.Close() // delivers what its queue holds to Record
		close(e.stop)
		e.done.Wait()
		e.flush(context.Background())
	})
	return err
}

// Policy implements egress.Policies: the network's policy, from the cache
// or the store.
func (e *Egress) Policy(ctx context.Context, token string) (egress.Policy, error) {
	hash := hashToken(token)
	e.mu.Lock()
	ent := e.byHash[hash]
	if ent != nil {
		ent.seen = time.Now()
		pol, ended := ent.policy, ent.ended
		e.mu.Unlock()
		if ended {
			return egress.Policy{}, egress.ErrUnknownToken
		}
		return pol, nil
	}
	e.mu.Unlock()
	n, err := e.store.NetworkByToken(ctx, hash)
	if errors.Is(err, delegate.ErrNotFound) {
		return egress.Policy{}, egress.ErrUnknownToken
	}
	if err != nil {
		return egress.Policy{}, err
	}
	ent = &netEntry{id: n.ID, token: token, seen: time.Now(), ended: !n.EndedAt.IsZero(), allow: slices.Clone(n.Policy.Allow)}
	if !ent.ended {
		if ent.policy, err = e.build(n); err != nil {
			e.log.Error("egress: a stored network's policy", "network", n.ID, "err", err)
			return egress.Policy{}, fmt.Errorf("network %s: %w", n.ID, err)
		}
	}
	e.mu.Lock()
	if old := e.byHash[hash]; old != nil {
		ent = old // another request built it first
	} else {
		e.byHash[hash] = ent
	}
	pol, ended := ent.policy, ent.ended
	e.mu.Unlock()
	if ended {
		return egress.Policy{}, egress.ErrUnknownToken
	}
	return pol, nil
}

// build turns a stored network into the proxy's policy: its rules, and
// for its injected secrets their values (read now, never stored) and its
// CA.
func (e *Egress) build(n *delegate.NetworkState) (egress.Policy, error) {
	var pol egress.Policy
	switch n.Policy.Mode {
	case delegate.NetworkEgress:
		pol.Mode = egress.Egress
	case delegate.NetworkAllowlist:
		rules, err := egress.ParseRules(n.Policy.Allow)
		if err != nil {
			return egress.Policy{}, err
		}
		pol.Mode, pol.Allow, pol.Ask = egress.Allowlist, rules, n.Policy.Ask
	default:
		pol.Mode = egress.None
	}
	if len(n.Inject) > 0 {
		ca, err := egress.ParseCA(n.CA)
		if err != nil {
			return egress.Policy{}, fmt.Errorf("its CA: %w", err)
		}
		pol.CA = ca
		for _, name := range n.Inject {
			b, ok := e.bindings[name]
			if !ok {
				continue // unbound since: nothing is injected
			}
			v, ok := e.secret(name)
			if !ok {
				continue
			}
			in, err := b.Inject(v)
			if err != nil {
				return egress.Policy{}, err
			}
			pol.Inject = append(pol.Inject, in)
		}
	}
	return pol, pol.Validate()
}

// Record implements egress.Sink: entries wait here, by network, and are
// stored in batches.
func (e *Egress) Record(token string, en egress.Entry) {
	hash := hashToken(token)
	e.mu.Lock()
	ent := e.byHash[hash]
	if ent == nil {
		e.mu.Unlock()
		return // not a network this server asked about: nothing to file it under
	}
	if e.queued >= maxNetQueue {
		en = egress.Entry{Time: time.Now(), Via: egress.ViaLog, Dropped: 1}
		if q := e.pending[ent.id]; len(q) > 0 && q[len(q)-1].Via == string(egress.ViaLog) {
			q[len(q)-1].Lost++
			e.mu.Unlock()
			return
		}
	}
	de := toEntry(en)
	ent.last = time.Now()
	e.pending[ent.id] = append(e.pending[ent.id], de)
	e.queued++
	var denial string
	if !de.Allowed && de.Attempt() {
		if ent.denied == nil {
			ent.denied = map[string]bool{}
		}
		if t := de.Target(); !ent.denied[t] && len(ent.denied) < maxTimelineDenials {
			ent.denied[t] = true
			denial = fmt.Sprintf("network: denied %s (%s)", t, de.Rule)
		}
	}
	id := ent.id
	e.mu.Unlock()
	if denial != "" {
		// The first denial of each destination is in the job's timeline
		// (on a goroutine Close waits for: the proxy, closed first, calls
		// this until then).
		e.done.Add(1)
		go func() {
			defer e.done.Done()
			e.timeline(id, denial)
		}()
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// toEntry is the domain's form of a log entry.
func toEntry(en egress.Entry) delegate.NetworkEntry {
	de := delegate.NetworkEntry{Time: en.Time.UTC(), Via: string(en.Via), Name: en.Name, QType: en.QType, Port: int(en.Port),
		Sent: en.Sent, Received: en.Received, Allowed: en.Allowed, Rule: en.Rule, Injected: en.Injected,
		DurationMS: en.Duration.Milliseconds(), Err: en.Err, Lost: en.Dropped}
	if en.Addr.IsValid() {
		de.Addr = en.Addr.String()
	}
	return de
}

// timeline adds an entry to a job's timeline (a network's id is its
// job's, or a kept sandbox's, which has none).
func (e *Egress) timeline(id, msg string) {
	if !strings.HasPrefix(id, "job-") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.store.AddEvent(ctx, id, delegate.Event{Time: time.Now().UTC(), Message: clip(msg)}, maxEvents); err != nil && !errors.Is(err, delegate.ErrNotFound) {
		e.log.Warn("timeline", "job", id, "err", err)
	}
}

// netQuestion is a question of the proxy's about a request a network's
// allowlist denies, waiting for the engine (serveAsks) to put it.
type netQuestion struct {
	ctx      context.Context
	network  string
	q        egress.Question
	answered chan error // one answer: nil once the question is answered
}

// Ask implements egress.Asker: the question waits in asks for the engine
// that serves them (serveAsks, from Engine.Start), which puts it on the
// job that owns the network. The Egress calls no part of the engine: the
// engine, which holds the Egress, takes the questions from it. Without a
// server that serves them, nobody is asked and the request is denied
// once the proxy has waited.
func (e *Egress) Ask(ctx context.Context, token string, q egress.Question) error {
	e.mu.Lock()
	ent := e.byHash[hashToken(token)]
	e.mu.Unlock()
	if ent == nil {
		return errors.New("no one to ask: the network is not one this server's proxy knows")
	}
	nq := netQuestion{ctx: ctx, network: ent.id, q: q, answered: make(chan error, 1)}
	select {
	case e.asks <- nq:
	case <-ctx.Done():
		return errors.New("no one to ask: this server puts no questions to a person")
	}
	select {
	case err := <-nq.answered:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serveAsks puts the proxy's questions until ctx ends: each through ask
// (it returns once the question is answered, an answer that allows the
// request having widened the network, or its ctx ends), in a goroutine
// that run starts and its caller waits for.
func (e *Egress) serveAsks(ctx context.Context, run func(func()), ask func(ctx context.Context, networkID string, q egress.Question) error) {
	for {
		select {
		case <-ctx.Done():
			return
		case nq := <-e.asks:
			run(func() { nq.answered <- ask(nq.ctx, nq.network, nq.q) })
		}
	}
}

func (e *Egress) flushLoop() {
	defer e.done.Done()
	t := time.NewTicker(netFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		case <-e.wake:
			// Batch: wait for the tick unless much is queued.
			e.mu.Lock()
			n := e.queued
			e.mu.Unlock()
			if n < 512 {
				continue
			}
		}
		e.flush(context.Background())
	}
}

// settle stores a network's log once its job has ended: the entries of
// its last connections (closed as its processes went) reach the log
// within moments; they are waited for (until none came for a moment, a
// second at most), so that the job's result counts them.
func (e *Egress) settle(ctx context.Context, id string) {
	const quiet, most = 100 * time.Millisecond, time.Second
	deadline := time.Now().Add(most)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		var last time.Time
		for _, ent := range e.byHash {
			if ent.id == id && ent.last.After(last) {
				last = ent.last
			}
		}
		e.mu.Unlock()
		if time.Since(last) >= quiet {
			break
		}
		time.Sleep(quiet / 4)
	}
	e.mu.Lock()
	entries := e.pending[id]
	delete(e.pending, id)
	e.queued -= len(entries)
	e.mu.Unlock()
	if err := e.store.AppendNetworkLog(ctx, id, entries); err != nil {
		e.log.Warn("network log", "network", id, "entries", len(entries), "err", err)
	}
}

// flush stores the log entries waiting.
func (e *Egress) flush(ctx context.Context) {
	e.mu.Lock()
	batch := e.pending
	e.pending = map[string][]delegate.NetworkEntry{}
	e.queued = 0
	e.mu.Unlock()
	for id, entries := range batch {
		if err := e.store.AppendNetworkLog(ctx, id, entries); err != nil {
			e.log.Warn("network log", "network", id, "entries", len(entries), "err", err)
		}
	}
}

func (e *Egress) refreshLoop() {
	defer e.done.Done()
	t := time.NewTicker(netRefreshEvery)
	defer t.Stop()
	sweep := time.NewTicker(netSweepEvery)
	defer sweep.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.refresh(context.Background())
		case <-sweep.C:
			e.sweep(context.Background())
		}
	}
}

// refresh reads the cached networks again: a widening made elsewhere
// applies (and wakes the requests held for it), an ended network is
// revoked, one not asked about for a while is forgotten.
func (e *Egress) refresh(ctx context.Context) {
	e.mu.Lock()
	ents := make([]*netEntry, 0, len(e.byHash))
	for _, ent := range e.byHash {
		ents = append(ents, ent)
	}
	e.mu.Unlock()
	for _, ent := range ents {
		if ent.ended {
			if time.Since(ent.seen) > netForgetAfter {
				e.mu.Lock()
				delete(e.byHash, hashToken(ent.token))
				e.mu.Unlock()
			}
			continue
		}
		n, err := e.store.GetNetwork(ctx, ent.id)
		if err != nil {
			continue
		}
		e.apply(ent, n)
	}
}

// apply brings a cached network up to date with its stored form.
func (e *Egress) apply(ent *netEntry, n *delegate.NetworkState) {
	if !n.EndedAt.IsZero() {
		e.mu.Lock()
		was := ent.ended
		ent.ended, ent.seen = true, time.Now()
		e.mu.Unlock()
		if !was {
			e.proxy.Revoke(ent.token)
		}
		return
	}
	e.mu.Lock()
	same := slices.Equal(ent.allow, n.Policy.Allow)
	e.mu.Unlock()
	if same {
		return
	}
	pol, err := e.build(n)
	if err != nil {
		e.log.Error("egress: a widened network's policy", "network", n.ID, "err", err)
		return
	}
	e.mu.Lock()
	old := ent.policy
	ent.policy, ent.allow = pol, slices.Clone(n.Policy.Allow)
	e.mu.Unlock()
	var ch egress.Change
	for _, r := range pol.Allow {
		if !slices.Contains(old.Allow, r) {
			ch.Added = append(ch.Added, r)
		}
	}
	e.proxy.PolicyChanged(ent.token, ch)
}

// sweep ends the networks of jobs that have ended (while no server ran,
// or in another process).
func (e *Egress) sweep(ctx context.Context) {
	live, err := e.store.LiveNetworks(ctx)
	if err != nil {
		e.log.Warn("egress: sweep", "err", err)
		return
	}
	for _, n := range live {
		if !strings.HasPrefix(n.ID, "job-") {
			continue
		}
		j, err := e.store.GetJob(ctx, n.ID)
		if errors.Is(err, delegate.ErrNotFound) || (err == nil && j.Status.Terminal()) {
			e.end(ctx, n.ID)
		}
	}
}

// end revokes a network: the proxy refuses its token from now on and
// closes its connections, and its CA is destroyed (the store's copy with
// it).
func (e *Egress) end(ctx context.Context, id string) {
	n, err := e.store.UpdateNetwork(ctx, id, func(n *delegate.NetworkState) error {
		if n.EndedAt.IsZero() {
			n.EndedAt = time.Now().UTC()
		}
		n.CA, n.Token = nil, ""
		return nil
	})
	if err != nil {
		if !errors.Is(err, delegate.ErrNotFound) {
			e.log.Warn("egress: end a network", "network", id, "err", err)
		}
		return
	}
	e.mu.Lock()
	ent := e.byHash[n.TokenHash]
	e.mu.Unlock()
	if ent != nil {
		e.apply(ent, n)
		if ent.policy.CA != nil {
			ent.policy.CA.Destroy()
		}
	}
}

// widened applies a widening made by this process at once (another
// process's is seen by refresh).
func (e *Egress) widened(n *delegate.NetworkState) {
	e.mu.Lock()
	ent := e.byHash[n.TokenHash]
	e.mu.Unlock()
	if ent != nil {
		e.apply(ent, n)
	}
}

// ServeShared serves the proxy on a listener of its own at addr, for
// sandboxes that cannot have one each (Proxmox VMs): every client names
// its job in Proxy-Authorization. It serves until Close.
func (e *Egress) ServeShared(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.done.Add(1)
	go func() {
		defer e.done.Done()
		<-e.stop
		cancel()
	}()
	e.done.Add(1)
	go func() {
		defer e.done.Done()
		if err := e.proxy.Serve(ctx, ln, ""); err != nil && ctx.Err() == nil {
			e.log.Error("egress proxy: the shared listener failed", "addr", addr, "err", err)
		}
	}()
	e.log.Info("egress proxy listening for job VMs", "addr", ln.Addr().String())
	return nil
}
