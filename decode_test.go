package delegate_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestDecodeJSON: the rules of the strict decoder beyond the manifest's
// own fields.
func TestDecodeJSON(t *testing.T) {
	type inner struct {
		N int `json:"n,omitempty"`
	}
	type args struct {
		ID    string          `json:"id"`
		Count *int            `json:"count,omitempty"`
		Ratio float64         `json:"ratio,omitempty"`
		On    bool            `json:"on,omitempty"`
		Small int8            `json:"small,omitempty"`
		Tags  []string        `json:"tags,omitempty"`
		In    *inner          `json:"in,omitempty"`
		Raw   json.RawMessage `json:"raw,omitempty"`
	}
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70)
	tests := []struct {
		name, json string
		wantField  string // "" with wantRule "": valid
		wantRule   string
	}{
		{"minimal", `{"id":"a"}`, "", ""},
		{"all", ` {"id":"a","count":0,"ratio":0.5,"on":true,"small":-128,"tags":["x"],"in":{"n":2},"raw":{"a":[1,{"b":null}]}} `, "", ""},
		{"missing required", `{}`, "id", "required (a string)"},
		{"required null", `{"id":null}`, "id", "required (a string)"},
		{"empty input", ``, "", "required (an object)"},
		{"not an object", `"id"`, "", "must be an object (got a string)"},
		{"unknown lists known", `{"id":"a","cnt":1}`, "cnt", "unknown field (known: id, count, ratio, on, small, tags, in, raw)"},
		{"int range", `{"id":"a","small":128}`, "small", "between -128 and 127"},
		{"integral float", `{"id":"a","count":1e2,"small":-5.0}`, "", ""},
		{"bool type", `{"id":"a","on":1}`, "on", "must be true or false (got a number)"},
		{"nested path", `{"id":"a","in":{"n":"2"}}`, "in.n", "must be an integer (got a string)"},
		{"array element", `{"id":"a","tags":["x",2]}`, "tags[1]", "must be a string (got a number)"},
		{"raw duplicate", `{"id":"a","raw":{"a":1,"b":{"c":1,"c":2}}}`, "raw.b.c", "duplicate key"},
		{"raw many keys duplicate", `{"id":"a","raw":{` + manyKeys(40) + `,"k7":0}}`, "raw.k7", "duplicate key"},
		{"raw bad syntax", `{"id":"a","raw":{"a":tru}}`, "raw.a", "not valid JSON"},
		{"raw leading zero", `{"id":"a","raw":01}`, "raw", "not valid JSON"},
		{"raw too deep", `{"id":"a","raw":` + deep + `}`, "raw" + strings.Repeat("[0]", 63), "nests deeper than 64"},
		{"unterminated", `{"id":"a`, "id", "not valid JSON: the input ends"},
		{"missing colon", `{"id" "a"}`, "id", "':'"},
		{"bad escape", `{"id":"a\x"}`, "id", "an escape"},
		{"two values", `{"id":"a"}{}`, "", "single JSON value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a args
			err := delegate.DecodeJSON([]byte(tc.json), &a, "")
			if tc.wantRule == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				var std args
				if err := json.Unmarshal([]byte(tc.json), &std); !integralFloat(err) && (err != nil || !reflect.DeepEqual(a, std)) {
					t.Fatalf("decoded %+v; encoding/json: %+v (%v)", a, std, err)
				}
				return
			}
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.wantField || !strings.Contains(fe.Rule, tc.wantRule) {
				t.Fatalf("got %v; want %q containing %q", err, tc.wantField, tc.wantRule)
			}
		})
	}

	var a args
	if err := delegate.DecodeJSON([]byte(`{"id":"a","count":0}`), &a, ""); err != nil || a.Count == nil || *a.Count != 0 {
		t.Errorf("a given 0 is not absent: %+v %v", a, err)
	}
	a = args{}
	if err := delegate.DecodeJSON([]byte(`{"id":"a","count":null}`), &a, ""); err != nil || a.Count != nil {
		t.Errorf("null is absent: %+v %v", a, err)
	}
}

// integralFloat: encoding/json refused a number such as 1e2 for an
// integer field, which DecodeJSON takes, as JSON Schema's "integer" does.
func integralFloat(err error) bool {
	var te *json.UnmarshalTypeError
	return errors.As(err, &te) && strings.HasPrefix(te.Value, "number ") && strings.ContainsAny(te.Value, ".eE")
}

func manyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = `"k` + string(rune('0'+i/10)) + string(rune('0'+i%10)) + `":0`
	}
	return strings.ReplaceAll(strings.Join(keys, ","), `"k0`, `"k`)
}

// FuzzDecodeJSON: what the strict decoder accepts, encoding/json accepts
// and reads the same way; what it refuses, it refuses with a field error.
func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(`{"agentType":"script","task":"echo hi","timeout":5}`))
	f.Add([]byte(`{"agentType":"script","task":"a","task":"b"}`))
	f.Add([]byte(`{"agentType":"custom","agent":{"command":"x"},"env":{"A":"\u00e9\ud83d\ude00"},"files":[{"path":"a","content":"aGk="}]}`))
	f.Add([]byte(`{"agentType":"claude","task":"t","resources":{"cpu":1.5e0,"memory":"1G"},"timeout":6e1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := delegate.CheckJSON(data, "x"); err == nil {
			if !json.Valid(data) {
				t.Fatalf("accepted what encoding/json calls invalid: %q", data)
			}
		} else if fe := (*delegate.FieldError)(nil); !errors.As(err, &fe) {
			t.Fatalf("not a field error: %v", err)
		}
		m, err := delegate.DecodeManifest(data)
		if err != nil {
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "manifest") || fe.Rule == "" {
				t.Fatalf("error without field and rule: %v", err)
			}
			return
		}
		var std delegate.Manifest
		if err := json.Unmarshal(data, &std); !integralFloat(err) && (err != nil || !reflect.DeepEqual(m, std)) {
			t.Fatalf("%q: strict %+v, encoding/json %+v (%v)", data, m, std, err)
		}
	})
}
