package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/dashboard"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/delegate-dev/delegate/mock"
)

// The dashboard over a mock JobService: what it asks the service, and
// what it shows of the answers. Strings a job controls are hostile here.

const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>"'&`

const token = "dashboard-test-token-0123456789"

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func intp(n int) *int { return &n }

func summaries() []delegate.JobSummary {
	return []delegate.JobSummary{
		{ID: "job-new", Status: delegate.StatusRunning, AgentType: delegate.AgentScript, Task: hostile, Progress: "step " + hostile,
			CreatedAt: t0.Add(time.Minute), StartedAt: t0.Add(time.Minute)},
		{ID: "job-old", Status: delegate.StatusFailed, AgentType: delegate.AgentScript, Task: "exit 3",
			CreatedAt: t0, StartedAt: t0, FinishedAt: t0.Add(3 * time.Second), ExitCode: intp(3), ExitReason: delegate.ExitReasonExited},
		{ID: "job-slow", Status: delegate.StatusTimeout, AgentType: delegate.AgentScript, Task: "sleep 99",
			CreatedAt: t0, StartedAt: t0, FinishedAt: t0.Add(3 * time.Second), ExitCode: intp(137), ExitReason: delegate.ExitReasonTimeout},
	}
}

func get(t *testing.T, h http.Handler, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// noInlineCode checks a page against its own CSP: no inline script, no
// inline style, no event handler attribute, nothing from elsewhere.
func noInlineCode(t *testing.T, page string) {
	t.Helper()
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`<script(?:\s[^>]*)?>[^<]`), // a script with a body
		regexp.MustCompile(`<script(?:(?:\s[^>]*)?)?>\s*</script>`),
		regexp.MustCompile(`(?i)<[^>]+\son[a-z]+\s*=`),
		regexp.MustCompile(`(?i)<[^>]+\sstyle\s*=`),
		regexp.MustCompile(`(?i)(?:src|href|action)="(?:https?:)?//`),
	} {
		for _, m := range re.FindAllString(page, -1) {
			if m == `<script src="/static/app.js" defer></script>` {
				continue
			}
			t.Errorf("page has %q", m)
		}
	}
	if strings.Count(page, "<script") != 1 {
		t.Errorf("page has %d script elements, want only /static/app.js", strings.Count(page, "<script"))
	}
}

func TestListShowsJobsEscaped(t *testing.T) {
	var asked delegate.ListOptions
	svc := &mock.JobService{ListFn: func(ctx context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
		asked = o
		return &delegate.JobPage{Jobs: summaries(), NextCursor: "c2"}, nil
	}}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/")
	if w.Code != 200 {
		t.Fatalf("GET /: %d %s", w.Code, w.Body)
	}
	page := w.Body.String()
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") {
		t.Fatal("a job's task reached the page as markup")
	}
	for _, want := range []string{
		`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&#34;&#39;&amp;`,
		`href="/jobs/job-new"`, `href="/jobs/job-old"`,
		`<span class="status st-running">running</span>`, `<span class="status st-failed">failed</span>`,
		`href="/?cursor=c2" rel="next"`, // the next page
		// The exit code as the process ended, and why, apart (exit.go).
		`<td data-label="Exit">3</td>`, `<td data-label="Exit">137 (timeout)</td>`,
		`data-live="/events"`,
		`<footer class="foot">delegate ` + buildinfo.Version() + `</footer>`, // the version shown everywhere
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the list lacks %s", want)
		}
	}
	if strings.Index(page, "job-new") > strings.Index(page, "job-old") {
		t.Error("not in the service's order (newest first)")
	}
	if asked != (delegate.ListOptions{}) {
		t.Errorf("asked the service for %+v", asked)
	}
	noInlineCode(t, page)
	for name, want := range map[string]string{
		"Content-Security-Policy": "default-src 'none'; script-src 'self'",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Cache-Control":           "no-store",
	} {
		if !strings.HasPrefix(w.Header().Get(name), want) {
			t.Errorf("%s: %q", name, w.Header().Get(name))
		}
	}
}

