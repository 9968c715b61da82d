package egress

import (
	"sync"
	"testing"
	"time"
)

// blockingSink holds Record until released, like a slow store.
type blockingSink struct {
	release chan struct{}
	mu      sync.Mutex
	got     []Entry
}

func (s *blockingSink) Record(token string, e Entry) {
	<-s.release
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, e)
}

// A sink that does not keep up costs the proxy at most LogQueue entries,
// and the loss is reported, not silent.
func TestLogQueueIsBounded(t *testing.T) {
	sink := &blockingSink{release: make(chan struct{})}
	q := newLogQueue(sink, 10)
	for i := range 1000 {
		q.add("job", Entry{Port: uint16(i + 1)})
	}
	q.mu.Lock()
	queued := len(q.q)
	q.mu.Unlock()
	// (A batch of at most 10, and the count of what was dropped before
	// it, may be in the sink's hands already.)
	if queued > 10 {
		t.Fatalf("%d entries queued, more than 10", queued)
	}
	close(sink.release)
	q.close()
	var lost int64
	n := 0
	for _, e := range sink.got {
		if e.Via == ViaLog {
			lost += e.Dropped
		} else {
			n++
		}
	}
	if n+int(lost) != 1000 || lost == 0 {
		t.Errorf("delivered %d and reported %d lost, of 1000", n, lost)
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(3)
	now := time.Now()
	r.Record("a", Entry{Time: now, Via: ViaConnect, Name: "allowed.test", Port: 443, Allowed: true, Sent: 10, Received: 100})
	r.Record("a", Entry{Time: now, Via: ViaConnect, Name: "denied.test", Port: 443, Rule: "not in allowlist"})
	r.Record("a", Entry{Time: now, Via: ViaDNS, Name: "denied.test", QType: "A", Port: 53, Rule: "not in allowlist"})
	r.Record("a", Entry{Time: now, Via: ViaConnect, Name: "denied.test", Port: 443, Rule: "not in allowlist"})
	r.Record("a", Entry{Via: ViaLog, Dropped: 5})
	r.Record("b", Entry{Via: ViaHTTP, Name: "x.test", Allowed: true})
	s := r.Summary("a")
	if s.Allowed != 1 || s.Denied != 3 || s.Sent != 10 || s.Received != 100 || s.Dropped != 5 {
		t.Errorf("summary %+v", s)
	}
	if len(s.DeniedNames) != 2 || s.DeniedNames[0] != "denied.test:443" || s.DeniedNames[1] != "denied.test" {
		t.Errorf("denied names %q", s.DeniedNames)
	}
	es := r.Entries("a")
	if len(es) != 3 || es[0].Via != ViaDNS || es[2].Via != ViaLog {
		t.Errorf("kept %+v, want the newest 3, oldest first", es)
	}
	r.Forget("a")
	if len(r.Entries("a")) != 0 || r.Summary("b").Allowed != 1 {
		t.Error("Forget")
	}
}
