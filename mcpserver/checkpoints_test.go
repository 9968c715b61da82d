package mcpserver_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeCheckpoints records what the checkpoint tools asked.
type fakeCheckpoints struct {
	fork     delegate.ForkSpec
	rollback [2]string
	deleted  string
	opts     delegate.CheckpointOptions
}

func (f *fakeCheckpoints) CheckpointSandbox(ctx context.Context, id string, opts delegate.CheckpointOptions) (*delegate.Checkpoint, error) {
	f.opts = opts
	return &delegate.Checkpoint{ID: delegate.CheckpointID(id, 1), Name: opts.Name, SandboxID: id, Bytes: 42, CreatedAt: t0}, nil
}
func (f *fakeCheckpoints) RollbackSandbox(ctx context.Context, id, cp string) (*delegate.Sandbox, error) {
	f.rollback = [2]string{id, cp}
	return keptSandbox(id), nil
}
func (f *fakeCheckpoints) ListCheckpoints(ctx context.Context, id string) ([]delegate.Checkpoint, error) {
	return []delegate.Checkpoint{{ID: delegate.CheckpointID(id, 1), SandboxID: id, CreatedAt: t0, Forks: []string{"sbx-f1"}}}, nil
}
func (f *fakeCheckpoints) DeleteCheckpoint(ctx context.Context, cp string) error {
	f.deleted = cp
	return nil
}
func (f *fakeCheckpoints) ForkSandbox(ctx context.Context, spec delegate.ForkSpec) ([]delegate.Sandbox, error) {
	f.fork = spec
	var out []delegate.Sandbox
	for i := range spec.Count {
		out = append(out, *keptSandbox("sbx-f" + string(rune('1'+i))))
	}
	return out, nil
}

// TestCheckpointToolset: with checkpoints offered, open_sandbox forks
// (from, count) and sandbox_checkpoint's actions reach the service,
// arguments of another action refused by name; without them, neither is
// in tools/list (TestToolsListSize holds the default's size).
func TestCheckpointToolset(t *testing.T) {
	fc := &fakeCheckpoints{}
	cs := connect(t, struct {
		*service
		*fakeCheckpoints
	}{fullService(), fc}, nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "open_sandbox" })
	schema, _ := json.Marshal(tools.Tools[i].InputSchema)
	if !strings.Contains(string(schema), `"from"`) || !strings.Contains(string(schema), `"count"`) ||
		!slices.ContainsFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "sandbox_checkpoint" }) {
		t.Fatalf("open_sandbox's schema %s; tools %d", schema, len(tools.Tools))
	}

	var forked mcpserver.ForkSandboxOut
	structured(t, call(t, cs, "open_sandbox", map[string]any{"from": "sbx-a", "count": 2}), &forked)
	if fc.fork != (delegate.ForkSpec{From: "sbx-a", Count: 2}) || len(forked.Forks) != 2 || forked.SandboxID != "sbx-f1" {
		t.Errorf("fork: asked %+v, got %+v", fc.fork, forked)
	}
	if res := call(t, cs, "open_sandbox", map[string]any{"from": "sbx-a", "lifetime": 60}); !res.IsError || !strings.Contains(errorText(res), "from") {
		t.Errorf("a fork with a lifetime of its own: %s", errorText(res))
	}

	var out mcpserver.CheckpointsOut
	structured(t, call(t, cs, "sandbox_checkpoint", map[string]any{"action": "checkpoint", "sandbox_id": "sbx-a", "name": "deps"}), &out)
	if out.Checkpoint == nil || out.Checkpoint.CheckpointID != "ckp-a.1" || fc.opts.Name != "deps" {
		t.Errorf("checkpoint: %+v", out)
	}
	structured(t, call(t, cs, "sandbox_checkpoint", map[string]any{"action": "rollback", "sandbox_id": "sbx-a", "checkpoint": "ckp-a.1"}), &out)
	if fc.rollback != [2]string{"sbx-a", "ckp-a.1"} || out.Sandbox == nil {
		t.Errorf("rollback: %v %+v", fc.rollback, out)
	}
	out = mcpserver.CheckpointsOut{}
	structured(t, call(t, cs, "sandbox_checkpoint", map[string]any{"action": "list", "sandbox_id": "sbx-a"}), &out)
	if len(out.Checkpoints) != 1 || out.Checkpoints[0].Forks[0] != "sbx-f1" {
		t.Errorf("list: %+v", out)
	}
	structured(t, call(t, cs, "sandbox_checkpoint", map[string]any{"action": "delete", "checkpoint": "ckp-a.1"}), &out)
	if fc.deleted != "ckp-a.1" || !out.Deleted {
		t.Errorf("delete: %q %+v", fc.deleted, out)
	}
	for _, c := range []struct {
		args  map[string]any
		field string
	}{
		{map[string]any{"action": "rollback", "sandbox_id": "sbx-a"}, "checkpoint"},
		{map[string]any{"action": "list", "sandbox_id": "sbx-a", "name": "x"}, "name"},
		{map[string]any{"action": "delete", "checkpoint": "ckp-a.1", "sandbox_id": "sbx-a"}, "sandbox_id"},
	} {
		if res := call(t, cs, "sandbox_checkpoint", c.args); !res.IsError || !strings.Contains(errorText(res), c.field) {
			t.Errorf("%v: %s, want an error naming %s", c.args, errorText(res), c.field)
		}
	}
}
