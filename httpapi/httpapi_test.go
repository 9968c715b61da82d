package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/testengine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

type env struct {
	t       *testing.T
	eng     *testengine.Engine
	backend *sandboxtest.Fake
	srv     *httptest.Server
}

func newEnv(t *testing.T, cfg engine.Config) *env {
	eng := testengine.Start(t, cfg)
	srv := httptest.NewServer(httpapi.Handler(servicesOf(eng.Engine), httpapi.Options{BodyLimit: 1024}))
	t.Cleanup(srv.Close)
	return &env{t: t, eng: eng, backend: eng.Backend, srv: srv}
}

// start submits a job and returns it once running, with its token.
func (e *env) start(m delegate.Manifest) (*delegate.Job, *sandboxtest.Process, string) {
	e.t.Helper()
	j, p := e.eng.Running(e.t, m)
	return j, p, tokenOf(e.t, p)
}

func tokenOf(t *testing.T, p *sandboxtest.Process) string {
	for _, kv := range p.Cmd.Env {
		if v, ok := strings.CutPrefix(kv, "DELEGATE_JOB_TOKEN="); ok {
			return v
		}
	}
	t.Fatal("no DELEGATE_JOB_TOKEN in the job's environment")
	return ""
}

func (e *env) post(path, token, body string) (int, map[string]string) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("%s: content type %q, body %q", path, ct, raw)
	}
	var out map[string]string
	if err := json.Unmarshal(raw, &out); err != nil {
		e.t.Errorf("%s: body %q is not a JSON object", path, raw)
	}
	return resp.StatusCode, out
}

func script() delegate.Manifest {
	return delegate.Manifest{AgentType: delegate.AgentScript, Task: "work", StatusMode: delegate.StatusModeDetailed}
}

func TestCallbackStatusCodes(t *testing.T) {
	e := newEnv(t, engine.Config{})
	a, _, tokenA := e.start(script())
	b, _, tokenB := e.start(script())
	done, doneProc, tokenDone := e.start(script())
	doneProc.Finish(sandbox.Exit{})
	if _, err := e.eng.Wait(context.Background(), done.ID); err != nil {
		t.Fatal(err)
	}
	big := `{"progress":"` + strings.Repeat("x", 2000) + `"}`
	tests := []struct {
		name, path, token, body string
		want                    int
	}{
		{"status ok", "/callback/" + a.ID + "/status", tokenA, `{"progress":"compiling","percent":50}`, 200},
		{"heartbeat, empty body", "/callback/" + a.ID + "/heartbeat", tokenA, ``, 200},
		{"no token", "/callback/" + a.ID + "/status", "", `{"progress":"x"}`, 401},
		{"unknown token", "/callback/" + a.ID + "/status", "dlg_forged", `{"progress":"x"}`, 401},
		{"another job's token", "/callback/" + a.ID + "/status", tokenB, `{"progress":"x"}`, 403},
		{"unknown job", "/callback/job-nope/status", tokenA, `{"progress":"x"}`, 401},
		{"finished job", "/callback/" + done.ID + "/status", tokenDone, `{"progress":"x"}`, 409},
		{"too large", "/callback/" + a.ID + "/status", tokenA, big, 413},
		{"malformed JSON", "/callback/" + a.ID + "/status", tokenA, `{"progress":`, 400},
		{"not an object", "/callback/" + a.ID + "/status", tokenA, `["x"]`, 400},
		{"job_id differs", "/callback/" + a.ID + "/status", tokenA, `{"job_id":"` + b.ID + `","progress":"x"}`, 400},
		{"bad completion status", "/callback/" + a.ID + "/complete", tokenA, `{"status":"maybe"}`, 400},
		{"unknown kind", "/callback/" + a.ID + "/explode", tokenA, `{}`, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := e.post(tc.path, tc.token, tc.body)
			if code != tc.want || (code != 200 && body["error"] == "") {
				t.Fatalf("got %d %v, want %d with an error message", code, body, tc.want)
			}
		})
	}
	// The accepted status became the job's progress and timeline.
	j, _ := e.eng.Get(context.Background(), a.ID)
	if j.Progress != "compiling (50%)" || j.Status != delegate.StatusRunning {
		t.Fatalf("after status callback: %s %q", j.Status, j.Progress)
	}
	evs, _ := e.eng.Timeline(context.Background(), a.ID)
	if len(evs) == 0 || evs[len(evs)-1].Message != "compiling (50%)" {
		t.Fatalf("timeline: %+v", evs)
	}
	// GET on a callback path and unknown paths: JSON too.
	resp, err := http.Get(e.srv.URL + "/callback/" + a.ID + "/status")
	if err != nil || resp.StatusCode != 405 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET callback: %v %v", resp.StatusCode, err)
	}
	resp, err = http.Get(e.srv.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v", err)
	}
}

