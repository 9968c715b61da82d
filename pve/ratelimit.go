package pve

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"time"
)

// tokenBucket allows rate requests per second on average and burst at
// once. A nil *tokenBucket does not limit.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

func newTokenBucket(rate float64, burst int) *tokenBucket {
	if rate <= 0 {
		return nil
	}
	if burst < 1 {
		burst = 1
	}
	return &tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst), now: time.Now}
}

// reserve takes a token and says how long to wait before using it.
func (b *tokenBucket) reserve() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// wait blocks until the caller may send a request, or ctx ends (the
// token stays spent: a cancelled caller does not hand its turn back).
func (b *tokenBucket) wait(ctx context.Context) error {
	if b == nil {
		return ctx.Err()
	}
	d := b.reserve()
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// nodeSlots bounds the calls in flight to each node (Config.NodeCalls).
// A nil *nodeSlots does not bound.
type nodeSlots struct {
	mu    sync.Mutex
	max   int
	slots map[string]chan struct{}
}

func newNodeSlots(n int) *nodeSlots {
	if n <= 0 {
		return nil
	}
	return &nodeSlots{max: n, slots: map[string]chan struct{}{}}
}

// acquire waits for a slot of node ("": a call to no node, unbounded) and
// returns its release.
func (s *nodeSlots) acquire(ctx context.Context, node string) (func(), error) {
	if s == nil || node == "" {
		return func() {}, ctx.Err()
	}
	s.mu.Lock()
	ch := s.slots[node]
	if ch == nil {
		ch = make(chan struct{}, s.max)
		s.slots[node] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-ch }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pathNode is the node of a path "/nodes/{node}/...", "" for others.
func pathNode(path string) string {
	rest, ok := strings.CutPrefix(path, "/nodes/")
	if !ok {
		return ""
	}
	node, _, _ := strings.Cut(rest, "/")
	if n, err := url.PathUnescape(node); err == nil {
		return n
	}
	return node
}
