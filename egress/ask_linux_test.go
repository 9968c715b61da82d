//go:build linux

package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testnet"
)

// asker stands in for the engine's questions to a person.
type asker struct {
	calls atomic.Int64
	mu    sync.Mutex
	qs    []Question
	fn    func(ctx context.Context, token string, q Question) error
}

func (a *asker) Ask(ctx context.Context, token string, q Question) error {
	a.calls.Add(1)
	a.mu.Lock()
	a.qs = append(a.qs, q)
	fn := a.fn
	a.mu.Unlock()
	return fn(ctx, token, q)
}

func (a *asker) answer(fn func(ctx context.Context, token string, q Question) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fn = fn
}

// held is how many requests of token wait for an answer.
func (p *Proxy) held(token string) int {
	p.asks.mu.Lock()
	defer p.asks.mu.Unlock()
	if w := p.asks.change[token]; w != nil {
		return w.waiters
	}
	return 0
}

func (a *asker) questions() []Question {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Question(nil), a.qs...)
}

// An allowlist widened at run time applies to the next attempt, and the
// change is in the job's network log.
func TestWidenAtRunTime(t *testing.T) {
	f := newFixture(t, nil)
	const tok = "job-widen"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	sb := newSandbox(t, f.p, tok)
	if res := f.curl(t, "", f.proxyEnv(tok), "https://denied.test/"); res.code == 0 {
		t.Fatalf("denied.test before widening: %v", res)
	}
	if res := f.curl(t, sb.ns, nil, "https://denied.test/"); res.code != 6 {
		t.Fatalf("denied.test in the sandbox before widening: %v", res)
	}
	f.jobs.widen(t, f.p, tok, "denied.test")
	if res := f.curl(t, "", f.proxyEnv(tok), "https://denied.test/"); !strings.Contains(res.out, "hello from denied") {
		t.Errorf("denied.test after widening: %v", res)
	}
	if res := f.curl(t, sb.ns, nil, "https://denied.test/"); !strings.Contains(res.out, "hello from denied") {
		t.Errorf("denied.test in the sandbox after widening: %v", res)
	}
	f.entry(t, tok, "the widening", func(e Entry) bool { return e.Via == ViaPolicy && e.Rule == "allowlist widened: denied.test" })
}

