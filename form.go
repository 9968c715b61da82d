package delegate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Form is what a question asks for: flat fields of primitive types, as an
// MCP elicitation's requestedSchema says them (in JSON, an object schema
// whose properties are strings, numbers, integers, booleans or string
// enums, in the order given). Nested objects, arrays and other JSON
// Schema keywords are refused: every elicitation client can render what
// is left, and a person can answer it.
type Form struct {
	Fields []Field
}

// FieldType is the type of a form's field.
type FieldType string

const (
	FieldString  FieldType = "string"
	FieldNumber  FieldType = "number"
	FieldInteger FieldType = "integer"
	FieldBoolean FieldType = "boolean"
)

// Field is one field of a form.
type Field struct {
	Name        string
	Type        FieldType
	Title       string
	Description string
	Required    bool
	// Strings: length bounds in characters, a format (email, uri, date,
	// date-time), or a choice among Enum (EnumNames, if set, are their
	// labels, one each).
	MinLength, MaxLength *int
	Format               string
	Enum                 []string
	EnumNames            []string
	// Numbers and integers: bounds.
	Minimum, Maximum *float64
	// Default is a string, a float64 or a bool, after the field's type.
	Default any
}

// Bounds of a form.
const (
	MaxFormFields  = 32
	MaxEnumValues  = 100
	maxFormText    = 1000 // a title, a description, an enum value or name (bytes)
	maxFieldName   = 64
	maxStringLimit = MaxAnswerString
)

var (
	fieldNameRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`) })
	questionIDRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`) })
)

// ValidQuestionID reports whether id may name a question a job asks: 1 to
// 64 letters, digits, '_', '.' and '-', starting with a letter or digit
// (it names a file too).
func ValidQuestionID(id string) bool { return questionIDRE().MatchString(id) }

var formats = []string{"email", "uri", "date", "date-time"}

// formKeys and fieldKeys are the JSON keys a form and a field may have.
var (
	formKeys  = []string{"$schema", "type", "properties", "required"}
	fieldKeys = map[FieldType][]string{
		FieldString:  {"type", "title", "description", "default", "minLength", "maxLength", "format", "enum", "enumNames"},
		FieldNumber:  {"type", "title", "description", "default", "minimum", "maximum"},
		FieldInteger: {"type", "title", "description", "default", "minimum", "maximum"},
		FieldBoolean: {"type", "title", "description", "default"},
	}
)

// formPath is where a form sits in what a job sends (the MCP name).
const formPath = "requestedSchema"

// ParseForm reads a requestedSchema and checks it (see Form.Validate).
// Errors are *FieldError, named from "requestedSchema".
func ParseForm(data []byte) (Form, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return Form{}, fieldErr(formPath, `must be an object schema: {"type":"object","properties":{...}}`)
	}
	for k := range top {
		if !slices.Contains(formKeys, k) {
			return Form{}, fieldErr(formPath+"."+k, "is not supported: a form has type, properties and required")
		}
	}
	var typ string
	if err := json.Unmarshal(top["type"], &typ); err != nil || typ != "object" {
		return Form{}, fieldErr(formPath+".type", `must be "object"`)
	}
	var f Form
	props, ok := top["properties"]
	if ok {
		names, raws, err := orderedObject(props)
		if err != nil {
			return Form{}, fieldErr(formPath+".properties", "must be an object of fields")
		}
		for i, name := range names {
			field, err := parseField(name, raws[i])
			if err != nil {
				return Form{}, err
			}
			f.Fields = append(f.Fields, field)
		}
	}
	if raw, ok := top["required"]; ok {
		var req []string
		if err := json.Unmarshal(raw, &req); err != nil {
			return Form{}, fieldErr(formPath+".required", "must be an array of field names")
		}
		for i, name := range req {
			j := f.index(name)
			if j < 0 {
				return Form{}, fieldErr(fmt.Sprintf("%s.required[%d]", formPath, i), "%q is not a field of properties", name)
			}
			f.Fields[j].Required = true
		}
	}
	return f, f.Validate()
}

// orderedObject returns an object's keys, in the order written, and their
// values.
func orderedObject(data []byte) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, fmt.Errorf("not an object")
	}
	var names []string
	var raws []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		name := t.(string) // an object's keys are strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, err
		}
		if slices.Contains(names, name) {
			return nil, nil, fmt.Errorf("field %q twice", name)
		}
		names, raws = append(names, name), append(raws, raw)
	}
	return names, raws, nil
}

