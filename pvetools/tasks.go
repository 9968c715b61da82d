package pvetools

import (
	"context"

	"github.com/delegate-dev/delegate/pve"
)

// NodeTaskIn selects tasks of a node, or one task.
type NodeTaskIn struct {
	Node       string `json:"node"`
	Action     string `json:"action" jsonschema:"list, status or log"`
	UPID       string `json:"upid,omitempty" jsonschema:"status, log"`
	Start      int    `json:"start,omitempty" jsonschema:"skip this many"`
	Limit      int    `json:"limit,omitempty" jsonschema:"default 50, max 1000"`
	Source     string `json:"source,omitempty" jsonschema:"list: archive, active, all (default)"`
	TypeFilter string `json:"typefilter,omitempty" jsonschema:"list: e.g. qmstart"`
	VMID       int    `json:"vmid,omitempty" jsonschema:"list: this guest's"`
}

// NodeTaskOut answers each action: list fills Tasks and Total, status the
// task's fields, log Lines and Total.
type NodeTaskOut struct {
	Tasks      []TaskEntry `json:"tasks,omitempty"`
	Total      int         `json:"total,omitempty"`
	UPID       string      `json:"upid,omitempty"`
	Type       string      `json:"type,omitempty"`
	ID         string      `json:"id,omitempty"`
	User       string      `json:"user,omitempty"`
	Status     string      `json:"status,omitempty"`
	ExitStatus string      `json:"exitstatus,omitempty"`
	StartTime  int64       `json:"starttime,omitempty"`
	Lines      []string    `json:"lines,omitempty"`
}

// TaskEntry is a task in a list.
type TaskEntry struct {
	UPID      string `json:"upid"`
	Type      string `json:"type"`
	ID        string `json:"id,omitempty"`
	User      string `json:"user"`
	Status    string `json:"status"`
	StartTime int64  `json:"starttime"`
	EndTime   int64  `json:"endtime,omitempty"`
}

func (t *tools) nodeTask(ctx context.Context, in *NodeTaskIn) (NodeTaskOut, error) {
	if err := checkNode(in.Node, false); err != nil {
		return NodeTaskOut{}, err
	}
	if in.Start < 0 {
		return NodeTaskOut{}, argErr("start", "must not be negative (got %d)", in.Start)
	}
	if in.Limit < 0 || in.Limit > 1000 {
		return NodeTaskOut{}, argErr("limit", "must be from 1 to 1000 (got %d)", in.Limit)
	}
	limit := in.Limit
	if limit == 0 {
		limit = 50
	}
	switch in.Action {
	case "list":
		switch in.Source {
		case "":
			in.Source = "all"
		case "archive", "active", "all":
		default:
			return NodeTaskOut{}, argErr("source", "must be archive, active or all (got %q)", in.Source)
		}
		if in.VMID != 0 {
			if err := checkVMID("vmid", in.VMID); err != nil {
				return NodeTaskOut{}, err
			}
		}
		tasks, total, err := t.c.NodeTasks(ctx, in.Node, pve.TaskListOptions{Source: in.Source, Start: in.Start, Limit: limit,
			TypeFilter: in.TypeFilter, VMID: in.VMID})
		if err != nil {
			return NodeTaskOut{}, proxmoxError(err)
		}
		out := NodeTaskOut{Tasks: []TaskEntry{}, Total: total}
		for _, e := range tasks {
			user := e.User
			if e.TokenID != "" {
				user += "!" + e.TokenID
			}
			out.Tasks = append(out.Tasks, TaskEntry{UPID: e.UPID, Type: e.Type, ID: e.ID, User: user, Status: e.Status,
				StartTime: int64(e.StartTime), EndTime: int64(e.EndTime)})
		}
		return out, nil
	case "status", "log":
		if in.UPID == "" {
			return NodeTaskOut{}, argErr("upid", "required for action %s (list gives the upids)", in.Action)
		}
		if _, err := pve.ParseUPID(in.UPID); err != nil {
			return NodeTaskOut{}, argErr("upid", "is not a task id like UPID:pve1:0000A1B2:...: (got %q)", in.UPID)
		}
		if in.Action == "status" {
			st, err := t.c.TaskStatus(ctx, in.Node, in.UPID)
			if err != nil {
				return NodeTaskOut{}, proxmoxError(err)
			}
			user := st.User
			if st.TokenID != "" {
				user += "!" + st.TokenID
			}
			return NodeTaskOut{UPID: st.UPID, Type: st.Type, ID: st.ID, User: user, Status: st.Status,
				ExitStatus: st.ExitStatus, StartTime: int64(st.StartTime)}, nil
		}
		lines, total, err := t.c.TaskLog(ctx, in.Node, in.UPID, in.Start, limit)
		if err != nil {
			return NodeTaskOut{}, proxmoxError(err)
		}
		out := NodeTaskOut{UPID: in.UPID, Total: total, Lines: []string{}}
		for _, l := range lines {
			out.Lines = append(out.Lines, l.T)
		}
		return out, nil
	}
	return NodeTaskOut{}, argErr("action", "must be list, status or log (got %q)", in.Action)
}

