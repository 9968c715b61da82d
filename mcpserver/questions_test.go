package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/storetest"
)

// TestTasksInputRequired: a running job's open questions make its task
// input_required, each an elicitation keyed by its id; tasks/update's
// responses to them are their answers, and responses to anything else
// are ignored.
func TestTasksInputRequired(t *testing.T) {
	s, _ := taskService()
	form := storetest.SampleForm()
	questions := []delegate.Question{
		{JobID: "run-1", ID: "old", Message: "Answered?", State: delegate.QuestionAnswered, Answer: &delegate.Answer{Action: delegate.AnswerDecline}},
		{JobID: "run-1", ID: "color", Message: "Which colour?", Form: form, State: delegate.QuestionOpen},
		{JobID: "run-1", ID: "egress:1a2b", From: "egress", Message: "Let the job reach example.com:443?", State: delegate.QuestionOpen},
		{JobID: "run-1", ID: "gone", Message: "Too late?", State: delegate.QuestionClosed},
	}
	var (
		mu      sync.Mutex
		answers []string
	)
	s.QuestionService = mock.QuestionService{
		QuestionsFn: func(ctx context.Context, jobID string) ([]delegate.Question, error) {
			if jobID != "run-1" {
				t.Errorf("questions of %s, which does not run", jobID)
				return nil, nil
			}
			return questions, nil
		},
		AnswerFn: func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
			mu.Lock()
			defer mu.Unlock()
			if a.Content["color"] == "green" {
				return nil, &delegate.FieldError{Field: "content.color", Rule: `must be one of "red", "blue" (got "green")`}
			}
			raw, _ := json.Marshal(a)
			answers = append(answers, id+" "+string(raw))
			return &delegate.Question{ID: id, State: delegate.QuestionAnswered}, nil
		},
	}
	c := rawSessionWith(t, s, mcpserver.Limits{}, inputs[0])
	withTasks := meta("2026-07-28", true)

	r := c.exchange(t, 1, "tasks/get", `{"taskId":"run-1",`+withTasks+`}`)
	task := decodeTask(t, r)
	var got struct {
		InputRequests map[string]struct {
			Method string `json:"method"`
			Params struct {
				Mode            string          `json:"mode"`
				Message         string          `json:"message"`
				RequestedSchema json.RawMessage `json:"requestedSchema"`
			} `json:"params"`
		} `json:"inputRequests"`
	}
	json.Unmarshal(r.Result, &got)
	wantSchema, _ := json.Marshal(form)
	color := got.InputRequests["color"]
	if task.Status != "input_required" || task.StatusMessage != "waiting for an answer: Which colour?" || len(got.InputRequests) != 2 ||
		color.Method != "elicitation/create" || color.Params.Mode != "form" || color.Params.Message != "Which colour?" ||
		string(color.Params.RequestedSchema) != string(wantSchema) || task.PollIntervalMs == 0 {
		t.Fatalf("tasks/get: %s", r.Result)
	}
	if e := got.InputRequests["egress:1a2b"]; e.Params.Message != "Let the job reach example.com:443?" || string(e.Params.RequestedSchema) != `{"type":"object","properties":{}}` {
		t.Errorf("delegate's own question: %+v", e)
	}
	// The same requests on every poll: a requester tells them apart by id
	// and content.
	if again := c.exchange(t, 2, "tasks/get", `{"taskId":"run-1",`+withTasks+`}`); !strings.Contains(string(again.Result), string(wantSchema)) {
		t.Errorf("second poll: %s", again.Result)
	}
	// A job that is not running asks nothing, whatever is stored.
	if task := decodeTask(t, c.exchange(t, 3, "tasks/get", `{"taskId":"prov-1",`+withTasks+`}`)); task.Status != "working" {
		t.Errorf("a provisioning job: %+v", task)
	}

	r = c.exchange(t, 4, "tasks/update", `{"taskId":"run-1","inputResponses":{`+
		`"color":{"action":"accept","content":{"color":"blue","count":4}},`+
		`"old":{"action":"accept"},"gone":{"action":"cancel"},"nope":{"action":"accept"}},`+withTasks+`}`)
	if r.Error != nil || !strings.Contains(string(r.Result), `"resultType":"complete"`) {
		t.Fatalf("tasks/update: %s %+v", r.Result, r.Error)
	}
	mu.Lock()
	if len(answers) != 1 || !strings.HasPrefix(answers[0], `color {"action":"accept","content":{"color":"blue","count":4}`) || !strings.Contains(answers[0], `"by":"tasks/update"`) {
		t.Errorf("answers %v", answers)
	}
	mu.Unlock()

	r = c.exchange(t, 5, "tasks/update", `{"taskId":"run-1","inputResponses":{"color":{"action":"accept","content":{"color":"green"}}},`+withTasks+`}`)
	if r.Error == nil || r.Error.Code != -32602 || !strings.Contains(r.Error.Message, `inputResponses.color.content.color: must be one of "red", "blue"`) {
		t.Fatalf("an answer outside the form: %s %+v", r.Result, r.Error)
	}
	r = c.exchange(t, 6, "tasks/update", `{"taskId":"run-1","inputResponses":{"color":"yes"},`+withTasks+`}`)
	if r.Error == nil || r.Error.Code != -32602 || !strings.Contains(r.Error.Message, "inputResponses.color: must be an elicitation result") {
		t.Fatalf("a response that is no elicitation result: %s %+v", r.Result, r.Error)
	}
}

