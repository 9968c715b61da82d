package httpapi

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Body read limits of the HTTP servers. A submit_job with 64 MiB of files
// is some 90 MB of JSON: at 1 MB/s it takes 90 s, well inside
// BodyTotalTimeout; a client that stops sending for BodyIdleTimeout, or
// trickles for longer than BodyTotalTimeout, loses the connection.
const (
	BodyIdleTimeout  = 30 * time.Second
	BodyTotalTimeout = 5 * time.Minute
	// HeaderTimeout bounds reading a request's header.
	HeaderTimeout = 10 * time.Second
)

// BodyTimeout bounds reading each request's body: at most idle without a
// byte arriving, and total in all. Only the body: the response may stream
// for as long as it likes (an MCP event stream, a wait_job, the
// dashboard's live updates). http.Server.ReadTimeout bounds the total
// only, so a client that stalls mid-body would hold its connection for
// all of it.
func BodyTimeout(next http.Handler, idle, total time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		b := &deadlineBody{body: r.Body, rc: http.NewResponseController(w), idle: idle, end: time.Now().Add(total)}
		b.extend()
		defer b.clear()
		r.Body = b
		next.ServeHTTP(w, r)
	})
}

// deadlineBody moves the connection's read deadline on as the body
// arrives, and lifts it once the body has been read.
type deadlineBody struct {
	body io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	end  time.Time

	mu      sync.Mutex
	cleared bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err != nil {
		// EOF, or the deadline passed: either way reading is over.
		b.clear()
	} else if n > 0 {
		b.extend()
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.body.Close() }

func (b *deadlineBody) extend() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cleared {
		// An error means the connection cannot take deadlines; the header
		// timeout still holds.
		d := time.Now().Add(b.idle)
		if d.After(b.end) {
			d = b.end
		}
		_ = b.rc.SetReadDeadline(d)
	}
}

func (b *deadlineBody) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cleared {
		b.cleared = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

// LoopbackOnly refuses (403) a request that reached a loopback address
// under another host name: a web page whose name an attacker re-pointed at
// 127.0.0.1 (DNS rebinding) must not read the dashboard of a server that
// has no token. The MCP handler makes the same check.
func LoopbackOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && isLoopback(local.String()) && !isLoopback(r.Host) {
			http.Error(w, "forbidden: this server answers to localhost names only (Host "+r.Host+")", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isLoopback reports whether a host or host:port names this machine's
// loopback interface.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
