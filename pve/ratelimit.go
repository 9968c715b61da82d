package pve

import (
	"context"
	"net/url"
	"slices"
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
//
// Calls made in the background (Background: the warm pool's refill, whose
// agent pings of guests still booting hold a pvedaemon worker 3 s each)
// hold at most all slots but one of a node, and a freed slot goes to a
// waiting foreground call (a job's, a fork's) before a background one: a
// job never waits behind the pool's pings for more than one slot's time.
// The total in flight to a node stays NodeCalls (what pvedaemon's workers
// allow, Config.NodeCalls).
type nodeSlots struct {
	mu    sync.Mutex
	max   int
	bgMax int // background calls in flight at most: max-1, at least 1
	nodes map[string]*nodeQueue
}

// nodeQueue is one node's slots: the calls in flight and those waiting,
// in order.
type nodeQueue struct {
	busy, bgBusy int
	fg, bg       []chan struct{} // waiting; closed when given a slot
}

func newNodeSlots(n int) *nodeSlots {
	if n <= 0 {
		return nil
	}
	return &nodeSlots{max: n, bgMax: max(1, n-1), nodes: map[string]*nodeQueue{}}
}

type backgroundKey struct{}

// Background marks ctx's calls as background work (the warm pool's
// upkeep): they leave a node's last slot to foreground calls and give way
// to them (Config.NodeCalls).
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// IsBackground says whether ctx's calls are background work.
func IsBackground(ctx context.Context) bool {
	bg, _ := ctx.Value(backgroundKey{}).(bool)
	return bg
}

// acquire waits for a slot of node ("": a call to no node, unbounded) and
// returns its release.
func (s *nodeSlots) acquire(ctx context.Context, node string) (func(), error) {
	if s == nil || node == "" {
		return func() {}, ctx.Err()
	}
	bg := IsBackground(ctx)
	s.mu.Lock()
	q := s.nodes[node]
	if q == nil {
		q = &nodeQueue{}
		s.nodes[node] = q
	}
	var once sync.Once
	release := func() { once.Do(func() { s.release(q, bg) }) }
	if s.free(q, bg) && len(q.fg) == 0 && (!bg || len(q.bg) == 0) {
		s.take(q, bg)
		s.mu.Unlock()
		return release, ctx.Err()
	}
	ch := make(chan struct{})
	if bg {
		q.bg = append(q.bg, ch)
	} else {
		q.fg = append(q.fg, ch)
	}
	s.mu.Unlock()
	select {
	case <-ch:
		return release, nil
	case <-ctx.Done():
		s.mu.Lock()
		waiting := &q.fg
		if bg {
			waiting = &q.bg
		}
		if i := slices.Index(*waiting, ch); i >= 0 {
			*waiting = slices.Delete(*waiting, i, i+1)
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Unlock()
		release() // given a slot meanwhile: hand it on
		return nil, ctx.Err()
	}
}

// free says whether a call of the kind may take a slot of q now (s.mu
// held).
func (s *nodeSlots) free(q *nodeQueue, bg bool) bool {
	return q.busy < s.max && (!bg || q.bgBusy < s.bgMax)
}

func (s *nodeSlots) take(q *nodeQueue, bg bool) {
	q.busy++
	if bg {
		q.bgBusy++
	}
}

// release frees a slot of q and gives the free slots to the waiting
// calls: foreground ones first, in order.
func (s *nodeSlots) release(q *nodeQueue, bg bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.busy--
	if bg {
		q.bgBusy--
	}
	for {
		switch {
		case len(q.fg) > 0 && s.free(q, false):
			s.take(q, false)
			close(q.fg[0])
			q.fg = q.fg[1:]
		case len(q.bg) > 0 && s.free(q, true):
			s.take(q, true)
			close(q.bg[0])
			q.bg = q.bg[1:]
		default:
			return
		}
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
