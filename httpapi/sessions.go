package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// sessionHeader is where Streamable HTTP carries an MCP session's id.
const sessionHeader = "Mcp-Session-Id"

// DefaultMaxSessions is how many MCP sessions are kept at most.
const DefaultMaxSessions = 1000

// SessionLimiter caps the live sessions of a stateful Streamable HTTP MCP
// handler. Every initialize makes a session that the handler keeps until
// its idle timeout (each some 15 KB: 5,000 of them held 74 MB for 30
// minutes); past the cap, the session idle the longest is closed, with
// the DELETE a client would send, so the handler frees it as it frees any
// ended session.
//
// It sees sessions only through the protocol's headers: a response that
// carries a new Mcp-Session-Id starts one, a DELETE ends one, and one idle
// for longer than the handler's session timeout is taken to be gone.
type SessionLimiter struct {
	next    http.Handler
	max     int
	timeout time.Duration // the handler's idle timeout; 0: none
	now     func() time.Time

	mu       sync.Mutex
	sessions map[string]*sessionUse
	// closing counts the evicted sessions being closed (Wait).
	closing sync.WaitGroup
}

// Wait returns once the sessions the limiter evicted are closed. A server
// calls it after it has stopped serving: closing one waits for its
// requests in flight, which end with the server's requests.
func (l *SessionLimiter) Wait() { l.closing.Wait() }

// sessionUse is what the limiter knows of one session.
type sessionUse struct {
	last     time.Time // when its last POST began or ended
	inflight int       // POSTs being served
}

// LimitSessions wraps an MCP handler whose sessions close after
// idleTimeout (0: never) so that at most max (DefaultMaxSessions when 0)
// live at once.
func LimitSessions(next http.Handler, max int, idleTimeout time.Duration) *SessionLimiter {
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return &SessionLimiter{next: next, max: max, timeout: idleTimeout, now: time.Now, sessions: make(map[string]*sessionUse)}
}

// Len is the number of sessions the limiter counts as live.
func (l *SessionLimiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked()
	return len(l.sessions)
}

func (l *SessionLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(sessionHeader)
	switch {
	case id != "" && r.Method == http.MethodPost:
		l.begin(id)
		defer l.end(id, false)
	case id != "" && r.Method == http.MethodDelete:
		defer l.end(id, true)
	case id == "" && r.Method == http.MethodPost:
		// A POST without a session id may start one (initialize): the id
		// is in the response's header, registered as soon as it is written.
		sw := &sessionWriter{ResponseWriter: w, started: l.started}
		l.next.ServeHTTP(sw, r)
		if sw.id != "" {
			l.end(sw.id, false)
		}
		return
	}
	// A GET (the session's event stream) is not activity: like the
	// handler's idle timeout, only the client's messages (POSTs) are.
	l.next.ServeHTTP(w, r)
}

// begin marks a POST of a known session as in flight.
func (l *SessionLimiter) begin(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sessions[id]; s != nil {
		s.inflight++
		s.last = l.now()
	}
}

// end marks a POST done; a DELETE forgets the session.
func (l *SessionLimiter) end(id string, deleted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[id]
	if s == nil {
		return
	}
	if deleted {
		delete(l.sessions, id)
		return
	}
	s.inflight = max(0, s.inflight-1)
	s.last = l.now()
}

// started registers a new session (with its first request in flight)
// and closes the longest idle ones beyond the cap.
func (l *SessionLimiter) started(id string) {
	l.mu.Lock()
	if _, ok := l.sessions[id]; ok {
		l.mu.Unlock()
		return
	}
	l.pruneLocked()
	l.sessions[id] = &sessionUse{last: l.now(), inflight: 1}
	var evict []string
	for len(l.sessions) > l.max {
		victim := l.idlestLocked(id)
		if victim == "" {
			break
		}
		delete(l.sessions, victim)
		evict = append(evict, victim)
	}
	l.mu.Unlock()
	// Closing waits for the session's requests in flight to end (a
	// wait_job may take 50 s): the new session does not wait for that.
	for _, victim := range evict {
		l.closing.Go(func() { l.close(victim) })
	}
}

// idlestLocked is the session idle the longest, other than keep. A
// session with a POST in flight (a tool call) is not idle.
func (l *SessionLimiter) idlestLocked(keep string) string {
	var (
		victim string
		oldest time.Time
	)
	now := l.now()
	for id, s := range l.sessions {
		if id == keep {
			continue
		}
		last := s.last
		if s.inflight > 0 {
			last = now
		}
		if victim == "" || last.Before(oldest) {
			victim, oldest = id, last
		}
	}
	return victim
}

// pruneLocked forgets the sessions the handler has closed for idleness.
func (l *SessionLimiter) pruneLocked() {
	if l.timeout <= 0 {
		return
	}
	now := l.now()
	for id, s := range l.sessions {
		if s.inflight == 0 && now.Sub(s.last) > l.timeout {
			delete(l.sessions, id)
		}
	}
}

// close ends a session as its client would: DELETE with its id.
// The request has a context of its own: the evicting request's would
// carry its connection's addresses, which the handler checks.
func (l *SessionLimiter) close(id string) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodDelete, "http://localhost/mcp", nil)
	if err != nil {
		return
	}
	req.Header.Set(sessionHeader, id)
	l.next.ServeHTTP(discardWriter{h: http.Header{}}, req)
}

// sessionWriter reports the session id of a response when its header is
// written. Unwrap keeps http.ResponseController (flushing a stream) working.
type sessionWriter struct {
	http.ResponseWriter
	started func(id string)
	id      string
	done    bool
}

func (w *sessionWriter) WriteHeader(code int) {
	if !w.done {
		w.done = true
		if id := w.Header().Get(sessionHeader); id != "" && code < 300 {
			w.id = id
			w.started(id)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *sessionWriter) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *sessionWriter) Flush() {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *sessionWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// discardWriter answers an internal request into nothing.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header         { return d.h }
func (d discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d discardWriter) WriteHeader(int)             {}
