package pvesim

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// task is a worker task (PVE's fork_worker): it has a UPID, runs for a
// while, and ends with exitstatus "OK" or an error text.
type task struct {
	upid       string
	node       string
	typ        string
	id         string
	user       string // user@realm!token for a token
	pid, pstrt int
	start      time.Time
	status     string // running, stopped
	exitstatus string
	log        []string
}

// Task is a task as tests see it.
type Task struct {
	UPID       string
	Node       string
	Type       string
	ID         string
	Status     string // running, stopped
	ExitStatus string // "" while running
	Log        []string
}

// Tasks lists every task, oldest first.
func (s *Server) Tasks() []Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Task
	for _, t := range s.tasks {
		out = append(out, Task{UPID: t.upid, Node: t.node, Type: t.typ, ID: t.id, Status: t.status,
			ExitStatus: t.exitstatus, Log: append([]string(nil), t.log...)})
	}
	slices.SortFunc(out, func(a, b Task) int {
		ua, _ := parseUPID(a.UPID)
		ub, _ := parseUPID(b.UPID)
		return cmp.Or(cmp.Compare(ua.start, ub.start), cmp.Compare(ua.pid, ub.pid))
	})
	return out
}

type upid struct {
	node         string
	pid, pstart  int
	start        int64
	typ, id, usr string
}

var upidRe = regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$`)

// parseUPID is PVE::Tools::upid_decode.
func parseUPID(s string) (upid, error) {
	m := upidRe.FindStringSubmatch(s)
	if m == nil {
		return upid{}, fmt.Errorf("unable to parse worker upid '%s'", s)
	}
	pid, _ := strconv.ParseInt(m[3], 16, 64)
	pstart, _ := strconv.ParseInt(m[4], 16, 64)
	start, _ := strconv.ParseInt(m[5], 16, 64)
	return upid{node: m[1], pid: int(pid), pstart: int(pstart), start: start, typ: m[6], id: m[7], usr: m[8]}, nil
}

// newTask registers a running task. Call with s.mu held.
func (s *Server) newTask(node, typ, id, user string) *task {
	s.pidSeq += 1 + s.rng.IntN(7)
	n := s.node(node)
	t := &task{
		node: node, typ: typ, id: id, user: user, pid: s.pidSeq,
		pstrt: int(time.Since(n.started)/(10*time.Millisecond)) + 4_000_000, // clock ticks since boot
		start: time.Now(), status: "running",
	}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", node, t.pid, t.pstrt, t.start.Unix(), typ, id, user)
	s.tasks[t.upid] = t
	return t
}

// logf adds a line to a task's log. Call with s.mu held.
func (t *task) logf(format string, args ...any) {
	t.log = append(t.log, fmt.Sprintf(format, args...))
}

// finish ends a task. Call with s.mu held.
func (t *task) finish(err error) {
	if t.status == "stopped" {
		return
	}
	t.status = "stopped"
	if err == nil {
		t.exitstatus = "OK"
		t.logf("TASK OK")
		return
	}
	msg := strings.TrimSuffix(err.Error(), "\n")
	t.exitstatus = msg
	t.logf("TASK ERROR: %s", msg)
}

// taskWork is a task's body. It runs without s.mu held (it may wait on
// sandboxes) and takes the lock for what it changes.
type taskWork func(t *task) error

// startTask creates a task and runs it in the background: it waits the
// task's delay, then fails it if a fault is injected for its type
// (calling undo, with s.mu held, so the request leaves no trace) or runs
// work. It returns the UPID. Call with s.mu held.
func (s *Server) startTask(c *call, node, typ, id string, work taskWork, undo func()) string {
	t := s.newTask(node, typ, id, c.token.ID)
	delay := s.taskDelay(typ)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-time.After(delay):
		case <-s.ctx.Done():
			s.mu.Lock()
			if undo != nil {
				undo()
			}
			t.finish(errors.New("interrupted by signal"))
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if msg, ok := s.faults.TaskFailures[typ]; ok {
			if undo != nil {
				undo()
			}
			t.finish(errors.New(msg))
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		err := work(t)
		s.mu.Lock()
		t.finish(err)
		s.mu.Unlock()
	}()
	return t.upid
}

// findTask resolves the upid parameter of the task calls.
func (c *call) findTask() (*task, error) {
	raw := c.str("upid")
	u, err := parseUPID(raw)
	if err != nil {
		return nil, paramErr("upid", err.Error())
	}
	t, ok := c.s.tasks[raw]
	if !ok || u.node != c.str("node") {
		return nil, paramErr("upid", "no such task")
	}
	// Others' tasks need Sys.Audit on the node.
	if t.user != c.token.ID && !c.token.has("Sys.Audit") {
		return nil, permErr("/nodes/" + t.node + ", Sys.Audit")
	}
	return t, nil
}

// GET /nodes/{node}/tasks/{upid}/status: no endtime, and exitstatus only
// once stopped, like the real thing.
func hTaskStatus(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	t, err := c.findTask()
	if err != nil {
		return nil, err
	}
	res := map[string]any{
		"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstrt,
		"starttime": t.start.Unix(), "type": t.typ, "id": t.id, "status": t.status,
	}
	user, tokenName, isToken := strings.Cut(t.user, "!")
	res["user"] = user
	if isToken {
		res["tokenid"] = tokenName
	}
	if t.status == "stopped" {
		res["exitstatus"] = t.exitstatus
	}
	return res, nil
}

// GET /nodes/{node}/tasks/{upid}/log: lines n (from 1) and t, with the
// line count as the envelope's total.
func hTaskLog(c *call) (any, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	t, err := c.findTask()
	if err != nil {
		return nil, err
	}
	start, limit := c.intOr("start", 0), c.intOr("limit", 50)
	log := t.log
	if len(log) == 0 {
		log = []string{"no content"} // what PVE shows for an empty log
	}
	lines := []map[string]any{}
	for i := start; i < len(log) && i < start+limit; i++ {
		lines = append(lines, map[string]any{"n": i + 1, "t": log[i]})
	}
	c.total = len(log)
	return lines, nil
}