// TestWaitJobQuestions: for a client without Tasks, wait_job returns at
// once while the job waits for answers, with its open questions (also
// when they are asked during the wait), and answer_job answers them.
func TestWaitJobQuestions(t *testing.T) {
	s := newService()
	running := &delegate.Job{ID: "job-1", Status: delegate.StatusRunning, Progress: "asked color: Which colour?"}
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return running, nil }
	s.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		<-ctx.Done() // the job runs on: only a question ends the wait early
		return running, nil
	}
	var (
		mu      sync.Mutex
		reads   int
		answers []string
	)
	open := delegate.Question{JobID: "job-1", ID: "color", Message: "Which colour?", Form: storetest.SampleForm(), State: delegate.QuestionOpen}
	// The job asks once the wait has begun: the first read (before it
	// waits) finds no question, the next ones (while it waits) find it.
	s.QuestionsFn = func(ctx context.Context, jobID string) ([]delegate.Question, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if reads == 1 {
			return nil, nil
		}
		return []delegate.Question{open}, nil
	}
	s.AnswerFn = func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
		switch {
		case id == "nope":
			return nil, delegate.QuestionNotFound(jobID, id)
		case id == "old":
			return nil, fmt.Errorf("answered already: %w", delegate.ErrConflict)
		case a.Content["color"] == "green":
			return nil, &delegate.FieldError{Field: "content.color", Rule: `must be one of "red", "blue" (got "green")`}
		}
		mu.Lock()
		defer mu.Unlock()
		answers = append(answers, id+" "+string(a.Action)+" "+a.By)
		return &delegate.Question{ID: id, State: delegate.QuestionAnswered}, nil
	}
	cs := connect(t, s, nil)
	start := time.Now()
	var w mcpserver.WaitOut
	structured(t, call(t, cs, "wait_job", map[string]any{"job_id": "job-1", "timeout_seconds": 10}), &w)
	if w.Done || w.Status != delegate.StatusRunning || len(w.Questions) != 1 || w.Questions[0].ID != "color" || w.Questions[0].Message != "Which colour?" {
		t.Fatalf("wait_job: %+v", w)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("wait_job returned %v after the question was asked", took)
	}
	// (The client read the schema into a map: its fields' order is gone.)
	raw, _ := json.Marshal(w.Questions[0].Form)
	want, _ := json.Marshal(open.Form)
	var gotSchema, wantSchema any
	json.Unmarshal(raw, &gotSchema)
	json.Unmarshal(want, &wantSchema)
	if !reflect.DeepEqual(gotSchema, wantSchema) {
		t.Errorf("requested_schema %s, want %s", raw, want)
	}

	var a mcpserver.AnswerJobOut
	structured(t, call(t, cs, "answer_job", map[string]any{"job_id": "job-1", "answers": map[string]any{
		"color": map[string]any{"action": "accept", "content": map[string]any{"color": "red"}},
		"old":   map[string]any{"action": "cancel"},
	}}), &a)
	if strings.Join(a.Answered, ",") != "color" || len(answers) != 1 || answers[0] != "color accept answer_job" {
		t.Fatalf("answer_job: %+v, service saw %v", a, answers)
	}
	for answersArg, want := range map[string]string{
		`{"color":{"action":"accept","content":{"color":"green"}}}`: `answers.color.content.color: must be one of "red", "blue"`,
		`{"nope":{"action":"decline"}}`:                             "answers.nope: the job has no question nope",
		`{}`:                                                        "answers: required",
	} {
		res := callRaw(t, cs, "answer_job", `{"job_id":"job-1","answers":`+answersArg+`}`)
		if !res.IsError || !strings.Contains(errorText(res), want) {
			t.Errorf("%s: %s", answersArg, errorText(res))
		}
	}
}
