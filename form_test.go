package delegate_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

const sampleSchema = `{"type":"object","properties":{
	"color":{"type":"string","title":"Colour","enum":["red","blue"],"enumNames":["Red","Blue"]},
	"email":{"type":"string","format":"email","maxLength":40},
	"count":{"type":"integer","minimum":1,"maximum":10,"default":3},
	"ok":{"type":"boolean","default":true},
	"ratio":{"type":"number","description":"0 to 1","minimum":0,"maximum":1}
},"required":["color","ratio"]}`

// TestParseFormRoundTrip: a requestedSchema is read with its fields in
// the order written, and written back as it was.
func TestParseFormRoundTrip(t *testing.T) {
	f, err := delegate.ParseForm([]byte(sampleSchema))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range f.Fields {
		names = append(names, x.Name)
	}
	if strings.Join(names, ",") != "color,email,count,ok,ratio" || !f.Fields[0].Required || f.Fields[1].Required || !f.Fields[4].Required {
		t.Fatalf("fields %v: %+v", names, f.Fields)
	}
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	json.Unmarshal([]byte(sampleSchema), &want)
	json.Unmarshal(out, &got)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("written back as\n%s", out)
	}
	// The order survives too: properties are written as read.
	if !strings.HasPrefix(string(out), `{"type":"object","properties":{"color":`) || strings.Index(string(out), `"email"`) > strings.Index(string(out), `"count"`) {
		t.Errorf("order lost: %s", out)
	}
	empty, err := json.Marshal(delegate.Form{})
	if err != nil || string(empty) != `{"type":"object","properties":{}}` {
		t.Errorf("an empty form: %s %v", empty, err)
	}
}

