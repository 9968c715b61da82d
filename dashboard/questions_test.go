package dashboard_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/dashboard"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/storetest"
)

// questionService is a job service that takes questions, as the engine.
type questionService struct {
	*mock.JobService
	*mock.QuestionService
}

// TestJobPageQuestions: a running job's open questions are on its page,
// each a form of its fields (what the job wrote is escaped); the form's
// answer is read by the fields' types; another site cannot send one.
func TestJobPageQuestions(t *testing.T) {
	questions := []delegate.Question{
		{JobID: "job-1", ID: "old", Message: "Answered", State: delegate.QuestionAnswered, Answer: &delegate.Answer{Action: delegate.AnswerAccept}},
		{JobID: "job-1", ID: "color", From: "job", Message: "Which colour? " + hostile, Form: storetest.SampleForm(), State: delegate.QuestionOpen, AskedAt: t0},
	}
	var answers []delegate.Answer
	svc := questionService{
		&mock.JobService{
			GetFn: func(ctx context.Context, id string) (*delegate.Job, error) {
				return runningJob(delegate.StatusModeDetailed), nil
			},
			TimelineFn: func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil },
		},
		&mock.QuestionService{
			QuestionsFn: func(ctx context.Context, jobID string) ([]delegate.Question, error) { return questions, nil },
			AnswerFn: func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
				if a.Content["color"] == "green" {
					return nil, &delegate.FieldError{Field: "content.color", Rule: `must be one of "red", "blue"`}
				}
				answers = append(answers, a)
				return &questions[1], nil
			},
		},
	}
	h := handler(svc, dashboard.Options{})
	page := get(t, h, "/jobs/job-1").Body.String()
	for _, want := range []string{
		`<form method="post" action="/jobs/job-1/questions/color" class="question" data-question="color">`,
		`Which colour? &lt;script&gt;`,
		`<select name="f.color" required><option value="red">Red</option><option value="blue">Blue</option></select>`,
		`<input type="email" name="f.note" value="" maxlength="40">`,
		`<input type="number" name="f.count" value="3" step="1" min="1" max="10">`,
		`<input type="checkbox" name="f.ok" checked>`,
		`<button type="submit" name="action" value="decline" formnovalidate>Decline</button>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(page, "questions/old") {
		t.Error("an answered question is offered")
	}
	noInlineCode(t, page)

	post := func(form url.Values, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/jobs/job-1/questions/color", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	accept := url.Values{"action": {"accept"}, "f.color": {"blue"}, "f.count": {"4"}, "f.note": {""}, "f.ratio": {"0.5"}}
	if w := post(accept, "Sec-Fetch-Site", "cross-site"); w.Code != 403 || len(answers) != 0 {
		t.Fatalf("a cross-site answer: %d, %v", w.Code, answers)
	}
	w := post(accept, "Sec-Fetch-Site", "same-origin")
	if w.Code != 303 || w.Header().Get("Location") != "/jobs/job-1?notice=answered" || len(answers) != 1 {
		t.Fatalf("answer: %d %q %v", w.Code, w.Header().Get("Location"), answers)
	}
	a := answers[0]
	if a.Action != delegate.AnswerAccept || a.By != "dashboard" || a.Content["color"] != "blue" || a.Content["count"] != 4.0 ||
		a.Content["ok"] != false || a.Content["ratio"] != 0.5 || len(a.Content) != 4 {
		t.Errorf("answer %+v (an empty field is left out, an unticked box is false)", a)
	}
	if w := post(url.Values{"action": {"decline"}, "f.color": {"x"}}, "Sec-Fetch-Site", "same-origin"); w.Code != 303 || answers[1].Action != delegate.AnswerDecline || answers[1].Content != nil {
		t.Errorf("decline: %d %+v", w.Code, answers[1])
	}
	for form, want := range map[string]string{
		"action=accept&f.color=green": `color: must be one of &#34;red&#34;, &#34;blue&#34;`,
		"action=accept&f.count=many":  `count: must be a number`,
	} {
		v, _ := url.ParseQuery(form)
		if w := post(v, "Sec-Fetch-Site", "same-origin"); w.Code != 400 || !strings.Contains(w.Body.String(), want) {
			t.Errorf("%s: %d %s", form, w.Code, w.Body)
		}
	}
}
