package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
)

// The questions a running job waits for answers to (the root's
// question.go) are shown on its page, each with a form of its fields; a
// person answers (or declines) there, when the dashboard has
// Services.Questions (the engine, as cmd/ wires it).

// openQuestions are the questions job id waits for answers to.
func (d *dash) openQuestions(ctx context.Context, id string) ([]delegate.Question, error) {
	qs := d.qs
	if qs == nil {
		return nil, nil
	}
	all, err := qs.Questions(ctx, id)
	if err != nil {
		return nil, err
	}
	var open []delegate.Question
	for _, q := range all {
		if q.State == delegate.QuestionOpen {
			open = append(open, q)
		}
	}
	return open, nil
}

// questionURL is where a question's form is sent.
func questionURL(id, qid string) string { return jobURL(id) + "/questions/" + url.PathEscape(qid) }

// answer takes a question's form: the button pressed is the action, the
// fields are named "f." and the field's name, read by the field's type
// (an empty field is left out, so that its default applies).
func (d *dash) answer(w http.ResponseWriter, r *http.Request) {
	id, qid := r.PathValue("id"), r.PathValue("qid")
	qs := d.qs
	if qs == nil {
		d.fail(w, r, http.StatusNotFound, "This server takes no answers.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 256<<10)
	if err := r.ParseForm(); err != nil {
		d.fail(w, r, http.StatusBadRequest, "The answer could not be read.")
		return
	}
	a := delegate.Answer{Action: delegate.AnswerAction(r.PostForm.Get("action")), By: "dashboard"}
	if a.Action == delegate.AnswerAccept {
		all, err := qs.Questions(r.Context(), id)
		if err != nil {
			d.serviceError(w, r, err)
			return
		}
		var form *delegate.Form
		for i := range all {
			if all[i].ID == qid {
				form = &all[i].Form
			}
		}
		if form == nil {
			d.serviceError(w, r, delegate.QuestionNotFound(id, qid))
			return
		}
		if a.Content, err = formContent(*form, r.PostForm); err != nil {
			d.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
	}
	if _, err := qs.Answer(r.Context(), id, qid, a); err != nil {
		var fe *delegate.FieldError
		if errors.As(err, &fe) {
			d.fail(w, r, http.StatusBadRequest, strings.TrimPrefix(fe.Field, "content.")+": "+fe.Rule)
			return
		}
		d.serviceError(w, r, err)
		return
	}
	d.log.Info("dashboard: question answered", "job", id, "question", qid, "action", a.Action, "remote", r.RemoteAddr)
	http.Redirect(w, r, jobURL(id)+"?notice=answered", http.StatusSeeOther)
}

// formContent reads a form's values as its fields' types.
func formContent(form delegate.Form, values url.Values) (map[string]any, error) {
	content := map[string]any{}
	for _, f := range form.Fields {
		v, given := values["f."+f.Name]
		if f.Type == delegate.FieldBoolean {
			// A checkbox is sent only when it is ticked.
			content[f.Name] = given
			continue
		}
		if !given || v[0] == "" {
			continue
		}
		switch f.Type {
		case delegate.FieldNumber, delegate.FieldInteger:
			n, err := strconv.ParseFloat(v[0], 64)
			if err != nil {
				return nil, &delegate.FieldError{Field: f.Name, Rule: "must be a number (got " + strconv.Quote(v[0]) + ")"}
			}
			content[f.Name] = n
		default:
			content[f.Name] = v[0]
		}
	}
	return content, nil
}

// fieldValue is what a field's input starts with: its default.
func fieldValue(f delegate.Field) string {
	switch v := f.Default.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}

// enumName is the label of a choice: its name if the field has names.
func enumName(f delegate.Field, i int) string {
	if i < len(f.EnumNames) {
		return f.EnumNames[i]
	}
	return f.Enum[i]
}

// inputType is the input element for a string field's format. A
// date-time is text: the browser's datetime-local has no time zone, which
// the format requires.
func inputType(format string) string {
	switch format {
	case "email":
		return "email"
	case "uri":
		return "url"
	case "date":
		return "date"
	}
	return "text"
}