func TestCompleteCallback(t *testing.T) {
	e := newEnv(t, engine.Config{})
	j, p, token := e.start(script())
	code, body := e.post("/callback/"+j.ID+"/complete", token, `{"status":"success","result":"all 12 tests passed"}`)
	if code != 200 || body["status"] != "success" {
		t.Fatalf("complete: %d %v", code, body)
	}
	// The job said it is done: what still runs is stopped (after a grace
	// period for it to exit on its own).
	testkit.Eventually(t, 7500*time.Millisecond, "the process killed after the job completed", p.Killed)
	got, _ := e.eng.Get(context.Background(), j.ID)
	if got.Status != delegate.StatusSuccess || got.Result != "all 12 tests passed" {
		t.Fatalf("after complete: %s %q", got.Status, got.Result)
	}
	// A second completion, or any late callback, is refused and changes nothing.
	if code, _ := e.post("/callback/"+j.ID+"/complete", token, `{"status":"failed"}`); code != 409 {
		t.Fatalf("second completion: %d", code)
	}
	if got2, _ := e.eng.Get(context.Background(), j.ID); got2.Status != delegate.StatusSuccess || got2.FinishedAt != got.FinishedAt {
		t.Fatalf("late completion changed the job: %s", got2.Status)
	}

	// A failed completion carries the job's own error.
	j, _, token = e.start(script())
	e.post("/callback/"+j.ID+"/complete", token, `{"status":"failed","error":"lint errors"}`)
	got, _ = e.eng.Get(context.Background(), j.ID)
	if got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "lint errors") {
		t.Fatalf("failed completion: %s %q", got.Status, got.Error)
	}
}

// TestCallbackRaces: completion, cancel and timeout racing each other leave
// one terminal status, which no later callback changes.
func TestCallbackRaces(t *testing.T) {
	e := newEnv(t, engine.Config{MaxConcurrent: 10})
	ctx := context.Background()
	for i := range 15 {
		m := script()
		m.Timeout = new(1)
		j, p, token := e.start(m)
		var wg sync.WaitGroup
		codes := make([]int, 2)
		wg.Add(3)
		go func() {
			defer wg.Done()
			codes[0], _ = e.post("/callback/"+j.ID+"/complete", token, `{"status":"success"}`)
		}()
		go func() { defer wg.Done(); e.eng.Cancel(ctx, j.ID) }()
		go func() {
			defer wg.Done()
			codes[1], _ = e.post("/callback/"+j.ID+"/status", token, `{"progress":"late"}`)
		}()
		if i%3 == 0 {
			p.Finish(sandbox.Exit{Code: 1})
		}
		wg.Wait()
		final, err := e.eng.Wait(ctx, j.ID)
		if err != nil || !final.Status.Terminal() {
			t.Fatalf("round %d: %v %v", i, final, err)
		}
		for _, c := range codes {
			if !slices.Contains([]int{200, 409}, c) {
				t.Fatalf("round %d: callback got %d", i, c)
			}
		}
		if code, _ := e.post("/callback/"+j.ID+"/complete", token, `{"status":"failed"}`); code != 409 {
			t.Fatalf("round %d: completion after the end got %d", i, code)
		}
		// What no event announces: a change that should not come. A
		// moment for a late writer to make it.
		time.Sleep(15 * time.Millisecond)
		again, _ := e.eng.Get(ctx, j.ID)
		if again.Status != final.Status {
			t.Fatalf("round %d: %s became %s", i, final.Status, again.Status)
		}
	}
}

func TestLostHeartbeat(t *testing.T) {
	e := newEnv(t, engine.Config{HeartbeatThreshold: 300 * time.Millisecond})
	e.backend.Caps.Supervised = false // nothing watches the process: only the job's own signs of life count
	j, p, token := e.start(script())
	// Heartbeats keep it alive past the threshold.
	for range 6 {
		// The test is of time passing: beats a third of the threshold apart.
		time.Sleep(100 * time.Millisecond)
		if code, _ := e.post("/callback/"+j.ID+"/heartbeat", token, ``); code != 200 {
			t.Fatalf("heartbeat %d", code)
		}
	}
	if got, _ := e.eng.Get(context.Background(), j.ID); got.Status != delegate.StatusRunning {
		t.Fatalf("job with heartbeats: %s %q", got.Status, got.Error)
	}
	// Then they stop.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, _ := e.eng.Wait(ctx, j.ID)
	if got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "lost heartbeat") {
		t.Fatalf("after heartbeats stopped: %s %q", got.Status, got.Error)
	}
	testkit.Eventually(t, 2500*time.Millisecond, "the process killed and its sandbox destroyed", func() bool {
		return p.Killed() && e.backend.Len() == 0
	})
}

func TestSupervisedJobKeepsHeartbeat(t *testing.T) {
	e := newEnv(t, engine.Config{HeartbeatThreshold: 200 * time.Millisecond})
	j, p, _ := e.start(script())
	// The test is of time passing: over three thresholds without a
	// callback, the supervisor's liveness counts as the job's.
	time.Sleep(700 * time.Millisecond)
	got, _ := e.eng.Get(context.Background(), j.ID)
	if got.Status != delegate.StatusRunning {
		t.Fatalf("a supervised job lost its heartbeat: %s %q", got.Status, got.Error)
	}
	p.Finish(sandbox.Exit{})
}