func TestListFilterAndPage(t *testing.T) {
	var asked delegate.ListOptions
	svc := &mock.JobService{ListFn: func(ctx context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
		asked = o
		if !o.Status.Valid() && o.Status != "" {
			return nil, &delegate.FieldError{Field: "status", Rule: "must be one of pending, running…"}
		}
		return &delegate.JobPage{}, nil
	}}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/?status=failed&cursor=abc")
	if w.Code != 200 || asked.Status != delegate.StatusFailed || asked.Cursor != "abc" {
		t.Fatalf("%d, asked %+v", w.Code, asked)
	}
	page := w.Body.String()
	for _, want := range []string{
		`<a href="/?status=failed" aria-current="page">failed</a>`,
		`No failed jobs on this page.`,
		`<a href="/?status=failed">← Newest</a>`,
		`data-live="/events?cursor=abc&amp;status=failed"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	w = get(t, h, "/?status=<bogus>")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "status: must be one of") || strings.Contains(w.Body.String(), "<bogus>") {
		t.Errorf("bad filter: %d %s", w.Code, w.Body)
	}
}

func runningJob(mode delegate.StatusMode) *delegate.Job {
	return &delegate.Job{ID: "job-1", Status: delegate.StatusRunning, Progress: "compiling " + hostile, Backend: "local",
		Manifest:  delegate.Manifest{Task: "make && " + hostile, AgentType: delegate.AgentScript, StatusMode: mode, Timeout: new(60)},
		CreatedAt: t0, StartedAt: t0}
}

func TestJobPageWhileRunning(t *testing.T) {
	svc := &mock.JobService{
		GetFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			if id != "job-1" {
				return nil, fmt.Errorf("job %q: %w", id, delegate.ErrNotFound)
			}
			return runningJob(delegate.StatusModeDetailed), nil
		},
		TimelineFn: func(ctx context.Context, id string) ([]delegate.Event, error) {
			return []delegate.Event{{Time: t0, Message: "started " + hostile}}, nil
		},
	}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/jobs/job-1")
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	page := w.Body.String()
	for _, want := range []string{
		`<h1 class="job-id">job-1</h1>`,
		`<span class="status st-running">running</span>`,
		`compiling &lt;script&gt;`, `make &amp;&amp; &lt;script&gt;`, `started &lt;script&gt;`,
		`<details class="cancel" id="cancel-job-1">`, // an id: a live update keeps it open (app.js)
		`<form method="post" action="/jobs/job-1/cancel">`,
		`Shown when the job ends`,
		`data-live="/jobs/job-1/events"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	noInlineCode(t, page)
	if w := get(t, h, "/jobs/job-2"); w.Code != 404 || !strings.Contains(w.Body.String(), "No such job") {
		t.Errorf("unknown job: %d", w.Code)
	}
}

func TestJobPageWhenFinished(t *testing.T) {
	j := runningJob(delegate.StatusModeSimple)
	j.Status, j.FinishedAt, j.ExitCode, j.Error = delegate.StatusFailed, t0.Add(90*time.Second), intp(3), "exit code 3"
	svc := &mock.JobService{
		GetFn:      func(ctx context.Context, id string) (*delegate.Job, error) { return j, nil },
		TimelineFn: func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil },
		ResultFn: func(ctx context.Context, id string, o delegate.ResultOptions) (*delegate.JobResult, error) {
			return &delegate.JobResult{JobID: id, Status: j.Status, ExitCode: j.ExitCode,
				Output: []byte("stdout only"), OutputOffset: 10, OutputBytes: 5000,
				Result: "summary " + hostile,
				Artifacts: []delegate.Artifact{
					{Name: "out/report <1>.txt", Size: 2048, SHA256: "ab12"},
					{Name: "../../etc/passwd?#x", Size: 1, SHA256: "cd34"},
					{Name: "big.bin", Size: 1 << 30, Skipped: "over the 16 MiB cap"},
				}}, nil
		},
	}
	// The page shows the end of the log: both streams, stderr marked.
	svc.LogsFn = func(ctx context.Context, id string, o delegate.LogOptions) (*delegate.LogPage, error) {
		if !o.Tail || o.MaxBytes != delegate.DefaultOutputTail {
			t.Errorf("log read with %+v, want its tail", o)
		}
		streams := []delegate.Output{{Stream: delegate.StreamStdout, Data: []byte("line 1\n" + hostile + "\n")},
			{Stream: delegate.StreamStderr, Data: []byte("oops " + hostile + "\n")}, {Stream: delegate.StreamStdout, Data: []byte("\xff\xfe end")}}
		return &delegate.LogPage{JobID: id, Status: j.Status, Output: delegate.JoinOutput(streams), Streams: streams, Offset: 10, Done: true}, nil
	}
	page := get(t, handler(svc, dashboard.Options{}), "/jobs/job-1").Body.String()
	if strings.Contains(page, "stdout only") {
		t.Error("the page shows the result's stdout, not the log")
	}
	for _, want := range []string{
		"line 1\n&lt;script&gt;", "\uFFFD end", // invalid UTF-8 shown as a replacement character
		`<span class="stderr">oops &lt;script&gt;`,
		`summary &lt;script&gt;`,
		`None kept: the job was submitted with statusMode simple.`,
		`showing the last`, `href="/jobs/job-1/output" download`,
		`href="/jobs/job-1/artifacts/out/report%20%3C1%3E.txt" download>out/report &lt;1&gt;.txt</a>`,
		`href="/jobs/job-1/artifacts/../../etc/passwd%3F%23x"`,
		`big.bin <span class="skipped">not kept: over the 16 MiB cap</span>`,
		`1m 30s`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "/cancel") || strings.Contains(page, "data-live") {
		t.Error("a finished job offers cancel or live updates")
	}
	noInlineCode(t, page)
}