func parseField(name string, data []byte) (Field, error) {
	path := formPath + ".properties." + name
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil || keys == nil {
		return Field{}, fieldErr(path, "must be an object: a field's schema")
	}
	f := Field{Name: name}
	if err := json.Unmarshal(keys["type"], &f.Type); err != nil || fieldKeys[f.Type] == nil {
		return Field{}, fieldErr(path+".type", `must be "string", "number", "integer" or "boolean" (a form's fields are flat)`)
	}
	for k := range keys {
		if !slices.Contains(fieldKeys[f.Type], k) {
			return Field{}, fieldErr(path+"."+k, "is not supported for a %s field (it may have %s)", f.Type, strings.Join(fieldKeys[f.Type][1:], ", "))
		}
	}
	for _, d := range []struct {
		key  string
		dst  any
		rule string
	}{
		{"title", &f.Title, "must be a string"},
		{"description", &f.Description, "must be a string"},
		{"minLength", &f.MinLength, "must be a whole number"},
		{"maxLength", &f.MaxLength, "must be a whole number"},
		{"format", &f.Format, "must be a string"},
		{"enum", &f.Enum, "must be an array of strings"},
		{"enumNames", &f.EnumNames, "must be an array of strings"},
		{"minimum", &f.Minimum, "must be a number"},
		{"maximum", &f.Maximum, "must be a number"},
	} {
		if raw, ok := keys[d.key]; ok {
			if err := json.Unmarshal(raw, d.dst); err != nil {
				return Field{}, fieldErr(path+"."+d.key, "%s", d.rule)
			}
		}
	}
	if raw, ok := keys["default"]; ok {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil || v == nil {
			return Field{}, fieldErr(path+".default", "must be a %s", f.Type)
		}
		f.Default = v
	}
	return f, nil
}

func (f Form) index(name string) int {
	return slices.IndexFunc(f.Fields, func(x Field) bool { return x.Name == name })
}

// Validate checks a form: its fields' names, types and bounds, and that
// each default is a value the field accepts.
func (f Form) Validate() error {
	if len(f.Fields) > MaxFormFields {
		return fieldErr(formPath+".properties", "may have at most %d fields (has %d)", MaxFormFields, len(f.Fields))
	}
	for i, x := range f.Fields {
		path := formPath + ".properties." + x.Name
		if len(x.Name) > maxFieldName || !fieldNameRE().MatchString(x.Name) {
			return fieldErr(fmt.Sprintf("%s.properties[%d]", formPath, i), "a field's name must be 1 to %d letters, digits, '_', '.' and '-', starting with a letter or '_' (got %q)", maxFieldName, x.Name)
		}
		if f.index(x.Name) != i {
			return fieldErr(path, "is named twice")
		}
		if fieldKeys[x.Type] == nil {
			return fieldErr(path+".type", `must be "string", "number", "integer" or "boolean" (got %q)`, x.Type)
		}
		for key, s := range map[string]string{"title": x.Title, "description": x.Description} {
			if len(s) > maxFormText || !utf8.ValidString(s) {
				return fieldErr(path+"."+key, "must be UTF-8 text of at most %d bytes", maxFormText)
			}
		}
		if err := x.validateKind(path); err != nil {
			return err
		}
		if x.Default != nil {
			v, err := x.check(x.Default, path+".default")
			if err != nil {
				return err
			}
			f.Fields[i].Default = v // normalised: an int default becomes a float64
		}
	}
	return nil
}

