package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/dashboard"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/mock"
)

// The sandbox pages over mock services: the engine is both a JobService
// and a SandboxService.

type services struct {
	*mock.JobService
	*mock.SandboxService
}

func withSandboxes() services {
	return services{&mock.JobService{}, &mock.SandboxService{}}
}

func keptSandbox(id string, state delegate.SandboxState) delegate.Sandbox {
	now := time.Now()
	sb := delegate.Sandbox{ID: id, State: state, Backend: "local", Instance: "inst-hidden", JobID: "job-1",
		Resources: delegate.Resources{CPU: 2, Memory: "1G", Disk: "4G"},
		CreatedAt: now.Add(-(2*time.Hour + 3*time.Minute + 10*time.Second)), LastUsedAt: now.Add(-(31*time.Minute + 5*time.Second)),
		ExpiresAt: now.Add(21 * time.Hour), IdleTimeout: 30 * time.Minute, PauseTimeout: 24 * time.Hour, Commands: 4}
	if state == delegate.SandboxPaused {
		sb.PausedAt = now.Add(-time.Minute)
	}
	if state.Terminal() {
		sb.EndedAt, sb.Reason = now, "lifetime ended "+hostile
	}
	return sb
}

func TestSandboxesPage(t *testing.T) {
	svc := withSandboxes()
	var asked []delegate.SandboxListOptions
	svc.ListSandboxesFn = func(ctx context.Context, o delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
		asked = append(asked, o)
		running := keptSandbox("sbx-b", delegate.SandboxRunning)
		running.Running = 2
		list := []delegate.Sandbox{running, keptSandbox("sbx-a", delegate.SandboxPaused)}
		if o.All {
			list = append(list, keptSandbox("sbx-old", delegate.SandboxGone))
		}
		return list, nil
	}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/sandboxes")
	if w.Code != 200 {
		t.Fatalf("GET /sandboxes: %d %s", w.Code, w.Body)
	}
	page := w.Body.String()
	for _, want := range []string{
		`<a href="/">Jobs</a> <a href="/sandboxes">Sandboxes</a>`,
		`<tr data-sandbox="sbx-b">`, `href="/sandboxes/sbx-b"`, `<span class="status sb-running">running</span>`, `4 (2 running)`,
		`<tr data-sandbox="sbx-a">`, `<span class="status sb-paused">paused</span>`, `<td data-label="Idle">31m</td>`,
		`<td data-label="Age"><time datetime=`, `>2h03m</time>`, `from <a href="/jobs/job-1">job-1</a>`,
		`<details class="cancel" id="release-sbx-a">`, `<form method="post" action="/sandboxes/sbx-a/release">`,
		`Yes, release sbx-a`, `data-live="/sandboxes/events"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(page, "inst-hidden") || strings.Contains(page, "sbx-old") {
		t.Error("the page shows a backend's instance, or a sandbox gone without ?all")
	}
	noInlineCode(t, page)

	page = get(t, h, "/sandboxes?all=1").Body.String()
	if !asked[len(asked)-1].All || !strings.Contains(page, `sb-gone`) || !strings.Contains(page, `data-live="/sandboxes/events?all=1"`) {
		t.Errorf("?all=1: asked %+v", asked)
	}
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "lifetime ended &lt;script&gt;") {
		t.Error("a reason reached the page as markup")
	}
	if strings.Contains(page, "release-sbx-old") {
		t.Error("a gone sandbox offers release")
	}
	svc.ListSandboxesFn = func(context.Context, delegate.SandboxListOptions) ([]delegate.Sandbox, error) { return nil, nil }
	if page := get(t, h, "/sandboxes").Body.String(); !strings.Contains(page, "No kept sandboxes") {
		t.Errorf("an empty list says nothing:\n%s", page)
	}
}

func TestSandboxPage(t *testing.T) {
	svc := withSandboxes()
	state := delegate.SandboxPaused
	svc.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		if id != "sbx-a" {
			return nil, delegate.SandboxNotFound(id)
		}
		sb := keptSandbox(id, state)
		sb.Template = "debian " + hostile
		return &sb, nil
	}
	h := handler(svc, dashboard.Options{})
	w := get(t, h, "/sandboxes/sbx-a")
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	page := w.Body.String()
	for _, want := range []string{
		`<h1 class="job-id">sbx-a</h1>`, `<span class="status sb-paused">paused</span>`, `<a href="/jobs/job-1">job-1</a>`,
		`4 run`, `2 CPU, 1G memory, 4G disk, network none`, `local, debian &lt;script&gt;`, `(2h03m ago)`, `(idle 31m)`,
		`its memory kept; the next command resumes it`, `paused after 30m0s idle, destroyed after 24h0m0s paused`,
		`<form method="post" action="/sandboxes/sbx-a/release">`, `data-live="/sandboxes/sbx-a/events"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	noInlineCode(t, page)
	state = delegate.SandboxReleased
	page = get(t, h, "/sandboxes/sbx-a?notice=released").Body.String()
	if strings.Contains(page, "/release") || strings.Contains(page, "data-live") || !strings.Contains(page, "Released: its processes are killed") ||
		!strings.Contains(page, "Ended") {
		t.Errorf("a released sandbox's page:\n%s", page)
	}
	if w := get(t, h, "/sandboxes/sbx-x", "Accept", "text/html"); w.Code != 404 || !strings.Contains(w.Body.String(), "No such sandbox.") {
		t.Errorf("unknown sandbox: %d %s", w.Code, w.Body)
	}
}

func TestReleaseSandbox(t *testing.T) {
	svc := withSandboxes()
	var released []string
	svc.ReleaseSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
		released = append(released, id)
		if id == "sbx-x" {
			return nil, false, delegate.SandboxNotFound(id)
		}
		sb := keptSandbox(id, delegate.SandboxReleased)
		return &sb, id == "sbx-1", nil
	}
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
	for _, hdr := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "https://evil.example"}} {
		if w := post("/sandboxes/sbx-1/release", hdr...); w.Code != 403 {
			t.Errorf("cross-origin release %v: %d", hdr, w.Code)
		}
	}
	if len(released) > 0 {
		t.Fatalf("a cross-site request released %v", released)
	}
	if w := post("/sandboxes/sbx-1/release", "Sec-Fetch-Site", "same-origin"); w.Code != 303 || w.Header().Get("Location") != "/sandboxes/sbx-1?notice=released" {
		t.Errorf("release: %d %q", w.Code, w.Header().Get("Location"))
	}
	if w := post("/sandboxes/sbx-2/release", "Sec-Fetch-Site", "same-origin"); w.Code != 303 || w.Header().Get("Location") != "/sandboxes/sbx-2?notice=gone" {
		t.Errorf("release of a gone one: %d %q", w.Code, w.Header().Get("Location"))
	}
	if w := post("/sandboxes/sbx-x/release", "Sec-Fetch-Site", "same-origin", "Accept", "text/html"); w.Code != 404 || !strings.Contains(w.Body.String(), "No such sandbox.") {
		t.Errorf("release of an unknown one: %d", w.Code)
	}
	if w := get(t, h, "/sandboxes/sbx-1/release"); w.Code == 303 || len(released) != 3 {
		t.Errorf("GET released a sandbox: %d %v", w.Code, released)
	}
	// Signed out: refused before the service.
	auth, err := httpauth.New(token)
	if err != nil {
		t.Fatal(err)
	}
	tok := handler(svc, dashboard.Options{Token: auth})
	r := httptest.NewRequest("POST", "/sandboxes/sbx-1/release", nil)
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	rec := httptest.NewRecorder()
	tok.ServeHTTP(rec, r)
	if rec.Code != http.StatusUnauthorized || len(released) != 3 {
		t.Errorf("signed out: %d, released %v", rec.Code, released)
	}
}

