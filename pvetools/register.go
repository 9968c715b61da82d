package pvetools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/delegate-dev/delegate/internal/toolschema"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Registration and argument decoding: the one place that touches the
// SDK's tool API. Tools are added with the non-generic Server.AddTool, so
// the SDK neither validates arguments against the schema (its messages
// name no field a model would recognise) nor the output: decodeArgs does
// the first, naming the field and the rule, and the handler's typed
// result is encoded once for both the structured and the text content.
// (mcpserver is moving to the same pattern with delegate.DecodeJSON; when
// it lands, decodeArgs can become a call to it.)

// addTool registers a tool whose arguments decode into In.
func addTool[In, Out any](s *mcp.Server, t *mcp.Tool, h func(context.Context, *In) (Out, error)) {
	if t.InputSchema == nil {
		t.InputSchema = inputSchema[In]()
	}
	if t.OutputSchema == nil {
		t.OutputSchema = outputSchema[Out]()
	}
	s.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in In
		if err := decodeArgs(req.Params.Arguments, &in); err != nil {
			return errorResult(err), nil
		}
		out, err := h(ctx, &in)
		if err != nil {
			return errorResult(err), nil
		}
		data, err := encode(out)
		if err != nil {
			return nil, fmt.Errorf("%s: encoding the result: %w", t.Name, err)
		}
		return &mcp.CallToolResult{
			StructuredContent: json.RawMessage(data),
			Content:           []mcp.Content{&mcp.TextContent{Text: string(data)}},
		}, nil
	})
}

func errorResult(err error) *mcp.CallToolResult {
	var res mcp.CallToolResult
	res.SetError(err)
	return &res
}

// encode is json.Marshal without HTML escaping (command output keeps its
// < and &).
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// argError is a refused argument: the field and the rule it broke.
type argError struct{ field, rule string }

func (e *argError) Error() string {
	if e.field == "" {
		return "arguments: " + e.rule
	}
	return e.field + ": " + e.rule
}

func argErr(field, format string, args ...any) error {
	return &argError{field: field, rule: fmt.Sprintf(format, args...)}
}

// decodeArgs reads a tool's arguments into v, a pointer to a struct: the
// arguments must be one JSON object without a key given twice (at any
// depth), every key must be a field of v, fields without omitempty are
// required (null is absent), and each value must have its field's type.
func decodeArgs(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	if err := checkDuplicates(raw); err != nil {
		return err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return argErr("", "must be a JSON object")
	}
	rt := reflect.TypeOf(v).Elem()
	known := map[string]reflect.StructField{}
	var names []string
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		known[name] = f
		names = append(names, name)
		val, given := keys[name]
		if !given || string(bytes.TrimSpace(val)) == "null" {
			if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
				return argErr(name, "required (%s)", kindName(f.Type))
			}
			delete(keys, name)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if _, ok := known[k]; !ok {
			return argErr(k, "unknown argument (this tool takes %s)", strings.Join(names, ", "))
		}
	}
	rv := reflect.ValueOf(v).Elem()
	for name, val := range keys {
		f := known[name]
		if err := json.Unmarshal(val, rv.FieldByIndex(f.Index).Addr().Interface()); err != nil {
			return argErr(name, "must be %s", kindName(f.Type))
		}
	}
	return nil
}

// kindName says what a field takes, for messages.
func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[json.RawMessage]():
		return "a JSON value"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(kindName(t.Elem()), "a "), "an ") + "s"
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct:
		return "an object"
	}
	return t.String()
}

// checkDuplicates refuses a key given twice in one object, anywhere:
// decoders disagree on which one wins.
func checkDuplicates(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return argErr(path, "not valid JSON")
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return argErr(path, "not valid JSON")
				}
				k, _ := kt.(string)
				sub := k
				if path != "" {
					sub = path + "." + k
				}
				if seen[k] {
					return argErr(sub, "given twice")
				}
				seen[k] = true
				if err := walk(sub); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		}
		if err != nil {
			return argErr(path, "not valid JSON")
		}
		return nil
	}
	if err := walk(""); err != nil {
		return err
	}
	if dec.More() {
		return argErr("", "must be a single JSON object")
	}
	return nil
}

// inputSchema and outputSchema are the compact schemas the job tools use
// too (see internal/toolschema).
func inputSchema[T any]() *jsonschema.Schema { return toolschema.Input[T]() }

func outputSchema[T any]() json.RawMessage { return toolschema.Output[T]() }

// annotations are a tool's hints. Every admin tool reaches a Proxmox
// cluster, a system outside delegate: open world.
func annotations(readOnly, destructive, idempotent bool) *mcp.ToolAnnotations {
	open := true
	return &mcp.ToolAnnotations{ReadOnlyHint: readOnly, DestructiveHint: &destructive,
		IdempotentHint: idempotent, OpenWorldHint: &open}
}

// errElevated is the answer of a tool that changes something while the
// server does not allow it.
var errElevated = errors.New("this tool changes the cluster, and this server only allows read-only Proxmox tools: " +
	"start delegate with PROXMOX_ALLOW_ELEVATED=true to allow it")
