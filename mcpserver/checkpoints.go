package mcpserver

import (
	"context"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Checkpoints and forks (issue 38), offered with Services.Checkpoints
// (the checkpoints toolset, which cmd/ wires when the server is asked for
// it): one tool, sandbox_checkpoint, whose action makes, rolls back to,
// lists or deletes a sandbox's checkpoints; and open_sandbox takes from
// and count, which fork a sandbox or a checkpoint. Without the toolset
// neither is in tools/list, whose default stays within its budget
// (TestToolsListSize).

// The actions of sandbox_checkpoint.
const (
	actCheckpoint = "checkpoint"
	actRollback   = "rollback"
	actList       = "list"
	actDelete     = "delete"
)

// CheckpointIn is sandbox_checkpoint's input.
type CheckpointIn struct {
	Action    string `json:"action"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// Checkpoint names one: rollback's and delete's.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Name and Memory are checkpoint's.
	Name   string `json:"name,omitempty"`
	Memory bool   `json:"memory,omitempty"`
}

// CheckpointOut is a checkpoint as the tools show it.
type CheckpointOut struct {
	CheckpointID string    `json:"checkpoint_id"`
	Name         string    `json:"name,omitempty"`
	SandboxID    string    `json:"sandbox_id"`
	Bytes        int64     `json:"bytes"`
	CreatedAt    time.Time `json:"created_at"`
	Forks        []string  `json:"forks,omitempty"`
}

// CheckpointsOut is what sandbox_checkpoint did: the checkpoint made, the
// sandbox's checkpoints (list), or the sandbox rolled back.
type CheckpointsOut struct {
	Checkpoint  *CheckpointOut  `json:"checkpoint,omitempty"`
	Checkpoints []CheckpointOut `json:"checkpoints,omitzero"`
	Sandbox     *SandboxOut     `json:"sandbox,omitempty"`
	Deleted     bool            `json:"deleted,omitempty"`
}

func checkpointOf(c *delegate.Checkpoint) CheckpointOut {
	return CheckpointOut{CheckpointID: c.ID, Name: c.Name, SandboxID: c.SandboxID, Bytes: c.Bytes, CreatedAt: msec(c.CreatedAt), Forks: c.Forks}
}

func addCheckpointTool(ts *Tools, cs delegate.CheckpointService) {
	if cs == nil {
		return
	}
	h := &checkpointHandlers{svc: cs}
	addTool(ts, &mcp.Tool{
		Name: "sandbox_checkpoint",
		Description: "A kept sandbox's checkpoints (its files; processes go on, restart at a rollback): " +
			"checkpoint, rollback to one of its own, list, delete. Fork with open_sandbox from and count.",
		InputSchema:  checkpointSchema(),
		Annotations:  annotations(false, true, false, false),
		OutputSchema: outputSchema[CheckpointsOut](),
	}, h.checkpoint)
}

func checkpointSchema() *jsonschema.Schema {
	s := inputSchema[CheckpointIn]()
	describe(s, map[string]string{
		"checkpoint": "its id (ckp-…): rollback, delete",
		"name":       "checkpoint: a name of your own",
		"memory":     "checkpoint: keep memory too (refused where the backend cannot)",
	})
	oneOf(s, "action", actCheckpoint, actRollback, actList, actDelete)
	return s
}

type checkpointHandlers struct{ svc delegate.CheckpointService }

func (h *checkpointHandlers) checkpoint(ctx context.Context, _ *mcp.CallToolRequest, in *CheckpointIn) (CheckpointsOut, error) {
	for _, f := range []struct {
		name string
		set  bool
		ok   bool
	}{
		{"name", in.Name != "", in.Action == actCheckpoint},
		{"memory", in.Memory, in.Action == actCheckpoint},
		{"checkpoint", in.Checkpoint != "", in.Action == actRollback || in.Action == actDelete},
		{"sandbox_id", in.SandboxID != "", in.Action != actDelete},
	} {
		if f.set && !f.ok {
			return CheckpointsOut{}, &delegate.FieldError{Field: f.name, Rule: "is not for action " + in.Action}
		}
	}
	need := func(field, v, what string) error {
		if v == "" {
			return &delegate.FieldError{Field: field, Rule: "is required for action " + in.Action + ": " + what}
		}
		return nil
	}
	switch in.Action {
	case actCheckpoint:
		if err := need("sandbox_id", in.SandboxID, "the sandbox to checkpoint"); err != nil {
			return CheckpointsOut{}, err
		}
		cp, err := h.svc.CheckpointSandbox(ctx, in.SandboxID, delegate.CheckpointOptions{Name: in.Name, Memory: in.Memory})
		if err != nil {
			return CheckpointsOut{}, err
		}
		out := checkpointOf(cp)
		return CheckpointsOut{Checkpoint: &out}, nil
	case actRollback:
		if err := need("sandbox_id", in.SandboxID, "the sandbox to roll back"); err != nil {
			return CheckpointsOut{}, err
		}
		if err := need("checkpoint", in.Checkpoint, "one of the sandbox's checkpoints (action list)"); err != nil {
			return CheckpointsOut{}, err
		}
		sb, err := h.svc.RollbackSandbox(ctx, in.SandboxID, in.Checkpoint)
		if err != nil {
			return CheckpointsOut{}, err
		}
		out := sandboxOf(ctx, sb)
		return CheckpointsOut{Sandbox: &out}, nil
	case actList:
		if err := need("sandbox_id", in.SandboxID, "the sandbox whose checkpoints to list"); err != nil {
			return CheckpointsOut{}, err
		}
		list, err := h.svc.ListCheckpoints(ctx, in.SandboxID)
		if err != nil {
			return CheckpointsOut{}, err
		}
		out := CheckpointsOut{Checkpoints: make([]CheckpointOut, 0, len(list))}
		for i := range list {
			out.Checkpoints = append(out.Checkpoints, checkpointOf(&list[i]))
		}
		return out, nil
	case actDelete:
		if err := need("checkpoint", in.Checkpoint, "the checkpoint to delete"); err != nil {
			return CheckpointsOut{}, err
		}
		if err := h.svc.DeleteCheckpoint(ctx, in.Checkpoint); err != nil {
			return CheckpointsOut{}, err
		}
		return CheckpointsOut{Deleted: true}, nil
	}
	return CheckpointsOut{}, &delegate.FieldError{Field: "action", Rule: fmt.Sprintf("must be one of checkpoint, rollback, list, delete, not %q", in.Action)}
}

// ForkSandboxIn is open_sandbox's input where checkpoints are offered:
// from and count fork a sandbox or a checkpoint instead of opening an
// empty one (the other fields are then the source's).
type ForkSandboxIn struct {
	Resources   *delegate.Resources `json:"resources,omitempty"`
	VMTemplate  string              `json:"vmTemplate,omitempty"`
	Network     delegate.Network    `json:"network,omitempty"`
	IdleTimeout int                 `json:"idle_timeout,omitempty" delegate:"seconds"`
	Lifetime    int                 `json:"lifetime,omitempty" delegate:"seconds"`
	From        string              `json:"from,omitempty"`
	Count       int                 `json:"count,omitempty"`
}

// ForkSandboxOut is open_sandbox's output where checkpoints are offered:
// the sandbox opened, or the first fork and every fork.
type ForkSandboxOut struct {
	SandboxID string                `json:"sandbox_id"`
	State     delegate.SandboxState `json:"state"`
	ExpiresAt time.Time             `json:"expires_at"`
	Forks     []OpenSandboxOut      `json:"forks,omitempty"`
}

func forkSandboxSchema() *jsonschema.Schema {
	s := inputSchema[ForkSandboxIn]()
	open := openSandboxSchema()
	for k, v := range open.Properties {
		s.Properties[k] = v
	}
	describe(s, map[string]string{
		"from":  "fork: a sandbox_id (checkpointed for it) or a checkpoint id; the rest is the source's",
		"count": "forks to make (default 1)",
	})
	return s
}

func (h *checkpointHandlers) open(open func(context.Context, *mcp.CallToolRequest, *OpenSandboxIn) (OpenSandboxOut, error)) func(context.Context, *mcp.CallToolRequest, *ForkSandboxIn) (ForkSandboxOut, error) {
	return func(ctx context.Context, req *mcp.CallToolRequest, in *ForkSandboxIn) (ForkSandboxOut, error) {
		if in.From == "" {
			if in.Count != 0 {
				return ForkSandboxOut{}, &delegate.FieldError{Field: "count", Rule: "is for a fork only: give from too"}
			}
			o, err := open(ctx, req, &OpenSandboxIn{Resources: in.Resources, VMTemplate: in.VMTemplate, Network: in.Network,
				IdleTimeout: in.IdleTimeout, Lifetime: in.Lifetime})
			return ForkSandboxOut{SandboxID: o.SandboxID, State: o.State, ExpiresAt: o.ExpiresAt}, err
		}
		if in.Resources != nil || in.VMTemplate != "" || !in.Network.IsZero() || in.IdleTimeout != 0 || in.Lifetime != 0 {
			return ForkSandboxOut{}, &delegate.FieldError{Field: "from", Rule: "a fork has its source's resources, vmTemplate, network and timers: leave them out"}
		}
		count := in.Count
		if count == 0 {
			count = 1
		}
		made, err := h.svc.ForkSandbox(ctx, delegate.ForkSpec{From: in.From, Count: count})
		if err != nil {
			return ForkSandboxOut{}, err
		}
		var out ForkSandboxOut
		for _, sb := range made {
			out.Forks = append(out.Forks, OpenSandboxOut{SandboxID: sb.ID, State: sb.State, ExpiresAt: msec(sb.ExpiresAt)})
		}
		out.SandboxID, out.State, out.ExpiresAt = out.Forks[0].SandboxID, out.Forks[0].State, out.Forks[0].ExpiresAt
		return out, nil
	}
}
