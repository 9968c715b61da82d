package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

const colorLine = `{"type":"question","id":"color","message":"Which colour?","requestedSchema":{"type":"object",` +
	`"properties":{"color":{"type":"string","enum":["red","blue"]},"count":{"type":"integer","default":2}},"required":["color"]}}`

// answerIn reads the answer file a job finds in its sandbox ("" if none).
func answerIn(sb *sandboxtest.FakeInstance, id string) string {
	data, err := sb.ReadFile(context.Background(), path.Join(engine.AnswersDir, id+".json"), 0, 1<<20)
	if err != nil {
		return ""
	}
	return string(data)
}

// running submits a job and waits until it runs.
func (f *fixture) running(m delegate.Manifest) (*delegate.Job, *sandboxtest.Process) {
	f.t.Helper()
	job := f.submit(m)
	p := f.started()
	awaitJob(f.t, f.eng, job.ID, "running", func(j *delegate.Job) bool { return j.Status == delegate.StatusRunning })
	return job, p
}

func questionsOf(t *testing.T, svc delegate.QuestionService, id string) []delegate.Question {
	t.Helper()
	qs, err := svc.Questions(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return qs
}

// TestQuestionFromStatusLine: a job asks in a status line, hidden in a
// flood of other lines (statusMode simple parses only the last line of
// each read); the question is stored and shown; an answer given in
// another process (an engine without a backend, as the CLI's) is checked,
// stored, and written into the job's sandbox by the engine running it.
func TestQuestionFromStatusLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{})
	m := script("asks")
	m.StatusMode = delegate.StatusModeDetailed
	job, p := f.running(m)
	var flood strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&flood, "line %d\n", i)
	}
	p.Event(flood.String() + colorLine + "\n" + strings.Repeat("after\n", 50) + "done flooding")

	var q delegate.Question
	eventually(t, "the question stored", func() bool {
		qs := questionsOf(t, f.eng, job.ID)
		if len(qs) == 1 {
			q = qs[0]
		}
		return len(qs) == 1
	})
	if q.ID != "color" || q.From != delegate.QuestionFromJob || q.Message != "Which colour?" || q.State != delegate.QuestionOpen ||
		len(q.Form.Fields) != 2 || q.Form.Fields[0].Name != "color" || !q.Form.Fields[0].Required || q.AskedAt.IsZero() {
		t.Fatalf("stored %+v", q)
	}
	timeline, _ := f.eng.Timeline(ctx, job.ID)
	if !hasEvent(timeline, "asked color: Which colour?") {
		t.Errorf("the question is not on the timeline: %v", timeline[len(timeline)-3:])
	}
	// The raw JSON line is never a progress message.
	if hasEvent(timeline, `{"type":"question"`) {
		t.Errorf("the status line itself is on the timeline")
	}

	cli := engine.New(f.store, nil, f.cfg) // another process: no backend, runs no job
	defer cli.Close()
	var fe *delegate.FieldError
	if _, err := cli.Answer(ctx, job.ID, "color", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "green"}}); !errors.As(err, &fe) || fe.Field != "content.color" {
		t.Fatalf("an answer outside the form: %v", err)
	}
	if _, err := cli.Answer(ctx, job.ID, "nope", delegate.Answer{Action: delegate.AnswerDecline}); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("an answer to no question: %v", err)
	}
	got, err := cli.Answer(ctx, job.ID, "color", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "blue"}, By: "cli"})
	if err != nil || got.State != delegate.QuestionAnswered || got.Answer.Content["count"] != 2.0 || got.Answer.By != "cli" {
		t.Fatalf("answer: %+v %v", got, err)
	}
	var file struct {
		ID      string         `json:"id"`
		Action  string         `json:"action"`
		Content map[string]any `json:"content"`
		At      time.Time      `json:"answered_at"`
	}
	eventually(t, "the answer in the sandbox", func() bool { return answerIn(p.Sandbox, "color") != "" })
	if err := json.Unmarshal([]byte(answerIn(p.Sandbox, "color")), &file); err != nil || file.ID != "color" || file.Action != "accept" ||
		file.Content["color"] != "blue" || file.Content["count"] != 2.0 || !file.At.Equal(got.Answer.At) {
		t.Fatalf("answer file %q: %v", answerIn(p.Sandbox, "color"), err)
	}
	if _, err := f.eng.Answer(ctx, job.ID, "color", delegate.Answer{Action: delegate.AnswerDecline}); !errors.Is(err, delegate.ErrConflict) {
		t.Fatalf("a second answer: %v", err)
	}
	j, _ := f.eng.Get(ctx, job.ID)
	timeline, _ = f.eng.Timeline(ctx, job.ID)
	if j.Progress != "answered color: accept" || !hasEvent(timeline, "answered color: accept") {
		t.Errorf("progress %q, timeline %v", j.Progress, timeline[len(timeline)-2:])
	}

	// Asked again (a restarted server reads the status channel from its
	// start): the same question, not a second one.
	p.Event(colorLine)
	p.Event(`{"type":"question","id":"later","message":"And then?"}`)
	eventually(t, "the second question", func() bool { return len(questionsOf(t, f.eng, job.ID)) == 2 })
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	qs := questionsOf(t, f.eng, job.ID)
	if qs[0].State != delegate.QuestionAnswered || qs[1].State != delegate.QuestionClosed || len(qs[1].Form.Fields) != 0 {
		t.Fatalf("after the job's end: %+v", qs)
	}
	if _, err := f.eng.Answer(ctx, job.ID, "later", delegate.Answer{Action: delegate.AnswerDecline}); !errors.Is(err, delegate.ErrTerminal) {
		t.Fatalf("an answer after the job's end: %v", err)
	}
	if _, err := f.eng.Ask(ctx, job.ID, delegate.Question{ID: "late", Message: "?"}); !errors.Is(err, delegate.ErrTerminal) {
		t.Fatalf("a question after the job's end: %v", err)
	}
}