func TestCancel(t *testing.T) {
	var cancelled []string
	svc := &mock.JobService{CancelFn: func(ctx context.Context, id string) (*delegate.Job, bool, error) {
		cancelled = append(cancelled, id)
		return &delegate.Job{ID: id, Status: delegate.StatusCancelled}, id == "job-1", nil
	}}
	h := handler(svc, dashboard.Options{})
	post := func(path string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// Another site's page submitting the form: refused before the service.
	for _, hdr := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Origin", "https://evil.example"},
		{"Sec-Fetch-Site", "same-site"},
	} {
		if w := post("/jobs/job-1/cancel", hdr...); w.Code != 403 {
			t.Errorf("cross-origin cancel %v: %d", hdr, w.Code)
		}
	}
	if len(cancelled) > 0 {
		t.Fatalf("a cross-site request cancelled %v", cancelled)
	}
	w := post("/jobs/job-1/cancel", "Sec-Fetch-Site", "same-origin")
	if w.Code != 303 || w.Header().Get("Location") != "/jobs/job-1?notice=cancelled" {
		t.Errorf("cancel: %d Location %q", w.Code, w.Header().Get("Location"))
	}
	w = post("/jobs/job-2/cancel", "Origin", "http://example.com") // httptest's host
	if w.Code != 303 || w.Header().Get("Location") != "/jobs/job-2?notice=finished" {
		t.Errorf("cancel of a finished job: %d Location %q", w.Code, w.Header().Get("Location"))
	}
	if fmt.Sprint(cancelled) != "[job-1 job-2]" {
		t.Errorf("cancelled %v", cancelled)
	}
	if w := get(t, h, "/jobs/job-1/cancel"); w.Code == 303 || len(cancelled) != 2 {
		t.Errorf("GET cancelled a job: %d", w.Code)
	}
}

