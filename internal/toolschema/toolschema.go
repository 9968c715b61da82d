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

func compact(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Not != nil {
		s.AdditionalProperties = nil // the "false" schema
	}
	for _, p := range s.Properties {
		compact(p)
	}
	compact(s.Items)
	compact(s.AdditionalProperties)
}

// Output is the schema of T as an output: the names of its fields, nested
// as they are, without their types. An agent needs the names to know what
// comes back; the values show their own types, and typing every field
// would cost a fifth of tools/list (the servers' tests check their outputs
// against the full typed schemas all the same).
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
		if !f.IsExported() || name == "-" {
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