// SnapshotIn is a snapshot action.
type SnapshotIn struct {
	Node        string `json:"node"`
	VMID        int    `json:"vmid"`
	Action      string `json:"action" jsonschema:"list, create, rollback or delete"`
	SnapName    string `json:"snapname,omitempty" jsonschema:"letter, then letters, digits, _ or -"`
	Description string `json:"description,omitempty" jsonschema:"create"`
	VMState     bool   `json:"vmstate,omitempty" jsonschema:"create: also save the RAM"`
	Force       bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

// SnapshotOut answers list (Snapshots, Parent: the one the VM is based
// on) and the other actions (the task).
type SnapshotOut struct {
	Snapshots []SnapshotEntry `json:"snapshots,omitempty"`
	Parent    string          `json:"parent,omitempty"`
	UPID      string          `json:"upid,omitempty"`
	Status    string          `json:"status,omitempty"`
	// ExitStatus is the task's, when it ended in time.
	ExitStatus string `json:"exitstatus,omitempty"`
}

// SnapshotEntry is a snapshot.
type SnapshotEntry struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Parent      string `json:"parent,omitempty"`
	SnapTime    int64  `json:"snaptime"`
	VMState     bool   `json:"vmstate,omitempty"`
}

func (t *tools) snapshot(ctx context.Context, in *SnapshotIn) (SnapshotOut, error) {
	deadline := t.deadline()
	g := &Guest{Node: in.Node, VMID: in.VMID}
	if in.Action == "list" {
		if _, err := g.check(); err != nil {
			return SnapshotOut{}, err
		}
		snaps, err := t.c.Snapshots(ctx, in.Node, in.VMID)
		if err != nil {
			return SnapshotOut{}, proxmoxError(err)
		}
		out := SnapshotOut{Snapshots: []SnapshotEntry{}}
		for _, s := range snaps {
			if s.Name == "current" {
				out.Parent = s.Parent
				continue
			}
			out.Snapshots = append(out.Snapshots, SnapshotEntry{Name: s.Name, Description: s.Description, Parent: s.Parent,
				SnapTime: int64(s.SnapTime), VMState: bool(s.VMState)})
		}
		return out, nil
	}
	switch in.Action {
	case "create", "rollback", "delete":
	default:
		return SnapshotOut{}, argErr("action", "must be list, create, rollback or delete (got %q)", in.Action)
	}
	what := map[string]string{"create": "snapshotting it", "rollback": "rolling it back", "delete": "deleting its snapshot"}[in.Action]
	if _, err := t.prepare(ctx, g, in.Force, what); err != nil {
		return SnapshotOut{}, err
	}
	if in.SnapName == "" {
		return SnapshotOut{}, argErr("snapname", "required for action %s", in.Action)
	}
	var upid string
	var err error
	switch in.Action {
	case "create":
		upid, err = t.c.CreateSnapshot(ctx, in.Node, in.VMID, in.SnapName, in.Description, in.VMState)
	case "rollback":
		upid, err = t.c.RollbackSnapshot(ctx, in.Node, in.VMID, in.SnapName, false)
	case "delete":
		upid, err = t.c.DeleteSnapshot(ctx, in.Node, in.VMID, in.SnapName)
	}
	task, err := t.started(ctx, in.Node, upid, err, deadline)
	if err != nil {
		return SnapshotOut{}, err
	}
	return SnapshotOut{UPID: task.UPID, Status: task.Status, ExitStatus: task.ExitStatus}, nil
}
