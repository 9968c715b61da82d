package egress

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Asker hears about requests a job's allowlist denies, when the job's
// policy says Ask. The engine implements it by putting a question on the
// job (MCP Tasks' input_required, the CLI, the dashboard). Ask returns once
// the question is answered, or when ctx ends (Config.AskWait, 30 s); an
// answer that allows the request widens the job's policy before Ask
// returns (or calls Proxy.PolicyChanged). The held request then looks at
// the policy again and goes through if it allows it now.
type Asker interface {
	Ask(ctx context.Context, token string, q Question) error
}

// Question is a denied request held for an answer.
type Question struct {
	Name string // the host name the job asked for
	Port uint16 // 0 for a DNS query (any port)
	Via  Via
}

func (q Question) String() string {
	if q.Port == 0 {
		return q.Name
	}
	return q.Name + ":" + strconv.Itoa(int(q.Port))
}

// maxQuestions bounds the questions one job may have waiting: a job that
// tries many names must not flood the person asked (nor the proxy).
const maxQuestions = 8

// askTable holds the questions in flight, one per job and destination (a
// client's retries wait on the same one), and wakes held requests when a
// job's policy changes.
type askTable struct {
	mu      sync.Mutex
	pending map[askKey]*pendingAsk
	change  map[string]*tokenWait
	perJob  map[string]int // questions waiting, by token
}

type askKey struct {
	token, name string
	port        uint16
}

type pendingAsk struct {
	answered chan struct{} // closed when Ask has returned
}

type tokenWait struct {
	ch      chan struct{} // closed (and replaced) at each change
	waiters int
}

// changed wakes the requests of token held for an answer.
func (t *askTable) changed(token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.change[token]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

// hold waits for an answer about a denied attempt and decides it again:
// it returns the policy then, and whether it allows the attempt now.
func (p *Proxy) hold(ctx context.Context, a *attempt, dns bool) (Policy, string, bool, error) {
	q := Question{Name: a.name, Port: a.port, Via: a.via}
	key := askKey{a.token, a.name, a.port}
	t := &p.asks
	t.mu.Lock()
	if t.pending == nil {
		t.pending = map[askKey]*pendingAsk{}
		t.change = map[string]*tokenWait{}
		t.perJob = map[string]int{}
	}
	pa := t.pending[key]
	if pa == nil && t.perJob[a.token] >= maxQuestions {
		t.mu.Unlock()
		rule, _, _ := verdict(Policy{Mode: Allowlist}, a, netip.AddrPort{}, dns)
		return Policy{}, rule + " (not asked: " + strconv.Itoa(maxQuestions) + " questions already wait)", false, nil
	}
	if pa == nil {
		t.perJob[a.token]++
		pa = &pendingAsk{answered: make(chan struct{})}
		t.pending[key] = pa
		// The question outlives the attempt that raised it: a retry of
		// the same request waits on it too.
		actx, cancel := context.WithTimeout(context.Background(), p.cfg.AskWait)
		go func() {
			defer cancel()
			go func() {
				select {
				case <-p.closed:
					cancel()
				case <-actx.Done():
				}
			}()
			if err := p.cfg.Asker.Ask(actx, a.token, q); err != nil && actx.Err() == nil {
				p.cfg.Logger.Warn("egress: ask", "question", q.String(), "err", err)
			}
			t.mu.Lock()
			delete(t.pending, key)
			if t.perJob[a.token]--; t.perJob[a.token] == 0 {
				delete(t.perJob, a.token)
			}
			t.mu.Unlock()
			close(pa.answered)
		}()
	}
	w := t.change[a.token]
	if w == nil {
		w = &tokenWait{ch: make(chan struct{})}
		t.change[a.token] = w
	}
	w.waiters++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if w.waiters--; w.waiters == 0 {
			delete(t.change, a.token)
		}
		t.mu.Unlock()
	}()

	timer := time.NewTimer(p.cfg.AskWait)
	defer timer.Stop()
	for {
		t.mu.Lock()
		changed := w.ch
		t.mu.Unlock()
		final := ""
		select {
		case <-pa.answered:
			final = "asked: not allowed"
		case <-changed:
		case <-timer.C:
			final = "asked: no answer within " + p.cfg.AskWait.String()
		case <-p.closed:
			final = "asked: the proxy stopped"
		case <-ctx.Done():
			return Policy{}, "", false, ctx.Err()
		}
		pol, err := p.cfg.Policies.Policy(ctx, a.token)
		if err != nil {
			return Policy{}, "", false, policyErr(err)
		}
		rule, ok, _ := verdict(pol, a, p.guard.callback, dns)
		if ok {
			return pol, rule + " (after asking)", true, nil
		}
		if final != "" {
			return pol, rule + " (" + final + ")", false, nil
		}
	}
}
