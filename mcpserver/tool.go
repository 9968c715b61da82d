package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/jsonin"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tools adds tools to one MCP server the way every tool of delegate's is
// added, the job tools here and the Proxmox toolset (pvetools) alike: the
// arguments decoded by jsonin's rules, naming the field at fault, and
// every error answered through the one table (toolError) by its
// delegate.ErrorKind.
type Tools struct {
	server *mcp.Server
	dec    *jsonin.Decoder // one for all tools: it keeps what it learns of their types
	log    *slog.Logger
	// deps names, for an agent, what a call of these tools needs that may
	// not answer now (an ErrUnavailable error).
	deps string
	// scope is what a principal needs to call these tools: ScopeAdmin
	// unless Scoped says otherwise (a toolset that says nothing, such as
	// the Proxmox tools, is the operator's).
	scope delegate.Scope
}

// NewTools is the tool adder for s. deps names what its tools' calls need
// that may not answer for a while ("the Proxmox API"), as the agent reads
// it when a call fails with delegate.ErrUnavailable. log hears the errors
// the agent is not shown in full (nil: none).
func NewTools(s *mcp.Server, log *slog.Logger, deps string) *Tools {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Tools{server: s, dec: new(jsonin.Decoder), log: log, deps: deps, scope: delegate.ScopeAdmin}
}

// Scoped is ts for tools that need scope s instead.
func (ts *Tools) Scoped(s delegate.Scope) *Tools {
	c := *ts
	c.scope = s
	return &c
}

// AddTool registers a tool whose arguments decode into In and whose
// answer is Out (see addTool).
func AddTool[In, Out any](ts *Tools, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, *In) (Out, error)) {
	addTool(ts, t, h)
}

// addTool registers a tool with the non-generic Server.AddTool: the SDK
// then neither validates the arguments nor the output against their JSON
// schemas on every call (a third of a call's CPU, and its messages name
// no field a person would recognise). Instead the arguments are decoded
// by jsonin.Decode into In, whose rules the published input schema
// states (TestInputSchemasDescribeWhatIsAccepted), and Out, the source of
// the output schema, is encoded once for both the structured and the text
// content.
//
// A service error becomes the agent's message through toolError; log hears
// in full those the agent is not shown.
func addTool[In, Out any](ts *Tools, t *mcp.Tool, h func(context.Context, *mcp.CallToolRequest, *In) (Out, error)) {
	ts.server.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := need(ctx, ts.scope, t.Name); err != nil {
			return errorResult(ts.toolError(ctx, t.Name, err)), nil
		}
		var in In
		args := req.Params.Arguments
		if len(bytes.TrimSpace(args)) == 0 {
			args = json.RawMessage("{}") // no arguments: as if an empty object
		}
		if err := ts.dec.Decode(args, &in, ""); err != nil {
			return errorResult(ts.toolError(ctx, t.Name, argumentError(err))), nil
		}
		out, err := h(ctx, req, &in)
		if err != nil {
			return errorResult(ts.toolError(ctx, t.Name, err)), nil
		}
		data, err := encode(out)
		if err != nil {
			return nil, fmt.Errorf("%s: encoding the result: %w", t.Name, err)
		}
		return &mcp.CallToolResult{
			StructuredContent: json.RawMessage(data),
			// Clients from before structured content read the same JSON
			// as text.
			Content: []mcp.Content{&mcp.TextContent{Text: string(data)}},
		}, nil
	})
}

// encode is json.Marshal without HTML escaping: job output full of < and
// & stays as short as it was.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func errorResult(err error) *mcp.CallToolResult {
	var res mcp.CallToolResult
	res.SetError(err)
	return &res
}

// argumentError names the arguments themselves when the error is about
// them as a whole (not an object, not JSON).
func argumentError(err error) error {
	var fe *delegate.FieldError
	if errors.As(err, &fe) && fe.Field == "" {
		return &delegate.FieldError{Field: "arguments", Rule: fe.Rule}
	}
	return err
}
