package mcpserver

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestPollInterval: short while a job waits for its sandbox, growing with
// its age while it runs, never past its deadline, none once it has ended.
func TestPollInterval(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	timeout := func(s int) delegate.Manifest { return delegate.Manifest{Timeout: &s} }
	tests := []struct {
		name string
		job  delegate.Job
		want time.Duration
	}{
		{"just submitted", delegate.Job{Status: delegate.StatusPending, CreatedAt: now}, 500 * time.Millisecond},
		{"queued a minute", delegate.Job{Status: delegate.StatusPending, CreatedAt: ago(time.Minute)}, 2 * time.Second},
		{"a cold clone", delegate.Job{Status: delegate.StatusProvisioning, CreatedAt: ago(20 * time.Second)}, 2 * time.Second},
		{"running 1 s", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(time.Second), StartedAt: ago(time.Second)}, 500 * time.Millisecond},
		{"running 10 s", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(10 * time.Second), StartedAt: ago(10 * time.Second)}, 2500 * time.Millisecond},
		{"running 2 min", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(2 * time.Minute), StartedAt: ago(2 * time.Minute)}, 30 * time.Second},
		{"running an hour", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(time.Hour), StartedAt: ago(time.Hour), Manifest: timeout(7200)}, 30 * time.Second},
		{"3 s before its timeout", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(57 * time.Second), StartedAt: ago(57 * time.Second), Manifest: timeout(60)}, 3 * time.Second},
		{"past its timeout", delegate.Job{Status: delegate.StatusRunning, CreatedAt: ago(70 * time.Second), StartedAt: ago(70 * time.Second), Manifest: timeout(60)}, 500 * time.Millisecond},
		{"ended", delegate.Job{Status: delegate.StatusSuccess, CreatedAt: ago(time.Minute)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pollInterval(&tc.job, now); got != tc.want {
				t.Errorf("pollInterval = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestByProtocol: 2026-07-28 requests go to the stateless handler,
// everything else (initialize, a session's requests, GET and DELETE) to
// the stateful one.
func TestByProtocol(t *testing.T) {
	tests := []struct {
		method, version, session string
		modern                   bool
	}{
		{"POST", "", "", false},               // initialize
		{"POST", "2025-06-18", "s1", false},   // a session's request
		{"POST", "2025-11-25", "s1", false},   //
		{"GET", "2025-11-25", "s1", false},    // its event stream
		{"DELETE", "2025-11-25", "s1", false}, // its end
		{"POST", "2026-07-28", "", true},      // server/discover, every request
		{"POST", "2026-07-28", "s1", false},   // not a 2026-07-28 client
		{"POST", "2027-01-01", "", true},      // a newer one: the SDK answers which it has
	}
	for _, tc := range tests {
		var got string
		h := byProtocol(handlerNamed(&got, "modern"), handlerNamed(&got, "legacy"))
		r := httptestRequest(tc.method, tc.version, tc.session)
		h.ServeHTTP(nil, r)
		if (got == "modern") != tc.modern {
			t.Errorf("%s version %q session %q went to %s", tc.method, tc.version, tc.session, got)
		}
	}
}

func handlerNamed(got *string, name string) http.Handler {
	return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { *got = name })
}

func httptestRequest(method, version, session string) *http.Request {
	r := httptest.NewRequest(method, "/mcp", nil)
	if version != "" {
		r.Header.Set("Mcp-Protocol-Version", version)
	}
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
	}
	return r
}