// TestParseFormRefuses: what an elicitation cannot carry is refused with
// the field and the rule.
func TestParseFormRefuses(t *testing.T) {
	for _, c := range []struct{ schema, field, rule string }{
		{`[]`, "requestedSchema", "object schema"},
		{`{"type":"array"}`, "requestedSchema.type", `"object"`},
		{`{"type":"object","additionalProperties":false}`, "requestedSchema.additionalProperties", "not supported"},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{}}}}`, "requestedSchema.properties.a.type", "flat"},
		{`{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}}}}`, "requestedSchema.properties.a.type", "flat"},
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}`, "requestedSchema.properties.a.pattern", "not supported"},
		{`{"type":"object","properties":{"a":{"type":"number","enum":["x"]}}}`, "requestedSchema.properties.a.enum", "not supported"},
		{`{"type":"object","properties":{"a":{"type":"string","format":"ipv4"}}}`, "requestedSchema.properties.a.format", "email, uri"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":5,"maxLength":2}}}`, "requestedSchema.properties.a.maxLength", "at least minLength"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":1.5}}}`, "requestedSchema.properties.a.minLength", "whole number"},
		{`{"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":2}}}`, "requestedSchema.properties.a.maximum", "at least minimum"},
		{`{"type":"object","properties":{"a":{"type":"string","enum":[]}}}`, "requestedSchema.properties.a.enum", "1 to 100"},
		{`{"type":"object","properties":{"a":{"type":"string","enum":["x","x"]}}}`, "requestedSchema.properties.a.enum[1]", "distinct"},
		{`{"type":"object","properties":{"a":{"type":"string","enum":["x"],"enumNames":["X","Y"]}}}`, "requestedSchema.properties.a.enumNames", "each of the 1"},
		{`{"type":"object","properties":{"a":{"type":"string","enum":["x"],"default":"y"}}}`, "requestedSchema.properties.a.default", `one of "x"`},
		{`{"type":"object","properties":{"a":{"type":"integer","default":1.5}}}`, "requestedSchema.properties.a.default", "whole number"},
		{`{"type":"object","properties":{"a":{"type":"boolean","default":"yes"}}}`, "requestedSchema.properties.a.default", "true or false"},
		{`{"type":"object","properties":{"a b":{"type":"string"}}}`, "requestedSchema.properties[0]", "a field's name"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}`, "requestedSchema.required[0]", `"b" is not a field`},
		{`{"type":"object","properties":{"a":{"type":"string"},"a":{"type":"number"}}}`, "requestedSchema.properties", "object of fields"},
	} {
		_, err := delegate.ParseForm([]byte(c.schema))
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(fe.Rule, c.rule) || !errors.Is(err, delegate.ErrInvalid) {
			t.Errorf("%s: %v; want %s: …%s…", c.schema, err, c.field, c.rule)
		}
	}
	var many strings.Builder
	many.WriteString(`{"type":"object","properties":{`)
	for i := range delegate.MaxFormFields + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"f` + strings.Repeat("x", i) + `":{"type":"boolean"}`)
	}
	many.WriteString("}}")
	if _, err := delegate.ParseForm([]byte(many.String())); err == nil || !strings.Contains(err.Error(), "at most 32 fields") {
		t.Errorf("too many fields: %v", err)
	}
}

// TestCheckAnswer: an answer is checked against its form, field by field,
// and the defaults of what it leaves out are filled in.
func TestCheckAnswer(t *testing.T) {
	f, err := delegate.ParseForm([]byte(sampleSchema))
	if err != nil {
		t.Fatal(err)
	}
	q := &delegate.Question{ID: "q", From: delegate.QuestionFromJob, Message: "?", Form: f}
	accept := func(content map[string]any) delegate.Answer {
		return delegate.Answer{Action: delegate.AnswerAccept, Content: content}
	}
	got, err := q.CheckAnswer(accept(map[string]any{"color": "blue", "ratio": 0.5, "email": "a@example.com"}))
	want := map[string]any{"color": "blue", "ratio": 0.5, "email": "a@example.com", "count": 3.0, "ok": true}
	if err != nil || !reflect.DeepEqual(got.Content, want) {
		t.Fatalf("answer %+v %v; want content %v", got, err, want)
	}
	if got, err := q.CheckAnswer(accept(map[string]any{"color": "red", "ratio": json.Number("1"), "count": 7})); err != nil || got.Content["count"] != 7.0 || got.Content["ratio"] != 1.0 {
		t.Errorf("numbers of other types: %+v %v", got, err)
	}
	for _, a := range []delegate.Answer{{Action: delegate.AnswerDecline}, {Action: delegate.AnswerCancel, Content: map[string]any{}}} {
		if got, err := q.CheckAnswer(a); err != nil || got.Content != nil {
			t.Errorf("%s: %+v %v", a.Action, got, err)
		}
	}
	for _, c := range []struct {
		a           delegate.Answer
		field, rule string
	}{
		{delegate.Answer{Action: "yes"}, "action", "accept, decline or cancel"},
		{delegate.Answer{Action: delegate.AnswerDecline, Content: map[string]any{"color": "red"}}, "content", "only an accepted answer"},
		{accept(map[string]any{"ratio": 0.5}), "content.color", "required"},
		{accept(map[string]any{"color": "green", "ratio": 0.5}), "content.color", `one of "red", "blue"`},
		{accept(map[string]any{"color": 1.0, "ratio": 0.5}), "content.color", "a string"},
		{accept(map[string]any{"color": "red", "ratio": 2.0}), "content.ratio", "at most 1"},
		{accept(map[string]any{"color": "red", "ratio": "half"}), "content.ratio", "a number"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "count": 2.5}), "content.count", "whole number"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "count": 0.0}), "content.count", "at least 1"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "ok": "true"}), "content.ok", "true or false"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "email": "not an address"}), "content.email", "must be a valid email"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "email": strings.Repeat("a", 40) + "@x.org"}), "content.email", "at most 40 characters"},
		{accept(map[string]any{"color": "red", "ratio": 0.1, "extra": 1.0}), "content.extra", "not a field of the question (its fields: color, email, count, ok, ratio)"},
	} {
		_, err := q.CheckAnswer(c.a)
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(fe.Rule, c.rule) {
			t.Errorf("%+v: %v; want %s: …%s…", c.a, err, c.field, c.rule)
		}
	}
}

// TestQuestionValidate: a job's question needs an id that can name a
// file, and a message.
func TestQuestionValidate(t *testing.T) {
	ok := delegate.Question{ID: "deploy-1.b_c", From: delegate.QuestionFromJob, Message: "Deploy?"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q     delegate.Question
		field string
	}{
		{delegate.Question{ID: "", From: "job", Message: "x"}, "id"},
		{delegate.Question{ID: "../x", From: "job", Message: "x"}, "id"},
		{delegate.Question{ID: ".hidden", From: "job", Message: "x"}, "id"},
		{delegate.Question{ID: "egress:1", From: "job", Message: "x"}, "id"},
		{delegate.Question{ID: strings.Repeat("a", 65), From: "job", Message: "x"}, "id"},
		{delegate.Question{ID: "a", From: "job", Message: "  "}, "message"},
		{delegate.Question{ID: "a", From: "job", Message: strings.Repeat("x", delegate.MaxQuestionMessage+1)}, "message"},
		{delegate.Question{ID: "a", From: "job", Message: "\xff"}, "message"},
	} {
		var fe *delegate.FieldError
		if err := c.q.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%q %q: %v; want an error about %s", c.q.ID, c.q.Message, err, c.field)
		}
	}
	// delegate's own ids hold a colon, which a job's cannot.
	if err := (&delegate.Question{ID: "egress:1", From: "egress", Message: "x"}).Validate(); err != nil {
		t.Errorf("delegate's own question: %v", err)
	}
}

func TestQuestionState(t *testing.T) {
	now := time.Now()
	open := delegate.Question{}
	answered := delegate.Question{Answer: &delegate.Answer{Action: delegate.AnswerDecline}}
	expiring := delegate.Question{Expires: now.Add(time.Second)}
	for _, c := range []struct {
		q    delegate.Question
		st   delegate.Status
		at   time.Time
		want delegate.QuestionState
	}{
		{open, delegate.StatusRunning, now, delegate.QuestionOpen},
		{open, delegate.StatusTimeout, now, delegate.QuestionClosed},
		{answered, delegate.StatusSuccess, now, delegate.QuestionAnswered},
		{expiring, delegate.StatusRunning, now, delegate.QuestionOpen},
		{expiring, delegate.StatusRunning, now.Add(time.Second), delegate.QuestionClosed},
	} {
		if got := c.q.StateAt(c.st, c.at); got != c.want {
			t.Errorf("%+v in a %s job: %s, want %s", c.q, c.st, got, c.want)
		}
	}
}
