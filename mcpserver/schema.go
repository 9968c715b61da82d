package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/delegate-dev/delegate/internal/toolschema"
	"github.com/google/jsonschema-go/jsonschema"
)

// Schemas are derived from the Go types (the input structs are what
// jsonin.Decode accepts, the output structs what the tools return)
// and then made compact: every agent session pays for tools/list in
// tokens (TestToolsListSize keeps the default listing at or under 8,000 bytes).

// inputSchema and outputSchema are the shared compact schemas (see
// internal/toolschema).
func inputSchema[T any]() *jsonschema.Schema { return toolschema.Input[T]() }

func outputSchema[T any]() json.RawMessage { return toolschema.Output[T]() }

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
