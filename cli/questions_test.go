package cli_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/storetest"
)

// questionService is a job service that takes questions, as the engine.
type questionService struct {
	*mock.JobService
	*mock.QuestionService
}

func runWith(t *testing.T, svc delegate.JobService, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	p := cli.Program{
		Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string { return map[string]string{"DELEGATE_DATA_DIR": "/tmp/delegate-cli-test"}[k] },
		Open: func(context.Context, cli.Config, *slog.Logger, bool) (cli.Services, func() error, error) {
			return servicesOf(svc), noClose, nil
		},
	}
	code := cli.Execute(context.Background(), p, args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// TestJobsQuestionsAndAnswer: the questions a job waits on are shown with
// their fields, and answered from FIELD=VALUE arguments read by the
// fields' types.
func TestJobsQuestionsAndAnswer(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	questions := []delegate.Question{
		{JobID: "job-1", ID: "old", From: "job", Message: "Done before?", State: delegate.QuestionAnswered, AskedAt: at,
			Answer: &delegate.Answer{Action: delegate.AnswerDecline, At: at}},
		{JobID: "job-1", ID: "color", From: "job", Message: "Which colour?\n\x1b[31mred\x1b[0m is fine", Form: storetest.SampleForm(),
			State: delegate.QuestionOpen, AskedAt: at},
	}
	var got []delegate.Answer
	qs := &mock.QuestionService{
		QuestionsFn: func(ctx context.Context, jobID string) ([]delegate.Question, error) { return questions, nil },
		AnswerFn: func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
			if a.Content["color"] == "green" {
				return nil, &delegate.FieldError{Field: "content.color", Rule: `must be one of "red", "blue" (got "green")`}
			}
			got = append(got, a)
			q := questions[1]
			q.Answer, q.State = &a, delegate.QuestionAnswered
			return &q, nil
		},
	}
	svc := questionService{&mock.JobService{}, qs}

	r := runWith(t, svc, "jobs", "questions", "job-1")
	for _, want := range []string{"color  open  asked", "  Which colour?", `  \x1b[31mred\x1b[0m is fine`,
		"  color=one of red|blue, required: Colour", "  count=integer, at least 1, at most 10, default 3", "  note=string (email): anything else",
		"  answer: delegate jobs answer job-1 color color=…   (or --decline)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("questions: missing %q in\n%s", want, r.stdout)
		}
	}
	if r.code != 0 || strings.Contains(r.stdout, "Done before?") || strings.Contains(r.stdout, "\x1b") {
		t.Errorf("questions (%d):\n%s", r.code, r.stdout)
	}
	if r := runWith(t, svc, "jobs", "questions", "job-1", "--all"); !strings.Contains(r.stdout, "old  answered") || !strings.Contains(r.stdout, "answer: decline") {
		t.Errorf("--all:\n%s", r.stdout)
	}

	r = runWith(t, svc, "jobs", "answer", "job-1", "color", "color=blue", "count=4", "ok=false", "ratio=0.5", "note=a@b.org")
	if r.code != 0 || r.stdout != "job-1 color: accept\n" || len(got) != 1 {
		t.Fatalf("answer (%d): %q %q", r.code, r.stdout, r.stderr)
	}
	want := map[string]any{"color": "blue", "count": 4.0, "ok": false, "ratio": 0.5, "note": "a@b.org"}
	for k, v := range want {
		if got[0].Content[k] != v {
			t.Errorf("content[%s] = %#v, want %#v", k, got[0].Content[k], v)
		}
	}
	if got[0].Action != delegate.AnswerAccept || got[0].By != "cli" {
		t.Errorf("answer %+v", got[0])
	}
	if r := runWith(t, svc, "jobs", "answer", "job-1", "color", "--decline"); r.code != 0 || got[1].Action != delegate.AnswerDecline || got[1].Content != nil {
		t.Errorf("--decline (%d): %+v %s", r.code, got[1], r.stderr)
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"color=green"}, `color: must be one of "red", "blue" (got "green")`},
		{[]string{"count=many"}, `count: must be a number (got "many")`},
		{[]string{"ok=maybe"}, `ok: must be true or false (got "maybe")`},
		{[]string{"color"}, `"color": give FIELD=VALUE`},
		{[]string{"color=red", "color=blue"}, "color: given twice"},
		{[]string{"--decline", "color=red"}, "takes no values"},
		{[]string{"--decline", "--cancel"}, "give one"},
	} {
		r := runWith(t, svc, append([]string{"jobs", "answer", "job-1", "color"}, c.args...)...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: %d %q", c.args, r.code, r.stderr)
		}
	}
}