// TestJobPageLinksItsSandbox: a command's page, and a persistent job's,
// name their kept sandbox.
func TestJobPageLinksItsSandbox(t *testing.T) {
	svc := withSandboxes()
	j := runningJob(delegate.StatusModeDetailed)
	svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { c := *j; return &c, nil }
	svc.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil }
	h := handler(svc, dashboard.Options{})
	if page := get(t, h, "/jobs/job-1").Body.String(); strings.Contains(page, "<dt>Sandbox</dt>") {
		t.Error("a job without a kept sandbox names one")
	}
	j.Sandbox, j.Manifest.Sandbox = "sbx-1", "sbx-1"
	if page := get(t, h, "/jobs/job-1").Body.String(); !strings.Contains(page, `<dt>Sandbox</dt><dd><a href="/sandboxes/sbx-1">sbx-1</a> <span class="kept">kept: the command ran in it</span>`) {
		t.Errorf("the command's page does not link its sandbox:\n%s", page)
	}
	j.Manifest.Sandbox, j.Manifest.Lifecycle = "", delegate.LifecyclePersistent
	if page := get(t, h, "/jobs/job-1").Body.String(); !strings.Contains(page, `<a href="/sandboxes/sbx-1">sbx-1</a> <span class="kept">kept after the job</span>`) {
		t.Errorf("a persistent job's page does not link its sandbox")
	}
}