func TestDownloads(t *testing.T) {
	out := strings.Repeat("x", 100) + "<html><script>alert(1)</script>"
	svc := &mock.JobService{
		ReadArtifactFn: func(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
			if name != "out/page.html" {
				return delegate.Artifact{}, nil, fmt.Errorf("artifact %q: %w", name, delegate.ErrNotFound)
			}
			return delegate.Artifact{Name: name, Size: 6}, []byte("<html>"), nil
		},
		LogsFn: func(ctx context.Context, id string, o delegate.LogOptions) (*delegate.LogPage, error) {
			// Pages of 40 bytes.
			from := 0
			if o.Cursor != "" {
				fmt.Sscan(o.Cursor, &from)
			}
			to := min(from+40, len(out))
			return &delegate.LogPage{JobID: id, Output: []byte(out[from:to]), NextCursor: fmt.Sprint(to), Done: to == len(out)}, nil
		},
	}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/jobs/job-1/artifacts/out/page.html")
	if w.Code != 200 || w.Body.String() != "<html>" {
		t.Fatalf("artifact: %d %q", w.Code, w.Body)
	}
	for name, want := range map[string]string{
		"Content-Type":            "application/octet-stream",
		"Content-Disposition":     "attachment; filename=page.html",
		"Content-Security-Policy": "sandbox",
		"X-Content-Type-Options":  "nosniff",
	} {
		if got := w.Header().Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if w := get(t, h, "/jobs/job-1/artifacts/nope"); w.Code != 404 {
		t.Errorf("missing artifact: %d", w.Code)
	}
	w = get(t, h, "/jobs/job-1/output")
	if w.Code != 200 || w.Body.String() != out || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") ||
		!strings.HasPrefix(w.Header().Get("Content-Disposition"), "attachment") {
		t.Errorf("output: %d %q %v", w.Code, w.Body, w.Header())
	}
}

func TestSignIn(t *testing.T) {
	tok, err := httpauth.New(token)
	if err != nil {
		t.Fatal(err)
	}
	var listed int
	svc := &mock.JobService{
		ListFn: func(ctx context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
			listed++
			return &delegate.JobPage{Jobs: summaries()}, nil
		},
		GetFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			return runningJob(delegate.StatusModeSimple), nil
		},
	}
	h := handler(svc, dashboard.Options{Token: tok})

	// Without the token: the sign-in form, and no job read.
	for _, path := range []string{"/", "/jobs/job-1", "/jobs/job-1/output", "/jobs/job-1/artifacts/a", "/events"} {
		w := get(t, h, path, "Accept", "text/html")
		if w.Code != 401 || w.Header().Get("WWW-Authenticate") != `Bearer realm="delegate"` {
			t.Errorf("%s without the token: %d %q", path, w.Code, w.Header().Get("WWW-Authenticate"))
		}
		if strings.Contains(w.Body.String(), "job-") && !strings.Contains(w.Body.String(), `value="`+path+`"`) {
			t.Errorf("%s without the token shows a job:\n%s", path, w.Body)
		}
	}
	if w := get(t, h, "/events", "Accept", "text/event-stream"); w.Code != 401 || strings.Contains(w.Body.String(), "<form") {
		t.Errorf("a script's request gets %d %q, want a plain 401", w.Code, w.Body)
	}
	if listed > 0 {
		t.Fatal("jobs were listed without the token")
	}
	w := get(t, h, "/")
	if !strings.Contains(w.Body.String(), `<form method="post" action="/login">`) || !strings.Contains(w.Body.String(), `name="next" value="/"`) {
		t.Errorf("no sign-in form:\n%s", w.Body)
	}

	// The bearer token works without signing in.
	if w := get(t, h, "/", "Authorization", "Bearer "+token); w.Code != 200 || !strings.Contains(w.Body.String(), "job-new") {
		t.Errorf("with the bearer token: %d", w.Code)
	}

	login := func(tokenValue, next string, hdr ...string) *httptest.ResponseRecorder {
		form := url.Values{"token": {tokenValue}, "next": {next}}
		r := httptest.NewRequest("POST", "/login", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := login("wrong-token-wrong-token", "/"); w.Code != 401 || len(w.Result().Cookies()) > 0 ||
		!strings.Contains(w.Body.String(), "not the token") {
		t.Errorf("wrong token: %d cookies %v", w.Code, w.Result().Cookies())
	}
	if w := login(token, "/", "Sec-Fetch-Site", "cross-site"); w.Code != 403 || len(w.Result().Cookies()) > 0 {
		t.Errorf("cross-site sign-in: %d", w.Code)
	}
	w = login(token, "/jobs/job-1")
	cookies := w.Result().Cookies()
	if w.Code != 303 || w.Header().Get("Location") != "/jobs/job-1" || len(cookies) != 1 {
		t.Fatalf("sign-in: %d %q %v", w.Code, w.Header().Get("Location"), cookies)
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || strings.Contains(c.Value, token) {
		t.Errorf("session cookie %+v", c)
	}
	for _, next := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"} {
		if w := login(token, next); w.Header().Get("Location") != "/" {
			t.Errorf("next=%q redirects to %q", next, w.Header().Get("Location"))
		}
	}

	// Signed in: the list, with a sign-out button.
	r := httptest.NewRequest("GET", "/", nil)
	r.AddCookie(c)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "job-new") || !strings.Contains(w.Body.String(), `action="/logout"`) {
		t.Fatalf("signed in: %d", w.Code)
	}
	r = httptest.NewRequest("POST", "/logout", nil)
	r.AddCookie(c)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if out := w.Result().Cookies(); w.Code != 303 || len(out) != 1 || out[0].MaxAge >= 0 {
		t.Errorf("sign-out: %d %v", w.Code, out)
	}
}

// sse reads server-sent events.
type sse struct {
	sc *bufio.Scanner
}

type event struct{ name, data string }

func (s *sse) next(t *testing.T) event {
	t.Helper()
	var ev event
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "" && ev.name != "":
			return ev
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data += strings.TrimPrefix(line, "data: ")
		}
	}
	t.Fatalf("stream ended: %v", s.sc.Err())
	return ev
}

func openStream(t *testing.T, url string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %s %s", url, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	return &sse{sc: sc}
}

