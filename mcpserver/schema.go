package mcpserver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
)

// Schemas are derived from the Go types (the input structs are what
// delegate.DecodeJSON accepts, the output structs what the tools return)
// and then made compact: every agent session pays for tools/list in
// tokens (TestToolsListSize keeps it under 5,000 bytes).

// inputSchema is the schema of T as an input: properties, their types and
// which are required. The null alternatives of optional fields go (null
// is taken as absent, a detail no model needs), and so does
// additionalProperties false: an unknown field is refused with a message
// that names it and the known ones, which tells a model more.
func inputSchema[T any]() *jsonschema.Schema { return compact(mustSchema[T]()) }

// outputSchema is the schema of T as an output: the names of its fields,
// nested as they are, without their types. An agent needs the names to
// know what comes back; the values show their own types, and typing every
// field would cost a fifth of tools/list (TestToolOutputsMatchSchemas
// checks the outputs against the full typed schema all the same).
func outputSchema[T any]() json.RawMessage {
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

func mustSchema[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(err) // a programming error in a type of this package
	}
	return s
}

func compact(s *jsonschema.Schema) *jsonschema.Schema {
	compactBelow(s)
	return s
}

func compactBelow(s *jsonschema.Schema) {
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
		compactBelow(p)
	}
	compactBelow(s.Items)
	compactBelow(s.AdditionalProperties)
}

// at returns the schema of the property at a dotted path ("manifest.files.
// content": items of arrays are stepped through).
func at(s *jsonschema.Schema, path string) *jsonschema.Schema {
	for name := range strings.SplitSeq(path, ".") {
		if s.Items != nil {
			s = s.Items
		}
		p, ok := s.Properties[name]
		if !ok {
			panic(fmt.Sprintf("schema has no property %q in %q", name, path))
		}
		s = p
	}
	return s
}

// describe sets the descriptions of properties, by path.
func describe(s *jsonschema.Schema, descriptions map[string]string) *jsonschema.Schema {
	for path, d := range descriptions {
		at(s, path).Description = d
	}
	return s
}

// oneOf makes a string property an enum: the type goes, the values say it.
func oneOf[T ~string](s *jsonschema.Schema, path string, values ...T) {
	p := at(s, path)
	p.Type = ""
	p.Enum = make([]any, len(values))
	for i, v := range values {
		p.Enum[i] = string(v)
	}
}
