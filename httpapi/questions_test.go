package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/sandbox"
)

func (e *env) get(path, token string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

const askBody = `{"id":"deploy","message":"Deploy to production?","requestedSchema":{"type":"object","properties":{"why":{"type":"string","maxLength":100}},"required":["why"]}}`

// TestQuestionCallbacks: a job asks over HTTP with its token, and waits
// there for the answer, which comes from the person's side of the engine.
func TestQuestionCallbacks(t *testing.T) {
	e := newEnv(t, engine.Config{})
	job, p, token := e.start(script())
	_, _, other := e.start(script())
	path := "/callback/" + job.ID

	for _, c := range []struct {
		name, token, body string
		want              int
		msg               string
	}{
		{"no token", "", askBody, 401, "missing token"},
		{"another job's token", other, askBody, 403, "another job"},
		{"bad schema", token, `{"id":"x","message":"?","requestedSchema":{"type":"object","properties":{"a":{"type":"array"}}}}`, 400, "requestedSchema.properties.a.type"},
		{"bad id", token, `{"id":"../x","message":"?"}`, 400, "id: must be"},
		{"unknown field", token, `{"id":"x","message":"?","schema":{}}`, 400, `unknown field "schema"`},
		{"not JSON", token, `nope`, 400, "JSON object"},
	} {
		code, out := e.post(path+"/question", c.token, c.body)
		if code != c.want || !strings.Contains(out["error"], c.msg) {
			t.Errorf("%s: %d %v; want %d …%s…", c.name, code, out, c.want, c.msg)
		}
	}
	code, out := e.post(path+"/question", token, askBody)
	if code != 200 || out["id"] != "deploy" || out["state"] != "open" {
		t.Fatalf("ask: %d %v", code, out)
	}
	if code, out := e.post(path+"/question", token, askBody); code != 200 || out["state"] != "open" {
		t.Fatalf("the same question again (a retry): %d %v", code, out)
	}
	if code, out := e.post(path+"/question", token, `{"id":"deploy","message":"Something else?"}`); code != 409 || !strings.Contains(out["error"], "never reused") {
		t.Fatalf("the id reused: %d %v", code, out)
	}
	if qs, _ := e.eng.Questions(context.Background(), job.ID); len(qs) != 1 || qs[0].Form.Fields[0].Name != "why" {
		t.Fatalf("stored %+v", qs)
	}

	if code, raw := e.get(path+"/answer/deploy?wait=0", token); code != 204 || len(raw) != 0 {
		t.Fatalf("before the answer: %d %q", code, raw)
	}
	if code, _ := e.get(path+"/answer/deploy?wait=61", token); code != 400 {
		t.Errorf("wait over the maximum: %d", code)
	}
	if code, _ := e.get(path+"/answer/deploy", other); code != 403 {
		t.Errorf("another job's token: %d", code)
	}
	if code, raw := e.get(path+"/answer/nope?wait=0", token); code != 404 || !strings.Contains(string(raw), `question \"nope\" of job`) {
		t.Errorf("no such question: %d %s", code, raw)
	}
	go func() {
		// The answer comes while the long poll waits (a poll that has
		// not begun yet would find it at once, which the test allows).
		time.Sleep(200 * time.Millisecond)
		e.eng.Answer(context.Background(), job.ID, "deploy", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"why": "tested"}})
	}()
	start := time.Now()
	code, raw := e.get(path+"/answer/deploy?wait=10", token)
	var answer struct {
		ID, Action string
		Content    map[string]any
		At         time.Time `json:"answered_at"`
	}
	if err := json.Unmarshal(raw, &answer); code != 200 || err != nil || answer.ID != "deploy" || answer.Action != "accept" || answer.Content["why"] != "tested" || answer.At.IsZero() {
		t.Fatalf("the long poll: %d %s %v", code, raw, err)
	}
	t.Logf("the long poll answered %v after it began (the answer came after 200 ms)", time.Since(start).Round(time.Millisecond))

	// Once the job has ended its open questions are closed.
	if code, _ := e.post(path+"/question", token, `{"id":"later","message":"And then?"}`); code != 200 {
		t.Fatalf("a second question: %d", code)
	}
	p.Finish(sandbox.Exit{})
	e.eng.Wait(context.Background(), job.ID)
	if code, _ := e.post(path+"/question", token, `{"id":"late","message":"?"}`); code != 409 {
		t.Errorf("a question after the job's end: %d", code)
	}
}

// TestQuestionsNotServed: a service that takes no questions says so.
func TestQuestionsNotServed(t *testing.T) {
	srv := httptest.NewServer(httpapi.Handler(servicesOf(strictService()), httpapi.Options{}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/callback/job-x/question", "application/json", strings.NewReader(askBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// questionsService is a callback service that takes questions too.
type questionsService struct {
	*mock.CallbackService
	*mock.QuestionService
}

// TestAnswerClosed: a question closed unanswered is gone (410).
func TestAnswerClosed(t *testing.T) {
	svc := questionsService{strictService(), &mock.QuestionService{
		AwaitAnswerFn: func(ctx context.Context, jobID, id string) (*delegate.Question, error) {
			return &delegate.Question{JobID: jobID, ID: id, State: delegate.QuestionClosed}, nil
		},
	}}
	srv := httptest.NewServer(httpapi.Handler(servicesOf(svc), httpapi.Options{}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/callback/job-x/answer/q", nil)
	req.Header.Set("Authorization", "Bearer dlg_good")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 410 || !strings.Contains(string(raw), "closed unanswered") {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
}
