package pve

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// TaskStatus is GET /nodes/{node}/tasks/{upid}/status. Proxmox sends no
// end time, and ExitStatus only once the task stopped.
type TaskStatus struct {
	UPID       string `json:"upid"`
	Node       string `json:"node"`
	PID        Int    `json:"pid"`
	PStart     Int    `json:"pstart"`
	StartTime  Int    `json:"starttime"`
	Type       string `json:"type"`
	ID         string `json:"id"`
	User       string `json:"user"`
	TokenID    string `json:"tokenid"`
	Status     string `json:"status"`     // running, stopped
	ExitStatus string `json:"exitstatus"` // OK, "WARNINGS: n", or the error
}

// Running reports whether the task has not ended yet.
func (t TaskStatus) Running() bool { return t.Status != "stopped" }

// OK reports whether a stopped task succeeded (warnings included).
func (t TaskStatus) OK() bool {
	return t.ExitStatus == "OK" || strings.HasPrefix(t.ExitStatus, "WARNINGS")
}

func taskPath(node, upid string) string {
	return "/nodes/" + url.PathEscape(node) + "/tasks/" + url.PathEscape(upid)
}

// taskNode is the node a task runs on: the one given, or the UPID's.
func taskNode(node, upid string) string {
	if node != "" {
		return node
	}
	if u, err := ParseUPID(upid); err == nil {
		return u.Node
	}
	return node
}

// TaskStatus reads a task's state. node may be "" (the UPID names it).
func (c *Client) TaskStatus(ctx context.Context, node, upid string) (TaskStatus, error) {
	var t TaskStatus
	_, err := c.get(ctx, taskPath(taskNode(node, upid), upid)+"/status", nil, &t)
	return t, err
}

// TaskLogLine is a line of a task's log (N counts from 1).
type TaskLogLine struct {
	N Int    `json:"n"`
	T string `json:"t"`
}

// TaskLog reads limit lines of a task's log from line start (0-based),
// and the log's total line count.
func (c *Client) TaskLog(ctx context.Context, node, upid string, start, limit int) ([]TaskLogLine, int, error) {
	var lines []TaskLogLine
	env, err := c.get(ctx, taskPath(taskNode(node, upid), upid)+"/log", params{"start": start, "limit": limit}, &lines)
	if err != nil {
		return nil, 0, err
	}
	return lines, int(env.Total), nil
}

// logTail is how many lines of a failed task's log a TaskError keeps.
const logTail = 20

// WaitTask polls a task until it stops. A task that ended with an exit
// status other than OK (or warnings) is a *TaskError carrying the tail of
// its log. An empty upid (an operation that finished at once) is done.
func (c *Client) WaitTask(ctx context.Context, node, upid string) error {
	return c.waitTask(ctx, node, upid, c.cfg.TaskPollInterval, true)
}

// WaitTaskEvery is WaitTask polling every interval, without backing off:
// for a short task whose end someone waits on (a NIC's unplug, a second
// or so), which WaitTask's growing waits (300 ms, then half as much
// more each time) would find done up to half its length late.
func (c *Client) WaitTaskEvery(ctx context.Context, node, upid string, every time.Duration) error {
	return c.waitTask(ctx, node, upid, every, false)
}

func (c *Client) waitTask(ctx context.Context, node, upid string, wait time.Duration, backOff bool) error {
	if upid == "" {
		return nil
	}
	node = taskNode(node, upid)
	for {
		st, err := c.TaskStatus(ctx, node, upid)
		if err != nil {
			return err
		}
		if !st.Running() {
			if st.OK() {
				return nil
			}
			te := &TaskError{UPID: upid, Type: st.Type, ID: st.ID, ExitStatus: st.ExitStatus}
			te.Log, _ = c.taskLogTail(ctx, node, upid)
			return te
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pve: waiting for task %s: %w", upid, ctx.Err())
		case <-t.C:
		}
		if backOff {
			wait = min(wait*3/2, 2*time.Second)
		}
	}
}

// taskLogTail reads the last lines of a task's log: the line count
// first, then the tail.
func (c *Client) taskLogTail(ctx context.Context, node, upid string) ([]string, error) {
	_, total, err := c.TaskLog(ctx, node, upid, 0, 1)
	if err != nil {
		return nil, err
	}
	lines, _, err := c.TaskLog(ctx, node, upid, max(0, total-logTail), logTail)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.T
	}
	return out, nil
}
