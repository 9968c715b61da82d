package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// SampleForm is a form with a field of each kind.
func SampleForm() delegate.Form {
	one, ten, max := 1.0, 10.0, 40
	return delegate.Form{Fields: []delegate.Field{
		{Name: "color", Type: delegate.FieldString, Title: "Colour", Required: true, Enum: []string{"red", "blue"}, EnumNames: []string{"Red", "Blue"}},
		{Name: "note", Type: delegate.FieldString, Description: "anything else", MaxLength: &max, Format: "email"},
		{Name: "count", Type: delegate.FieldInteger, Minimum: &one, Maximum: &ten, Default: 3.0},
		{Name: "ok", Type: delegate.FieldBoolean, Default: true},
		{Name: "ratio", Type: delegate.FieldNumber},
	}}
}

// NewQuestion is an open question a job asks.
func NewQuestion(jobID, id string) *delegate.Question {
	return &delegate.Question{JobID: jobID, ID: id, From: delegate.QuestionFromJob, Message: "Which colour, " + id + "?",
		Form: SampleForm(), AskedAt: time.Now().UTC().Truncate(time.Microsecond)}
}

// testQuestions: a question is stored with everything it says (its form's
// fields in order), read back oldest first through another handle; an id
// asked again returns what was stored first.
func testQuestions(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("q"), NewJob("other"))
	if qs, err := s.Questions(ctx, "q"); err != nil || qs == nil || len(qs) != 0 {
		t.Fatalf("questions before any: %#v %v", qs, err)
	}
	first := NewQuestion("q", "b-first")
	egress := &delegate.Question{JobID: "q", ID: "egress:1", From: "egress", Message: "Let the job reach example.com:443?",
		AskedAt: first.AskedAt.Add(time.Millisecond), Expires: first.AskedAt.Add(30 * time.Second)}
	second := NewQuestion("q", "a-second")
	second.AskedAt = egress.AskedAt.Add(time.Millisecond)
	for _, q := range []*delegate.Question{first, egress, second} {
		got, added, err := s.AddQuestion(ctx, q)
		if err != nil || !added || !sameQuestion(got, q) {
			t.Fatalf("add %s: %+v added %v, %v", q.ID, got, added, err)
		}
	}
	again := NewQuestion("q", "b-first")
	again.Message = "something else"
	got, added, err := s.AddQuestion(ctx, again)
	if err != nil || added || !sameQuestion(got, first) {
		t.Fatalf("the same id again: %+v added %v, %v; want the first one kept", got, added, err)
	}
	// The same id on another job is another question.
	if _, added, err := s.AddQuestion(ctx, NewQuestion("other", "b-first")); err != nil || !added {
		t.Fatalf("the same id on another job: added %v, %v", added, err)
	}
	for _, name := range []string{"same handle", "another handle"} {
		if name == "another handle" {
			s = open()
		}
		qs, err := s.Questions(ctx, "q")
		if err != nil || len(qs) != 3 {
			t.Fatalf("%s: %+v %v", name, qs, err)
		}
		for i, want := range []*delegate.Question{first, egress, second} {
			if !sameQuestion(&qs[i], want) {
				t.Errorf("%s: question %d is %+v; want %+v", name, i, qs[i], want)
			}
		}
	}
	if _, _, err := s.AddQuestion(ctx, NewQuestion("nope", "x")); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("a question on a job that does not exist: %v", err)
	}
}

// testAnswers: an answer is kept with the question, once: a second answer
// is a conflict and changes nothing, also when many race.
func testAnswers(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("q"))
	for _, id := range []string{"one", "race"} {
		if _, _, err := s.AddQuestion(ctx, NewQuestion("q", id)); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().UTC().Truncate(time.Microsecond)
	a := delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "blue", "count": 4.0, "ok": false}, At: at, By: "test"}
	got, err := s.AnswerQuestion(ctx, "q", "one", a)
	if err != nil || got.Answer == nil || !reflect.DeepEqual(*got.Answer, a) {
		t.Fatalf("answer: %+v %v", got, err)
	}
	got, err = s.AnswerQuestion(ctx, "q", "one", delegate.Answer{Action: delegate.AnswerDecline, At: at})
	if !errors.Is(err, delegate.ErrConflict) || got == nil || got.Answer == nil || got.Answer.Action != delegate.AnswerAccept {
		t.Fatalf("a second answer: %+v %v; want a conflict, the first answer kept", got, err)
	}
	qs, err := open().Questions(ctx, "q")
	if err != nil || qs[0].Answer == nil || !reflect.DeepEqual(*qs[0].Answer, a) || qs[1].Answer != nil {
		t.Fatalf("read back through another handle: %+v %v", qs, err)
	}
	var nf *delegate.NotFoundError
	if _, err := s.AnswerQuestion(ctx, "q", "nope", a); !errors.As(err, &nf) || nf.Resource != "question" {
		t.Errorf("an answer to no question: %v", err)
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []string
		errs []error
	)
	for i := range 8 {
		wg.Go(func() {
			by := fmt.Sprint("racer-", i)
			_, err := open().AnswerQuestion(ctx, "q", "race", delegate.Answer{Action: delegate.AnswerCancel, At: at, By: by})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won = append(won, by)
			} else if !errors.Is(err, delegate.ErrConflict) {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 || len(errs) > 0 {
		t.Fatalf("8 racing answers: %v won, errors %v; want exactly one", won, errs)
	}
	qs, _ = s.Questions(ctx, "q")
	if qs[1].Answer == nil || qs[1].Answer.By != won[0] {
		t.Errorf("the stored answer is %+v; %s won", qs[1].Answer, won[0])
	}
}

// sameQuestion compares what the store keeps of a question.
func sameQuestion(got, want *delegate.Question) bool {
	return got.JobID == want.JobID && got.ID == want.ID && got.From == want.From && got.Message == want.Message &&
		got.AskedAt.Equal(want.AskedAt) && got.Expires.Equal(want.Expires) && reflect.DeepEqual(got.Form, want.Form) &&
		reflect.DeepEqual(got.Answer, want.Answer)
}
