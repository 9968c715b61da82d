package jsonin_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
)

// TestDecode: the rules of the strict decoder beyond the manifest's
// own fields.
func TestDecode(t *testing.T) {
	type inner struct {
		N int `json:"n,omitempty"`
	}
	type args struct {
		ID    string            `json:"id"`
		Count *int              `json:"count,omitempty"`
		Ratio float64           `json:"ratio,omitempty"`
		On    bool              `json:"on,omitempty"`
		Small int8              `json:"small,omitempty"`
		Tags  []string          `json:"tags,omitempty"`
		In    *inner            `json:"in,omitempty"`
		Raw   json.RawMessage   `json:"raw,omitempty"`
		Env   map[string]string `json:"env,omitempty"`
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
		{"unknown lists known", `{"id":"a","cnt":1}`, "cnt", "unknown field (known: id, count, ratio, on, small, tags, in, raw, env)"},
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
		// What the library adds: numbers checked against their Go type,
		// and names matched exactly.
		{"int too large", `{"id":"a","count":99999999999999999999}`, "count", "between -9223372036854775808 and 9223372036854775807"},
		{"integral float too large", `{"id":"a","small":1e3}`, "small", "between -128 and 127 (got 1e3)"},
		{"float too large", `{"id":"a","ratio":1e400}`, "ratio", "must be a finite number"},
		{"case differs", `{"id":"a","ID":"b"}`, "ID", "unknown field"},
		{"case differs nested", `{"id":"a","in":{"N":1}}`, "in.N", "unknown field (known: n)"},
		{"map null", `{"id":"a","env":{"A":null}}`, "env.A", "must be a string (got null)"},
		{"map duplicate", `{"id":"a","env":{"A":"1","A":"2"}}`, "env.A", "duplicate key"},
		{"array null", `{"id":"a","tags":[null]}`, "tags[0]", "must be a string (got null)"},
		{"raw array duplicate", `{"id":"a","raw":[1,{"x":1,"x":2}]}`, "raw[1].x", "duplicate key"},
		{"invalid UTF-8", "{\"id\":\"a\xffb\"}", "id", "not valid UTF-8"},
		{"lone surrogate", `{"id":"a\ud800b"}`, "id", "lone UTF-16 surrogate"},
		{"leading zero after", `{"id":"a","count":01}`, "count", "not valid JSON"},
		{"trailing comma", `{"id":"a",}`, "", "not valid JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a args
			err := jsonin.Decode([]byte(tc.json), &a, "")
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
	if err := jsonin.Decode([]byte(`{"id":"a","count":0}`), &a, ""); err != nil || a.Count == nil || *a.Count != 0 {
		t.Errorf("a given 0 is not absent: %+v %v", a, err)
	}
	a = args{}
	if err := jsonin.Decode([]byte(`{"id":"a","count":null}`), &a, ""); err != nil || a.Count != nil {
		t.Errorf("null is absent: %+v %v", a, err)
	}
}

// integralFloat: encoding/json refused a number such as 1e2 for an
// integer field, which jsonin takes, as JSON Schema's "integer" does.
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

// FuzzDecode: what the strict decoder accepts, encoding/json accepts
// and reads the same way; what it refuses, it refuses with a field error.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"agentType":"script","task":"echo hi","timeout":5}`))
	f.Add([]byte(`{"agentType":"script","task":"a","task":"b"}`))
	f.Add([]byte(`{"agentType":"custom","agent":{"command":"x"},"env":{"A":"\u00e9\ud83d\ude00"},"files":[{"path":"a","content":"aGk="}]}`))
	f.Add([]byte(`{"agentType":"claude","task":"t","resources":{"cpu":1.5e0,"memory":"1G"},"timeout":6e1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := jsonin.Check(data, "x"); err == nil {
			if !json.Valid(data) {
				t.Fatalf("accepted what encoding/json calls invalid: %q", data)
			}
		} else if fe := (*delegate.FieldError)(nil); !errors.As(err, &fe) {
			t.Fatalf("not a field error: %v", err)
		}
		m, err := jsonin.DecodeManifest(data)
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