// TestNoSandboxPagesWithoutSandboxes: a service that keeps none has no
// sandbox pages and no link to them.
func TestNoSandboxPagesWithoutSandboxes(t *testing.T) {
	svc := &mock.JobService{ListFn: func(context.Context, delegate.ListOptions) (*delegate.JobPage, error) {
		return &delegate.JobPage{}, nil
	}}
	h := handler(svc, dashboard.Options{})
	if w := get(t, h, "/sandboxes"); w.Code != 404 {
		t.Errorf("/sandboxes: %d", w.Code)
	}
	if page := get(t, h, "/").Body.String(); strings.Contains(page, `href="/sandboxes"`) {
		t.Error("the header links sandbox pages that are not there")
	}
}

// TestSandboxesLive: the list follows changes (a job's change, or the
// poll), and a sandbox's page ends its stream once the sandbox is gone.
func TestSandboxesLive(t *testing.T) {
	var (
		mu    sync.Mutex
		state = delegate.SandboxIdle
	)
	svc := withSandboxes()
	w := &broadcaster{}
	svc.WatchFn = w.watch
	svc.ListSandboxesFn = func(ctx context.Context, o delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
		mu.Lock()
		defer mu.Unlock()
		return []delegate.Sandbox{keptSandbox("sbx-1", state)}, nil
	}
	svc.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		mu.Lock()
		defer mu.Unlock()
		sb := keptSandbox(id, state)
		return &sb, nil
	}
	srv := httptest.NewServer(handler(svc, dashboard.Options{Poll: time.Hour}))
	t.Cleanup(srv.Close)
	list := openStream(t, srv.URL+"/sandboxes/events")
	if ev := list.next(t); ev.name != "html" || !strings.Contains(decode(t, ev.data)["html"], "sb-idle") {
		t.Fatalf("first render: %+v", ev)
	}
	one := openStream(t, srv.URL+"/sandboxes/sbx-1/events")
	if ev := one.next(t); ev.name != "html" || !strings.Contains(decode(t, ev.data)["html"], "Release…") {
		t.Fatalf("first render of the page: %+v", ev)
	}
	mu.Lock()
	state = delegate.SandboxRunning
	mu.Unlock()
	w.changed("job-7") // a command in it started
	if ev := list.next(t); !strings.Contains(decode(t, ev.data)["html"], "sb-running") {
		t.Fatalf("the list did not follow: %+v", ev)
	}
	mu.Lock()
	state = delegate.SandboxReleased
	mu.Unlock()
	w.changed("job-7")
	// The page renders what changed, the last time as released, then
	// ends its stream.
	last := ""
	for ev := one.next(t); ev.name != "end"; ev = one.next(t) {
		if ev.name != "html" {
			t.Fatalf("the page's stream: %+v", ev)
		}
		last = decode(t, ev.data)["html"]
	}
	if !strings.Contains(last, "sb-released") || strings.Contains(last, "Release…") {
		t.Errorf("the page's last render:\n%s", last)
	}
}

// broadcaster is Watch for several streams at once.
type broadcaster struct {
	mu  sync.Mutex
	chs []chan string
}

func (b *broadcaster) watch(ctx context.Context) <-chan string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan string, 8)
	b.chs = append(b.chs, ch)
	return ch
}