// validateKind checks the keywords of the field's type, and that it has
// no others.
func (x Field) validateKind(path string) error {
	if x.Type != FieldString && (x.MinLength != nil || x.MaxLength != nil || x.Format != "" || x.Enum != nil || x.EnumNames != nil) {
		return fieldErr(path, "minLength, maxLength, format, enum and enumNames are for string fields only")
	}
	if x.Type != FieldNumber && x.Type != FieldInteger && (x.Minimum != nil || x.Maximum != nil) {
		return fieldErr(path, "minimum and maximum are for number and integer fields only")
	}
	switch x.Type {
	case FieldString:
		for key, n := range map[string]*int{"minLength": x.MinLength, "maxLength": x.MaxLength} {
			if n != nil && (*n < 0 || *n > maxStringLimit) {
				return fieldErr(path+"."+key, "must be between 0 and %d (got %d)", maxStringLimit, *n)
			}
		}
		if x.MinLength != nil && x.MaxLength != nil && *x.MinLength > *x.MaxLength {
			return fieldErr(path+".maxLength", "must be at least minLength (%d > %d)", *x.MinLength, *x.MaxLength)
		}
		if x.Format != "" && !slices.Contains(formats, x.Format) {
			return fieldErr(path+".format", "must be one of %s (got %q)", strings.Join(formats, ", "), x.Format)
		}
		if x.Enum != nil {
			if len(x.Enum) == 0 || len(x.Enum) > MaxEnumValues {
				return fieldErr(path+".enum", "must have 1 to %d values (has %d)", MaxEnumValues, len(x.Enum))
			}
			if x.Format != "" || x.MinLength != nil || x.MaxLength != nil {
				return fieldErr(path+".enum", "a choice has no format, minLength or maxLength")
			}
			for i, v := range x.Enum {
				if len(v) > maxFormText || !utf8.ValidString(v) || slices.Index(x.Enum, v) != i {
					return fieldErr(fmt.Sprintf("%s.enum[%d]", path, i), "must be distinct UTF-8 text of at most %d bytes", maxFormText)
				}
			}
		}
		if x.EnumNames != nil {
			if len(x.EnumNames) != len(x.Enum) {
				return fieldErr(path+".enumNames", "must name each of the %d enum values (has %d names)", len(x.Enum), len(x.EnumNames))
			}
			for i, v := range x.EnumNames {
				if len(v) > maxFormText || !utf8.ValidString(v) {
					return fieldErr(fmt.Sprintf("%s.enumNames[%d]", path, i), "must be UTF-8 text of at most %d bytes", maxFormText)
				}
			}
		}
	case FieldNumber, FieldInteger:
		for key, n := range map[string]*float64{"minimum": x.Minimum, "maximum": x.Maximum} {
			if n != nil && (math.IsNaN(*n) || math.IsInf(*n, 0)) {
				return fieldErr(path+"."+key, "must be a finite number")
			}
		}
		if x.Minimum != nil && x.Maximum != nil && *x.Minimum > *x.Maximum {
			return fieldErr(path+".maximum", "must be at least minimum (%g > %g)", *x.Minimum, *x.Maximum)
		}
	}
	return nil
}

