package pvetools

import (
	"encoding/json"
	"fmt"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/toolschema"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Registration goes through mcpserver's tool adder (mcpserver.Tools),
// as the job tools' does: the arguments decoded by jsonin's rules,
// naming the field and the rule, the typed result encoded once for both
// the structured and the text content, and every error answered through
// the one table by its delegate.ErrorKind. So the errors here are of a
// kind: a refused argument a *delegate.FieldError, Proxmox's own answers
// (proxmoxError) of the kind their HTTP status says; an error of no kind
// (the connection to the API failing, say) is logged and the agent told
// only that the call failed.

// argErr is a refused argument: the field and the rule it broke.
func argErr(field, format string, args ...any) error {
	return &delegate.FieldError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// answerError is an answer in words the agent acts on (Proxmox's, or a
// refusal of ours), of the kind its sentinel says.
type answerError struct {
	msg  string
	kind error // a sentinel of package delegate, or a *delegate.NotFoundError
}

func (e *answerError) Error() string { return e.msg }
func (e *answerError) Unwrap() error { return e.kind }

// answer is an answerError of kind.
func answer(kind error, format string, args ...any) error {
	return &answerError{msg: fmt.Sprintf(format, args...), kind: kind}
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
var errElevated = answer(delegate.ErrForbidden, "this tool changes the cluster, and this server only allows read-only Proxmox tools: "+
	"start delegate with PROXMOX_ALLOW_ELEVATED=true to allow it")