func (b *broadcaster) changed(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ch := range b.chs {
		select {
		case ch <- id:
		default:
		}
	}
}

// checkpoints is a CheckpointService that lists a sandbox's checkpoints
// (ListCheckpoints, which the sandbox page reads) and does nothing else.
type checkpoints struct {
	list map[string][]delegate.Checkpoint
}

func (c checkpoints) ListCheckpoints(ctx context.Context, id string) ([]delegate.Checkpoint, error) {
	return c.list[id], nil
}
func (checkpoints) CheckpointSandbox(context.Context, string, delegate.CheckpointOptions) (*delegate.Checkpoint, error) {
	return nil, delegate.ErrInvalid
}
func (checkpoints) RollbackSandbox(context.Context, string, string) (*delegate.Sandbox, error) {
	return nil, delegate.ErrInvalid
}
func (checkpoints) DeleteCheckpoint(context.Context, string) error { return delegate.ErrInvalid }
func (checkpoints) ForkSandbox(context.Context, delegate.ForkSpec) ([]delegate.Sandbox, error) {
	return nil, delegate.ErrInvalid
}

// TestSandboxTree (issue 38): a sandbox's page draws its checkpoints
// and, under each, the forks made from it, linked; a fork's page says
// what it was forked from, linked; a sandbox with neither draws no tree.
func TestSandboxTree(t *testing.T) {
	svc := struct {
		services
		checkpoints
	}{withSandboxes(), checkpoints{list: map[string][]delegate.Checkpoint{}}}
	now := time.Now()
	cps := []delegate.Checkpoint{
		{ID: "ckp-src.1", Name: "deps " + hostile, SandboxID: "sbx-src", Bytes: 3 << 20, CreatedAt: now.Add(-5 * time.Minute)},
		{ID: "ckp-src.2", SandboxID: "sbx-src", Bytes: 4096, CreatedAt: now.Add(-time.Minute), Forks: []string{"sbx-f1", "sbx-f2"}},
	}
	svc.list["sbx-src"] = cps
	svc.GetSandboxFn = func(ctx context.Context, id string) (*delegate.Sandbox, error) {
		sb := keptSandbox(id, delegate.SandboxIdle)
		switch id {
		case "sbx-src":
			sb.Checkpoints = cps
		case "sbx-f1":
			sb.From = "ckp-src.2"
		}
		return &sb, nil
	}
	h := handler(svc, dashboard.Options{})
	page := get(t, h, "/sandboxes/sbx-src").Body.String()
	for _, want := range []string{
		`<h2 id="lineage-h">Checkpoints and forks</h2>`, `<strong>sbx-src</strong> (this sandbox)`,
		`<li class="checkpoint" data-checkpoint="ckp-src.1"><code>ckp-src.1</code> <span class="name">deps &lt;script&gt;`, `3.0 MiB`, `5m ago`,
		`<li class="checkpoint" data-checkpoint="ckp-src.2"><code>ckp-src.2</code>`,
		`<li class="fork"><a href="/sandboxes/sbx-f1">sbx-f1</a></li><li class="fork"><a href="/sandboxes/sbx-f2">sbx-f2</a></li>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the source's page lacks %s", want)
		}
	}
	// The forks are under the second checkpoint, not the first.
	if first := page[strings.Index(page, `data-checkpoint="ckp-src.1"`):strings.Index(page, `data-checkpoint="ckp-src.2"`)]; strings.Contains(first, "sbx-f1") {
		t.Errorf("a fork drawn under the wrong checkpoint:\n%s", first)
	}
	noInlineCode(t, page)
	page = get(t, h, "/sandboxes/sbx-f1").Body.String()
	if !strings.Contains(page, `forked from <a href="/sandboxes/sbx-src">sbx-src</a>, checkpoint <code>ckp-src.2</code>`) ||
		!strings.Contains(page, `<strong>sbx-f1</strong> (this sandbox)`) {
		t.Errorf("the fork's page does not say what it was forked from:\n%s", page)
	}
	if page := get(t, h, "/sandboxes/sbx-plain").Body.String(); strings.Contains(page, "lineage") {
		t.Error("a sandbox with no checkpoint and no source draws a tree")
	}
}