// MarshalJSON writes the form as MCP's requestedSchema, its fields in
// order.
func (f Form) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"type":"object","properties":{`)
	var required []string
	for i, x := range f.Fields {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(x.Name)
		b.Write(name)
		b.WriteByte(':')
		prop, err := json.Marshal(fieldJSON{
			Type: x.Type, Title: x.Title, Description: x.Description, Default: x.Default,
			MinLength: x.MinLength, MaxLength: x.MaxLength, Format: x.Format, Enum: x.Enum, EnumNames: x.EnumNames,
			Minimum: x.Minimum, Maximum: x.Maximum,
		})
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", x.Name, err)
		}
		b.Write(prop)
		if x.Required {
			required = append(required, x.Name)
		}
	}
	b.WriteByte('}')
	if len(required) > 0 {
		req, _ := json.Marshal(required)
		b.WriteString(`,"required":`)
		b.Write(req)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a requestedSchema (ParseForm).
func (f *Form) UnmarshalJSON(data []byte) error {
	form, err := ParseForm(data)
	if err != nil {
		return err
	}
	*f = form
	return nil
}

type fieldJSON struct {
	Type        FieldType `json:"type"`
	Title       string    `json:"title,omitempty"`
	Description string    `json:"description,omitempty"`
	Default     any       `json:"default,omitempty"`
	MinLength   *int      `json:"minLength,omitempty"`
	MaxLength   *int      `json:"maxLength,omitempty"`
	Format      string    `json:"format,omitempty"`
	Enum        []string  `json:"enum,omitempty"`
	EnumNames   []string  `json:"enumNames,omitempty"`
	Minimum     *float64  `json:"minimum,omitempty"`
	Maximum     *float64  `json:"maximum,omitempty"`
}

// Validate checks a question as it is asked: its id (a job's must be
// ValidQuestionID), its message and its form.
func (q *Question) Validate() error {
	if q.From == QuestionFromJob && !ValidQuestionID(q.ID) {
		return fieldErr("id", "must be 1 to 64 letters, digits, '_', '.' and '-', starting with a letter or digit (got %q)", q.ID)
	}
	if strings.TrimSpace(q.Message) == "" || len(q.Message) > MaxQuestionMessage || !utf8.ValidString(q.Message) {
		return fieldErr("message", "must be UTF-8 text of 1 to %d bytes: what the person is asked", MaxQuestionMessage)
	}
	return q.Form.Validate()
}

// CheckAnswer checks an answer against the question's form and returns
// it as it is to be kept: an accepted answer's values checked and
// normalised (numbers as float64), the defaults of the fields it leaves
// out filled in. Errors are *FieldError, named from "content".
func (q *Question) CheckAnswer(a Answer) (Answer, error) {
	switch a.Action {
	case AnswerAccept:
	case AnswerDecline, AnswerCancel:
		if len(a.Content) > 0 {
			return Answer{}, fieldErr("content", "only an accepted answer has content (action is %s)", a.Action)
		}
		a.Content = nil
		return a, nil
	default:
		return Answer{}, fieldErr("action", "must be accept, decline or cancel (got %q)", a.Action)
	}
	content := make(map[string]any, len(q.Form.Fields))
	for name, v := range a.Content {
		i := q.Form.index(name)
		if i < 0 {
			return Answer{}, fieldErr("content."+name, "is not a field of the question (its fields: %s)", strings.Join(q.Form.names(), ", "))
		}
		checked, err := q.Form.Fields[i].check(v, "content."+name)
		if err != nil {
			return Answer{}, err
		}
		content[name] = checked
	}
	for _, x := range q.Form.Fields {
		if _, ok := content[x.Name]; ok {
			continue
		}
		switch {
		case x.Default != nil:
			content[x.Name] = x.Default
		case x.Required:
			return Answer{}, fieldErr("content."+x.Name, "is required")
		}
	}
	a.Content = content
	return a, nil
}

func (f Form) names() []string {
	names := make([]string, len(f.Fields))
	for i, x := range f.Fields {
		names[i] = x.Name
	}
	return names
}

// check returns v as a value of the field (a string, a float64, a bool),
// or an error named path.
func (x Field) check(v any, path string) (any, error) {
	switch x.Type {
	case FieldString:
		s, ok := v.(string)
		if !ok {
			return nil, fieldErr(path, "must be a string")
		}
		return s, x.checkString(s, path)
	case FieldBoolean:
		b, ok := v.(bool)
		if !ok {
			return nil, fieldErr(path, "must be true or false")
		}
		return b, nil
	}
	var n float64
	switch t := v.(type) {
	case float64:
		n = t
	case int:
		n = float64(t)
	case int64:
		n = float64(t)
	case json.Number:
		f, err := t.Float64()
		if err != nil {
			return nil, fieldErr(path, "must be a number")
		}
		n = f
	default:
		return nil, fieldErr(path, "must be a number")
	}
	if math.IsNaN(n) || math.IsInf(n, 0) {
		return nil, fieldErr(path, "must be a finite number")
	}
	if x.Type == FieldInteger && n != math.Trunc(n) {
		return nil, fieldErr(path, "must be a whole number (got %g)", n)
	}
	if x.Minimum != nil && n < *x.Minimum {
		return nil, fieldErr(path, "must be at least %g (got %g)", *x.Minimum, n)
	}
	if x.Maximum != nil && n > *x.Maximum {
		return nil, fieldErr(path, "must be at most %g (got %g)", *x.Maximum, n)
	}
	return n, nil
}

func (x Field) checkString(s, path string) error {
	if !utf8.ValidString(s) || len(s) > MaxAnswerString {
		return fieldErr(path, "must be UTF-8 text of at most %d bytes", MaxAnswerString)
	}
	if x.Enum != nil {
		if !slices.Contains(x.Enum, s) {
			return fieldErr(path, "must be one of %s (got %q)", quoteAll(x.Enum), s)
		}
		return nil
	}
	n := utf8.RuneCountInString(s)
	if x.MinLength != nil && n < *x.MinLength {
		return fieldErr(path, "must have at least %d characters (has %d)", *x.MinLength, n)
	}
	if x.MaxLength != nil && n > *x.MaxLength {
		return fieldErr(path, "must have at most %d characters (has %d)", *x.MaxLength, n)
	}
	var ok bool
	switch x.Format {
	case "":
		return nil
	case "email":
		addr, err := mail.ParseAddress(s)
		ok = err == nil && addr.Address == s
	case "uri":
		u, err := url.Parse(s)
		ok = err == nil && u.Scheme != ""
	case "date":
		_, err := time.Parse(time.DateOnly, s)
		ok = err == nil
	case "date-time":
		_, err := time.Parse(time.RFC3339, s)
		ok = err == nil
	}
	if !ok {
		return fieldErr(path, "must be a valid %s (got %q)", x.Format, s)
	}
	return nil
}

func quoteAll(vals []string) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}
