// Package toolschema makes the JSON schemas of MCP tools from Go types
// and keeps them compact: every agent session pays for tools/list in
// tokens. The MCP server's job tools and the Proxmox admin tools use it.
package toolschema

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
)

// Input is the schema of T as an input: properties, their types and which
// are required. The null alternatives of optional fields go (null is
// taken as absent, a detail no model needs), and so does
// additionalProperties false: an unknown field is refused with a message
// that names it and the known ones, which tells a model more. A
// json.RawMessage field takes any JSON value (its handler reads it).
// Below the top, an object's "type" goes where its properties say it, and
// an array's where its items do (16 bytes each, for what the keyword
// beside it shows; the decoder refuses a value of another type, naming
// the field, all the same).
func Input[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {},
	}})
	if err != nil {
		panic(err) // a programming error in the caller's type
	}
	compact(s)
	return s
}

// compact compacts s, the top of a schema, and below it.
func compact(s *jsonschema.Schema) { compactAt(s, true) }

func compactAt(s *jsonschema.Schema, top bool) {
	if s == nil {
		return
	}
	defer func() {
		if !top && (s.Type == "object" && (len(s.Properties) > 0 || s.AdditionalProperties != nil) || s.Type == "array" && s.Items != nil) {
			s.Type = ""
		}
	}()
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Not != nil {
		s.AdditionalProperties = nil // the "false" schema
	}
	for _, p := range s.Properties {
		compactAt(p, false)
	}
	compactAt(s.Items, false)
	compactAt(s.AdditionalProperties, false)
}

// Output is the schema of T as an output: the names of its fields, nested
// as they are, without their types. An agent needs the names to know what
// comes back; the values show their own types, and typing every field
// would cost a fifth of tools/list (the servers' tests check their outputs
// against the full typed schemas all the same). A field tagged
// delegate:"operator" is left out: only an operator's answers carry it
// (whose each item is), and every other session would pay for its name.
func Output[T any]() json.RawMessage {
	data, err := json.Marshal(map[string]any{"type": "object", "properties": fieldNames(reflect.TypeFor[T]())})
	if err != nil {
		panic(err)
	}
	return data
}

// fieldNames maps the JSON name of each field of the struct t to {}, or to
// the names below it for a struct or a list of structs.
func fieldNames(t reflect.Type) map[string]any {
	names := map[string]any{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || f.Tag.Get("delegate") == "operator" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]():
			names[name] = map[string]any{"properties": fieldNames(ft)}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			names[name] = map[string]any{"items": map[string]any{"properties": fieldNames(ft.Elem())}}
		default:
			names[name] = struct{}{}
		}
	}
	return names
}