func decode(t *testing.T, data string) map[string]string {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("event data %q: %v", data, err)
	}
	return m
}

// watcher stands in for the service's Watch.
type watcher struct {
	mu sync.Mutex
	ch chan string
}

func (w *watcher) watch(ctx context.Context) <-chan string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ch = make(chan string, 8)
	return w.ch
}

func (w *watcher) changed(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		w.ch <- id
	}
}

func TestListLiveUpdates(t *testing.T) {
	var (
		mu   sync.Mutex
		jobs = summaries()[1:]
	)
	w := &watcher{}
	svc := &mock.JobService{
		ListFn: func(ctx context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
			mu.Lock()
			defer mu.Unlock()
			return &delegate.JobPage{Jobs: append([]delegate.JobSummary(nil), jobs...)}, nil
		},
		WatchFn: w.watch,
	}
	// A poll slower than the test: what it sees comes through Watch.
	srv := httptest.NewServer(handler(svc, dashboard.Options{Poll: time.Hour}))
	t.Cleanup(srv.Close)
	s := openStream(t, srv.URL+"/events")
	ev := s.next(t)
	if ev.name != "html" || !strings.Contains(decode(t, ev.data)["html"], "job-old") {
		t.Fatalf("first event %+v", ev)
	}
	mu.Lock()
	jobs = summaries() // a new job, with a hostile task
	mu.Unlock()
	w.changed("job-new")
	ev = s.next(t)
	html := decode(t, ev.data)["html"]
	if ev.name != "html" || !strings.Contains(html, `href="/jobs/job-new"`) || !strings.Contains(html, "job-old") {
		t.Fatalf("after a change: %+v", ev)
	}
	if strings.Contains(html, "<script>") || !strings.Contains(html, "&lt;script&gt;") {
		t.Errorf("the live fragment is not escaped: %s", html)
	}
}

// The poll finds what other processes changed (Watch only hears this one).
func TestListLiveUpdatesByPolling(t *testing.T) {
	var (
		mu   sync.Mutex
		jobs = summaries()[1:]
	)
	svc := &mock.JobService{
		ListFn: func(ctx context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
			mu.Lock()
			defer mu.Unlock()
			return &delegate.JobPage{Jobs: append([]delegate.JobSummary(nil), jobs...)}, nil
		},
		WatchFn: func(ctx context.Context) <-chan string { return make(chan string) }, // never says anything
	}
	srv := httptest.NewServer(handler(svc, dashboard.Options{Poll: 50 * time.Millisecond}))
	t.Cleanup(srv.Close)
	s := openStream(t, srv.URL+"/events?status=failed")
	s.next(t)
	mu.Lock()
	jobs = summaries()
	mu.Unlock()
	if ev := s.next(t); !strings.Contains(decode(t, ev.data)["html"], "job-new") {
		t.Fatalf("the poll did not bring the new job: %+v", ev)
	}
}

func TestJobLiveLogAndEnd(t *testing.T) {
	var (
		mu     sync.Mutex
		j      = runningJob(delegate.StatusModeStreaming)
		output = "first line\n"
	)
	w := &watcher{}
	svc := &mock.JobService{
		GetFn: func(ctx context.Context, id string) (*delegate.Job, error) {
			mu.Lock()
			defer mu.Unlock()
			c := *j
			return &c, nil
		},
		TimelineFn: func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil },
		LogsFn: func(ctx context.Context, id string, o delegate.LogOptions) (*delegate.LogPage, error) {
			mu.Lock()
			defer mu.Unlock()
			from := 0
			if o.Cursor != "" {
				fmt.Sscan(o.Cursor, &from)
			}
			return &delegate.LogPage{JobID: id, Output: []byte(output[from:]), NextCursor: fmt.Sprint(len(output)),
				Done: j.Status.Terminal()}, nil
		},
		ResultFn: func(ctx context.Context, id string, o delegate.ResultOptions) (*delegate.JobResult, error) {
			mu.Lock()
			defer mu.Unlock()
			return &delegate.JobResult{JobID: id, Status: j.Status, Output: []byte(output), OutputBytes: int64(len(output))}, nil
		},
		WatchFn: w.watch,
	}
	srv := httptest.NewServer(handler(svc, dashboard.Options{Poll: time.Hour}))
	t.Cleanup(srv.Close)

	// The page itself has the empty live log the stream fills.
	resp, err := http.Get(srv.URL + "/jobs/job-1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `id="log"`) {
		t.Fatalf("a streaming job's page has no live log:\n%s", b)
	}

	s := openStream(t, srv.URL+"/jobs/job-1/events")
	if ev := s.next(t); ev.name != "log" || decode(t, ev.data)["text"] != "first line\n" {
		t.Fatalf("first event %+v", ev)
	}
	if ev := s.next(t); ev.name != "html" || !strings.Contains(decode(t, ev.data)["html"], `id="log"`) {
		t.Fatalf("second event %+v", ev)
	}
	mu.Lock()
	output += hostile + "\n"
	mu.Unlock()
	w.changed("job-other") // not this job: no render
	w.changed("job-1")
	if ev := s.next(t); ev.name != "log" || decode(t, ev.data)["text"] != hostile+"\n" {
		t.Fatalf("more output: %+v", ev)
	}
	mu.Lock()
	j.Status, j.FinishedAt, j.ExitCode = delegate.StatusSuccess, t0.Add(time.Second), intp(0)
	mu.Unlock()
	w.changed("job-1")
	ev := s.next(t)
	html := decode(t, ev.data)["html"]
	if ev.name != "html" || !strings.Contains(html, "st-success") || strings.Contains(html, `id="log"`) ||
		!strings.Contains(html, "first line\n&lt;script&gt;") {
		t.Fatalf("final render: %+v", ev)
	}
	if ev := s.next(t); ev.name != "end" {
		t.Fatalf("want end, got %+v", ev)
	}
}