// A denied request waits for a person's answer, and goes through when it
// allows it.
func TestAsk(t *testing.T) {
	a := &asker{}
	f := newFixture(t, func(c *Config) { c.Asker = a; c.AskWait = 3 * time.Second })
	const tok = "job-ask"
	reset := func() {
		f.jobs.set(tok, Policy{Mode: Allowlist, Ask: true, Allow: mustRules(t, "allowed.test", "metadata.test")})
		a.calls.Store(0)
		a.mu.Lock()
		a.qs = nil
		a.mu.Unlock()
	}

	t.Run("allowed", func(t *testing.T) {
		reset()
		release := make(chan struct{})
		a.answer(func(ctx context.Context, token string, q Question) error {
			<-release
			f.jobs.widen(t, f.p, token, q.Name)
			return nil
		})
		done := make(chan cmdResult, 1)
		go func() { done <- f.curl(t, "", f.proxyEnv(tok), "https://denied.test/") }()
		// The request is held while the question waits for its answer.
		testkit.Eventually(t, 5*time.Second, "the request held for an answer", func() bool { return f.p.held(tok) == 1 })
		select {
		case res := <-done:
			t.Fatalf("answered before the question was: %v", res)
		default:
		}
		close(release)
		if res := <-done; !strings.Contains(res.out, "hello from denied") {
			t.Fatalf("%v", res)
		}
		if a.questions()[0] != (Question{Name: "denied.test", Port: 443, Via: ViaConnect}) {
			t.Errorf("asked %+v", a.questions())
		}
		f.entry(t, tok, "the allowed answer", func(e Entry) bool {
			return e.Via == ViaConnect && e.Allowed && e.Rule == "allow denied.test (after asking)"
		})
	})
	t.Run("no answer", func(t *testing.T) {
		reset()
		a.answer(func(ctx context.Context, _ string, _ Question) error { <-ctx.Done(); return ctx.Err() })
		start := time.Now()
		res := f.curl(t, "", f.proxyEnv(tok), "-i", "https://denied.test/")
		if !strings.Contains(res.err, "403") || time.Since(start) < 3*time.Second {
			t.Fatalf("%v after %s", res, time.Since(start))
		}
		f.entry(t, tok, "the unanswered question", func(e Entry) bool {
			return !e.Allowed && e.Rule == "not in allowlist (asked: no answer within 3s)"
		})
	})
	t.Run("widened meanwhile by another way", func(t *testing.T) {
		reset()
		asked := make(chan struct{}, 1)
		a.answer(func(ctx context.Context, _ string, _ Question) error {
			asked <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		})
		go func() {
			<-asked // widened while the question waits
			f.jobs.widen(t, f.p, tok, "denied.test")
		}()
		start := time.Now()
		res := f.curl(t, "", f.proxyEnv(tok), "https://denied.test/")
		if !strings.Contains(res.out, "hello from denied") || time.Since(start) > 2*time.Second {
			t.Fatalf("%v after %s", res, time.Since(start))
		}
	})
	t.Run("one question for retries", func(t *testing.T) {
		reset()
		release := make(chan struct{})
		a.answer(func(ctx context.Context, token string, q Question) error {
			<-release
			f.jobs.widen(t, f.p, token, q.Name)
			return nil
		})
		var wg sync.WaitGroup
		results := make([]cmdResult, 3)
		for i := range results {
			wg.Go(func() { results[i] = f.curl(t, "", f.proxyEnv(tok), "http://denied.test/") })
		}
		testkit.Eventually(t, 5*time.Second, "the three requests held", func() bool { return f.p.held(tok) == 3 })
		close(release)
		wg.Wait()
		for _, r := range results {
			if !strings.Contains(r.out, "hello from denied") {
				t.Errorf("%v", r)
			}
		}
		if n := a.calls.Load(); n != 1 {
			t.Errorf("asked %d times", n)
		}
	})
	t.Run("a flood of names", func(t *testing.T) {
		reset()
		// A job of its own: questions of the subtests before may still wait.
		const tok = "job-flood"
		f.jobs.set(tok, Policy{Mode: Allowlist, Ask: true})
		a.answer(func(ctx context.Context, _ string, _ Question) error { <-ctx.Done(); return ctx.Err() })
		var wg sync.WaitGroup
		start := time.Now()
		fast := make(chan string, 20)
		var denied atomic.Int64
		for i := range 12 {
			wg.Go(func() {
				c, err := net.Dial("tcp", f.proxy)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				fmt.Fprintf(c, "CONNECT n%d.test:443 HTTP/1.1\r\nHost: n%d.test:443\r\nProxy-Authorization: Bearer %s\r\n\r\n", i, i, tok)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil || resp.StatusCode != http.StatusForbidden {
					t.Errorf("n%d.test: %v %v", i, resp, err)
					return
				}
				denied.Add(1)
				if time.Since(start) < time.Second {
					fast <- fmt.Sprint(i)
				}
			})
			// One at a time: the first maxQuestions are asked, the rest
			// denied at once.
			testkit.Eventually(t, 5*time.Second, fmt.Sprintf("n%d.test held or denied", i), func() bool {
				return int64(f.p.held(tok))+denied.Load() == int64(i+1)
			})
		}
		wg.Wait()
		if n := a.calls.Load(); n != maxQuestions || len(fast) != 12-maxQuestions {
			t.Errorf("%d questions asked, %d denied at once; want %d and %d", n, len(fast), maxQuestions, 12-maxQuestions)
		}
		f.entry(t, tok, "a question not asked", func(e Entry) bool {
			return e.Rule == "not in allowlist (not asked: 8 questions already wait)"
		})
	})
	t.Run("not for what no answer could allow", func(t *testing.T) {
		reset()
		a.answer(func(context.Context, string, Question) error { return nil })
		for _, u := range []string{"http://metadata.test/", "http://203.0.113.11/"} {
			if res := f.curl(t, "", f.proxyEnv(tok), u); strings.Contains(res.out, "hello") {
				t.Errorf("%s: %v", u, res)
			}
		}
		if n := a.calls.Load(); n != 0 {
			t.Errorf("asked %d times about addresses: %+v", n, a.questions())
		}
	})
	t.Run("not unless the policy says so", func(t *testing.T) {
		reset()
		f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
		a.answer(func(context.Context, string, Question) error { return nil })
		if res := f.curl(t, "", f.proxyEnv(tok), "http://denied.test/"); strings.Contains(res.out, "hello") || a.calls.Load() != 0 {
			t.Errorf("%v, %d questions", res, a.calls.Load())
		}
	})
	t.Run("a DNS query", func(t *testing.T) {
		reset()
		sb := newSandbox(t, f.p, tok)
		a.answer(func(ctx context.Context, token string, q Question) error {
			f.jobs.widen(t, f.p, token, q.Name)
			return nil
		})
		c, err := dialIn(sb.ns, "udp", testnet.DNSServer)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		co := &dns.Conn{Conn: c}
		q := new(dns.Msg)
		q.SetQuestion("denied.test.", dns.TypeA)
		co.SetDeadline(time.Now().Add(5 * time.Second))
		co.WriteMsg(q)
		r, err := co.ReadMsg()
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("%v %v", r, err)
		}
		if a.questions()[0] != (Question{Name: "denied.test", Via: ViaDNS}) {
			t.Errorf("asked %+v", a.questions())
		}
	})
}
