package pvetools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
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

// decodeArgs reads a tool's arguments into v, a pointer to a struct, by
// the rules every tool of delegate's has (internal/jsonin): one JSON
// object without a key given twice at any depth, every key a field of v,
// fields without omitempty required (null is absent), each value of its
// field's type.
func decodeArgs(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	err := jsonin.Decode(raw, v, "")
	var fe *delegate.FieldError
	if errors.As(err, &fe) && fe.Field == "" {
		return &delegate.FieldError{Field: "arguments", Rule: fe.Rule}
	}
	return err
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