func hasEvent(timeline []delegate.Event, text string) bool {
	for _, ev := range timeline {
		if strings.Contains(ev.Message, text) {
			return true
		}
	}
	return false
}

// TestQuestionRefused: a status line that asks what may not be asked
// gets its refusal in the job's progress and, when its id names no
// question yet, in its answer file; an id asked again as another
// question is refused without touching the first one's answer.
func TestQuestionRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{})
	job, p := f.running(script("asks badly"))
	p.Event(`{"type":"question","id":"bad","message":"?","requestedSchema":{"type":"object","properties":{"x":{"type":"object"}}}}`)
	eventually(t, "the refusal", func() bool { return answerIn(p.Sandbox, "bad") != "" })
	var refusal struct{ ID, Error string }
	json.Unmarshal([]byte(answerIn(p.Sandbox, "bad")), &refusal)
	if refusal.ID != "bad" || !strings.Contains(refusal.Error, "requestedSchema.properties.x.type") {
		t.Fatalf("refusal %+v", refusal)
	}
	j, _ := f.eng.Get(ctx, job.ID)
	if !strings.Contains(j.Progress, `question "bad" refused: requestedSchema.properties.x.type`) {
		t.Errorf("progress %q", j.Progress)
	}

	p.Event(`{"type":"question","id":"ok","message":"Go on?"}`)
	eventually(t, "the question", func() bool { return len(questionsOf(t, f.eng, job.ID)) == 1 })
	if _, err := f.eng.Answer(ctx, job.ID, "ok", delegate.Answer{Action: delegate.AnswerAccept}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the answer", func() bool { return strings.Contains(answerIn(p.Sandbox, "ok"), `"accept"`) })
	p.Event(`{"type":"question","id":"ok","message":"Something else?"}`)
	eventually(t, "the refusal of a reused id", func() bool {
		j, _ := f.eng.Get(ctx, job.ID)
		return strings.Contains(j.Progress, `question "ok" refused`) && strings.Contains(j.Progress, "never reused")
	})
	if got := answerIn(p.Sandbox, "ok"); !strings.Contains(got, `"accept"`) || strings.Contains(got, "error") {
		t.Fatalf("the first answer was overwritten: %s", got)
	}
	if _, err := f.eng.Ask(ctx, job.ID, delegate.Question{ID: "../x", Message: "?"}); !errors.Is(err, delegate.ErrInvalid) {
		t.Errorf("an id that is no file name: %v", err)
	}

	// At most MaxOpenQuestions wait at once.
	for i := range delegate.MaxOpenQuestions {
		if _, err := f.eng.Ask(ctx, job.ID, delegate.Question{ID: fmt.Sprint("q", i), Message: "?"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.eng.Ask(ctx, job.ID, delegate.Question{ID: "one-too-many", Message: "?"})
	if !errors.Is(err, delegate.ErrConflict) || !strings.Contains(err.Error(), "waiting for an answer") {
		t.Fatalf("one question too many: %v", err)
	}
	p.Finish(sandbox.Exit{})
}

// TestQuestionOnBehalf: a part of delegate (the egress proxy) asks on a
// job's behalf, with an expiry, and waits for the answer; the answer goes
// to it, not into the sandbox. An unanswered one closes at its expiry,
// after a restart too.
func TestQuestionOnBehalf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{})
	job, p := f.running(script("reaches the network"))
	q, err := f.eng.Ask(ctx, job.ID, delegate.Question{From: "egress", Message: "Let the job reach example.com:443?",
		Expires: time.Now().Add(time.Minute)})
	if err != nil || !strings.HasPrefix(q.ID, "egress:") || q.From != "egress" {
		t.Fatalf("asked %+v %v", q, err)
	}
	if _, err := f.eng.Ask(ctx, job.ID, delegate.Question{From: "egress", ID: "mine", Message: "?"}); !errors.Is(err, delegate.ErrInvalid) {
		t.Errorf("an id of delegate's own without its prefix: %v", err)
	}
	answered := make(chan *delegate.Question, 1)
	go func() {
		got, _ := f.eng.AwaitAnswer(ctx, job.ID, q.ID)
		answered <- got
	}()
	cli := engine.New(f.store, nil, f.cfg)
	defer cli.Close()
	start := time.Now()
	if _, err := cli.Answer(ctx, job.ID, q.ID, delegate.Answer{Action: delegate.AnswerAccept}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-answered:
		if got.State != delegate.QuestionAnswered || got.Answer.Action != delegate.AnswerAccept {
			t.Fatalf("awaited %+v", got)
		}
		t.Logf("an answer from another process reached the waiter in %v", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not see the answer given in another process")
	}
	if files, _ := p.Sandbox.ListFiles(ctx, sandbox.ListOptions{Regular: true}); len(files) != 0 {
		t.Errorf("an answer for delegate went into the sandbox: %v", files)
	}

	short, err := f.eng.Ask(ctx, job.ID, delegate.Question{From: "egress", Message: "And example.org?", Expires: time.Now().Add(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	f.eng.Close() // a restart: the question is in the store, its expiry with it
	eng2 := f.start(f.backend)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := eng2.AwaitAnswer(wctx, job.ID, short.ID)
	if err != nil || got.State != delegate.QuestionClosed || time.Now().Before(short.Expires) {
		t.Fatalf("an expiring question: %+v %v", got, err)
	}
	if _, err := eng2.Answer(ctx, job.ID, short.ID, delegate.Answer{Action: delegate.AnswerAccept}); !errors.Is(err, delegate.ErrConflict) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an answer after the expiry: %v", err)
	}
	p.Finish(sandbox.Exit{})
}

// TestQuestionUnansweredTimesOut: the job's own timeout runs on while it
// waits; the job ends as timeout and its question closes with it. It runs
// in a synctest bubble (the job's timeout on the bubble's clock).
func TestQuestionUnansweredTimesOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testQuestionUnansweredTimesOut)
}

func testQuestionUnansweredTimesOut(t *testing.T) {
	f := newFixture(t, engine.Config{})
	m := script("asks and waits")
	m.Timeout = new(1)
	job, p := f.running(m)
	p.Event(`{"type":"question","id":"never","message":"Anyone?"}`)
	eventually(t, "the question", func() bool { return len(questionsOf(t, f.eng, job.ID)) == 1 })
	j := f.wait(f.eng, job.ID)
	if j.Status != delegate.StatusTimeout || !p.Killed() {
		t.Fatalf("job %s killed=%v", j.Status, p.Killed())
	}
	if qs := questionsOf(t, f.eng, job.ID); qs[0].State != delegate.QuestionClosed || qs[0].Answer != nil {
		t.Fatalf("question after the timeout: %+v", qs[0])
	}
}

// TestQuestionSurvivesRestart: an open question is in the store; after
// the server dies and another starts, it is still open, and its answer
// reaches the job through the engine that re-attached to it.
func TestQuestionSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{OwnerAlive: func(string) bool { return false }})
	job, p := f.running(script("asks"))
	p.Event(colorLine)
	eventually(t, "the question", func() bool { return len(questionsOf(t, f.eng, job.ID)) == 1 })
	f.eng.Close()

	eng2 := f.start(f.backend)
	qs := questionsOf(t, eng2, job.ID)
	if len(qs) != 1 || qs[0].State != delegate.QuestionOpen {
		t.Fatalf("after a restart: %+v", qs)
	}
	if _, err := eng2.Answer(ctx, job.ID, "color", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "red"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the answer in the sandbox", func() bool { return strings.Contains(answerIn(p.Sandbox, "color"), `"red"`) })
	p.Finish(sandbox.Exit{})
	f.wait(eng2, job.ID)
}

// TestQuestionFlood: a job flooding its status channel with distinct
// questions is still killed at its timeout; it gets at most
// MaxOpenQuestions questions stored and a bounded number of refusal files
// in its sandbox, whatever it writes.
func TestQuestionFlood(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	m := script("asks and asks")
	timeout := 2
	m.Timeout = &timeout
	job, p := f.running(m)
	stop := make(chan struct{})
	defer close(stop)
	var lines atomic.Int64
	go func() {
		for n := 0; n < 2_000_000; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if n%1000 == 0 && p.Killed() {
				return // a killed process writes no more
			}
			p.Event(fmt.Sprintf(`{"type":"question","id":"q%d","message":"Question %d?"}`, n, n))
			lines.Add(1)
		}
	}()
	j := f.wait(f.eng, job.ID)
	if j.Status != delegate.StatusTimeout || !p.Killed() {
		t.Fatalf("flooding job: %s (%s), killed %v", j.Status, j.Error, p.Killed())
	}
	if d := j.Duration(time.Now()); d > time.Duration(timeout)*time.Second+5*time.Second {
		t.Fatalf("flooding job ran %s with a timeout of %ds", d, timeout)
	}
	files, _ := p.Sandbox.ListFiles(context.Background(), sandbox.ListOptions{Regular: true})
	qs := questionsOf(t, f.eng, job.ID)
	t.Logf("%d question lines; %d questions stored, %d files written in the sandbox", lines.Load(), len(qs), len(files))
	if lines.Load() < 10_000 {
		t.Fatalf("only %d lines: no flood to speak of", lines.Load())
	}
	if len(qs) != delegate.MaxOpenQuestions || len(files) > 16 {
		t.Fatalf("%d questions stored, %d files in the sandbox", len(qs), len(files))
	}
}
