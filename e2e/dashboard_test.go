package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The dashboard in a real headless Chromium (Debian's package), driven
// through the DevTools protocol: a stdio server runs the jobs, a second
// process serves the dashboard on the same data dir, with a token.

// findChromium returns the browser to drive. scripts/test installs it and
// sets DELEGATE_REQUIRE_CHROMIUM, so that CI cannot skip this test.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("DELEGATE_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium is not installed (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium); scripts/test installs it")
	return ""
}

// browser starts a headless Chromium with a fresh profile and collects
// every script error, exception and error log entry (a CSP violation is
// one) of its pages.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	problems []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	exe := findChromium(t)
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 860),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	b := &browser{ctx: tabCtx}
	if err := chromedp.Do(tabCtx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(tabCtx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	exceptions := chromedp.Events(tabCtx, runtime.ExceptionThrown)
	console := chromedp.Events(tabCtx, runtime.ConsoleAPICalled)
	entries := chromedp.Events(tabCtx, cdplog.EntryAdded)
	go func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			b.problem((&chromedp.ExceptionError{ExceptionDetails: ev.ExceptionDetails}).Error())
		}
	}()
	go func() {
		for ev, err := range console {
			if err != nil {
				return
			}
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, fmt.Sprint(a.Value, a.Description))
				}
				b.problem("console." + ev.Type.String() + ": " + strings.Join(args, " "))
			}
		}
	}()
	go func() {
		for ev, err := range entries {
			if err != nil {
				return
			}
			e := ev.Entry
			// The 401 of the sign-in page is the test's own doing.
			if e.Level == cdplog.EntryLevelError && !strings.Contains(e.Text, "status of 401") {
				b.problem(fmt.Sprintf("log %s: %s (%s)", e.Source, e.Text, e.URL))
			}
		}
	}()
	return b
}

func (b *browser) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func (b *browser) eval(t *testing.T, js string) bool {
	t.Helper()
	ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return ok
}

// waitFor waits until a JavaScript expression is true in the page.
func (b *browser) waitFor(t *testing.T, what, js string, timeout time.Duration) {
	t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](js,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout))); err != nil {
		html, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("waiting for %s (%s): %v\npage:\n%s", what, js, err, html)
	}
}