func TestStaticAndUnknown(t *testing.T) {
	h := handler(&mock.JobService{}, dashboard.Options{})
	for path, want := range map[string]string{"/static/app.js": "EventSource", "/static/style.css": "prefers-color-scheme"} {
		if w := get(t, h, path); w.Code != 200 || !strings.Contains(w.Body.String(), want) {
			t.Errorf("%s: %d", path, w.Code)
		}
	}
	if w := get(t, h, "/nope"); w.Code != 404 {
		t.Errorf("/nope: %d", w.Code)
	}
	// Signing in without a token to ask for goes straight in.
	if w := get(t, h, "/login?next=/jobs/x"); w.Code != 303 || w.Header().Get("Location") != "/jobs/x" {
		t.Errorf("/login without a token: %d %q", w.Code, w.Header().Get("Location"))
	}
}

// TestServiceErrorTable: a service error's kind decides the page's status
// and words; a missing artifact is named as one (not as a missing job);
// an error of no kind of ours is logged, never shown.
func TestServiceErrorTable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		code     int
		want     string
		notShown string
	}{
		{"an artifact", delegate.ArtifactNotFound("job-1", "nope"), 404, "No such artifact.", ""},
		{"an artifact not kept", &delegate.NotFoundError{Resource: "artifact", ID: "big", Of: "job job-1", Reason: "not kept: over the 16 MiB cap"},
			404, `artifact &#34;big&#34; of job job-1: not kept: over the 16 MiB cap`, ""},
		{"a job", delegate.JobNotFound("job-1"), 404, "No such job.", ""},
		{"unavailable", fmt.Errorf("%w: pve: 595 no route to host 10.0.0.7", delegate.ErrUnavailable), 503, "does not answer now", "10.0.0.7"},
		{"internal", fmt.Errorf("read artifact: %w", errors.New("open /var/lib/delegate/artifacts/ab/abcd: permission denied")), 500,
			"the server&#39;s log says what", "/var/lib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &mock.JobService{ReadArtifactFn: func(context.Context, string, string) (delegate.Artifact, []byte, error) {
				return delegate.Artifact{}, nil, tc.err
			}}
			h := handler(svc, dashboard.Options{})
			w := get(t, h, "/jobs/job-1/artifacts/nope", "Accept", "text/html")
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
				t.Errorf("%d, want %d with %q:\n%s", w.Code, tc.code, tc.want, w.Body)
			}
			if tc.notShown != "" && strings.Contains(w.Body.String(), tc.notShown) {
				t.Errorf("the page shows %q", tc.notShown)
			}
		})
	}
}

// handler is the dashboard over svc with the services it implements (as
// cmd/ wires the engine, which implements them all).
func handler(svc delegate.JobService, opts dashboard.Options) http.Handler {
	s := dashboard.Services{Jobs: svc}
	s.Sandboxes, _ = svc.(delegate.SandboxService)
	s.Questions, _ = svc.(delegate.QuestionService)
	s.Network, _ = svc.(delegate.NetworkService)
	s.Checkpoints, _ = svc.(delegate.CheckpointService)
	return dashboard.Handler(s, opts)
}
