package toolschema

import (
	"encoding/json"
	"testing"
	"time"
)

type inner struct {
	Name string `json:"name"`
}

type sample struct {
	Required string          `json:"required"`
	Optional *int            `json:"optional,omitempty"`
	Raw      json.RawMessage `json:"raw,omitempty"`
	When     time.Time       `json:"when"`
	One      *inner          `json:"one,omitempty"`
	Many     []inner         `json:"many"`
	Tags     []string        `json:"tags"`
	Hidden   string          `json:"-"`
	Owner    string          `json:"owner,omitempty" delegate:"operator"`
	lower    string
}

func TestInput(t *testing.T) {
	data, err := json.Marshal(Input[sample]())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Type                 string                     `json:"type"`
		Required             []string                   `json:"required"`
		Properties           map[string]json.RawMessage `json:"properties"`
		AdditionalProperties any                        `json:"additionalProperties"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ prop, want string }{
		{"optional", `{"type":"integer"}`}, // no null alternative
		{"raw", `true`},                    // any JSON value (the empty schema)
		{"required", `{"type":"string"}`},
		// Below the top, what the properties or items show goes.
		{"one", `{"properties":{"name":{"type":"string"}},"required":["name"]}`},
		{"tags", `{"items":{"type":"string"}}`},
	} {
		if string(got.Properties[c.prop]) != c.want {
			t.Errorf("%s: %s, want %s", c.prop, got.Properties[c.prop], c.want)
		}
	}
	if got.Type != "object" {
		t.Errorf("the top lost its type: %s", data)
	}
	if got.AdditionalProperties != nil {
		t.Errorf("additionalProperties kept: %s", data)
	}
	if _, ok := got.Properties["Hidden"]; ok {
		t.Errorf("a json:\"-\" field is in the schema: %s", data)
	}
}

func TestOutput(t *testing.T) {
	const want = `{"properties":{"many":{"items":{"properties":{"name":{}}}},"one":{"properties":{"name":{}}},` +
		`"optional":{},"raw":{},"required":{},"tags":{},"when":{}},"type":"object"}`
	if got := string(Output[sample]()); got != want {
		t.Errorf("Output = %s\nwant     %s", got, want)
	}
}