// shoot saves a screenshot in DELEGATE_SCREENSHOT_DIR, if set (how
// docs/dashboard.png is made).
func (b *browser) shoot(t *testing.T, name string, width, height int64) {
	t.Helper()
	dir := os.Getenv("DELEGATE_SCREENSHOT_DIR")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(b.ctx, func(ctx context.Context, tg *chromedp.Target) ([]byte, error) {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
			return nil, err
		}
		time.Sleep(300 * time.Millisecond) // let the layout settle
		return chromedp.Run(ctx, chromedp.CaptureScreenshot())
	})
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func submitScript(t *testing.T, cs *mcp.ClientSession, task string, extra map[string]any) string {
	t.Helper()
	m := map[string]any{"agentType": "script", "task": task, "timeout": 120}
	for k, v := range extra {
		m[k] = v
	}
	return call[submitOut](t, cs, "submit_job", map[string]any{"manifest": m}).JobID
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

func TestDashboardInChromium(t *testing.T) {
	b := newBrowser(t)
	dataDir := t.TempDir()
	cs, _, _ := stdioSession(t, dataDir, "")
	base := startHTTP(t, dataDir, nil, "DELEGATE_HTTP_TOKEN="+httpToken)

	const greeting = `<b>hello</b> & <script>alert("dashboard")</script>`
	ok := submitScript(t, cs, "printf '%s\\n' \"$GREETING\"", map[string]any{"env": map[string]string{"GREETING": greeting}})
	failed := submitScript(t, cs, "echo oops >&2; exit 3", nil)
	for _, id := range []string{ok, failed} {
		call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id})
	}

	// Without the token: the sign-in form, and no job.
	b.do(t, "open the dashboard", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if page := b.text(t, "body"); strings.Contains(page, ok) || strings.Contains(page, failed) {
		t.Fatalf("a job is shown without the token:\n%s", page)
	}

	// Sign in: the list, newest first, with the statuses.
	b.do(t, "sign in",
		chromedp.SendKeys(chromedp.CSS("#token"), httpToken),
		chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-job="`+ok+`"]`)))
	row := func(id string) string { return `tr[data-job="` + id + `"]` }
	if s := b.text(t, row(ok)+" .status"); s != "success" {
		t.Errorf("status of %s shows %q", ok, s)
	}
	if s := b.text(t, row(failed)+" .status"); s != "failed" {
		t.Errorf("status of %s shows %q", failed, s)
	}
	if !b.eval(t, `document.querySelector('tr[data-job]').dataset.job === `+jsString(failed)) {
		t.Error("the newest job is not first")
	}
	if task := b.text(t, row(ok)+" .task"); !strings.Contains(task, "GREETING") {
		t.Errorf("task shown as %q", task)
	}
	b.waitFor(t, "the live updates to connect", `document.querySelector('#live-state.on') !== null`, 10*time.Second)

	// A new job appears, and then finishes, without a reload.
	b.eval(t, `window.stillTheSamePage = true`)
	third := submitScript(t, cs, "sleep 1; echo third", nil)
	b.waitFor(t, "the new job", `document.querySelector(`+jsString(row(third))+`) !== null`, 10*time.Second)
	b.waitFor(t, "the new job to succeed", `document.querySelector(`+jsString(row(third)+" .st-success")+`) !== null`, 20*time.Second)
	if !b.eval(t, `window.stillTheSamePage === true`) {
		t.Fatal("the page was reloaded")
	}
	b.shoot(t, "dashboard.png", 1280, 560)

	// The job page shows the output, as text.
	b.do(t, "open a job", chromedp.Navigate(base+"/jobs/"+ok), chromedp.WaitVisible(chromedp.CSS("#output")))
	if out := b.text(t, "#output"); out != greeting+"\n" {
		t.Errorf("output shown as %q, want %q", out, greeting)
	}
	if b.eval(t, `document.querySelector('#output b, #output script') !== null`) {
		t.Error("the job's output became markup")
	}

	// A streaming job's output is followed live.
	streaming := submitScript(t, cs, `echo "step 1/2: building" > "$DELEGATE_STATUS_FILE"; echo first line; sleep 2; `+
		`echo "step 2/2: testing" > "$DELEGATE_STATUS_FILE"; echo second line`, map[string]any{"statusMode": "streaming"})
	b.do(t, "open a streaming job", chromedp.Navigate(base+"/jobs/"+streaming))
	b.waitFor(t, "the live log", `(document.querySelector('#log') || {}).textContent === 'first line\n'`, 20*time.Second)
	b.waitFor(t, "the end of the job", `document.querySelector('#live .st-success') !== null && document.querySelector('#output') !== null`, 20*time.Second)
	if out := b.text(t, "#output"); out != "first line\nsecond line\n" {
		t.Errorf("final output %q", out)
	}
	if s := b.text(t, "#live-state"); s != "finished" {
		t.Errorf("live state %q after the end", s)
	}
	if tl := b.text(t, ".timeline"); !strings.Contains(tl, "step 1/2: building") || !strings.Contains(tl, "step 2/2: testing") {
		t.Errorf("timeline %q", tl)
	}
	b.shoot(t, "dashboard-job.png", 1280, 900)

	// Cancel, after confirming.
	long := submitScript(t, cs, "sleep 60", nil)
	waitStatus(t, cs, long, "running")
	b.do(t, "cancel a job",
		chromedp.Navigate(base+"/jobs/"+long),
		chromedp.Click(chromedp.CSS("details.cancel summary")),
		chromedp.WaitVisible(chromedp.CSS("details.cancel button")),
		chromedp.Click(chromedp.CSS("details.cancel button")),
		chromedp.WaitVisible(chromedp.CSS(".notice")))
	b.waitFor(t, "the cancelled status", `document.querySelector('#live .st-cancelled') !== null`, 20*time.Second)
	if st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": long, "timeout_seconds": 20}); st.Status != "cancelled" {
		t.Errorf("the stdio server's job is %s after the dashboard cancelled it", st.Status)
	}
	b.do(t, "back to the list", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(row(long))))
	b.shoot(t, "dashboard-phone.png", 390, 844)
	b.do(t, "back to the desktop size", chromedp.EmulateViewport(1280, 860))

	// Signed out, nothing is shown again.
	b.do(t, "sign out", chromedp.Click(chromedp.CSS(".signout button")), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.do(t, "open the list again", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if page := b.text(t, "body"); strings.Contains(page, ok) {
		t.Errorf("a job is shown after signing out:\n%s", page)
	}

	time.Sleep(200 * time.Millisecond) // the last events of the browser
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		t.Errorf("browser: %s", p)
	}
}
