package pvesim

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	start, end time.Time
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

var upidRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$`)
})

// parseUPID is PVE::Tools::upid_decode.
func parseUPID(s string) (upid, error) {
	m := upidRe().FindStringSubmatch(s)
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
	t.end = time.Now()
	if err == nil {
		t.exitstatus = "OK"
		t.logf("TASK OK")
		return
	}
	msg := taskMessage(err)
	t.exitstatus = msg
	t.logf("TASK ERROR: %s", msg)
}

// taskMessage is how fork_worker reports a task's error (pve-common
// src/PVE/RESTEnvironment.pm): the error chomped, its newlines made
// spaces. A PVE::Exception (a permission or parameter error) reads as
// stringify makes it: its HTTP code first, then its parameter errors.
func taskMessage(err error) string {
	var msg string
	var ae *apiError
	var pe *ParamError
	switch {
	case errors.As(err, &pe):
		var b strings.Builder
		b.WriteString("400 Parameter verification failed.\n")
		for _, k := range sortedKeys(pe.Errors) {
			fmt.Fprintf(&b, "%s: %s\n", k, pe.Errors[k])
		}
		msg = b.String()
	case errors.As(err, &ae) && ae.code != 500:
		msg = fmt.Sprintf("%d %s", ae.code, ae.msg)
	case errors.As(err, &ae):
		msg = ae.msg
	default:
		msg = err.Error()
	}
	msg = strings.TrimSuffix(msg, "\n")
	return strings.ReplaceAll(msg, "\n", " ")
}

// taskWork is a task's body. It runs without s.mu held (it may wait on
// sandboxes) and takes the lock for what it changes.
type taskWork func(t *task) error

// taskSpec describes a worker task (PVE's fork_worker and the locks its
// code takes).
type taskSpec struct {
	node, typ, id string
	// locks are config locks taken, in order, when the task begins and
	// held until it ends (a clone's source and new VM, a start's VM...).
	locks []taskLock
	// begin runs with s.mu held once the locks are held, before the
	// task's time passes (a clone writes the new VM's config then).
	begin func(t *task) error
	// delay is the task's time; default Options.TaskDelay(s).
	delay *time.Duration
	// work runs after the delay, without s.mu held.
	work taskWork
	// undo, with s.mu held, removes what begin made when the task is
	// interrupted or fails by an injected fault.
	undo func()
}

// taskLock is a VM config lock a task holds.
type taskLock struct {
	vmid    int
	shared  bool
	timeout time.Duration
}

// startTask creates a task and runs it in the background: it takes its
// locks, runs begin, waits the task's time, then fails it if a fault is
// injected for its type (calling undo, so the request leaves no trace) or
// runs work. It returns the UPID. Call with s.mu held.
func (s *Server) startTask(c *call, node, typ, id string, work taskWork, undo func()) string {
	return s.runTask(c, taskSpec{node: node, typ: typ, id: id, work: work, undo: undo})
}

// runTask starts the task a spec describes and returns its UPID. Call
// with s.mu held.
func (s *Server) runTask(c *call, spec taskSpec) string {
	t := s.newTask(spec.node, spec.typ, spec.id, c.authid)
	delay := s.taskDelay(spec.typ)
	if spec.delay != nil {
		delay = *spec.delay
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var releases []func()
		unlock := func() {
			for i := len(releases) - 1; i >= 0; i-- {
				releases[i]()
			}
			releases = nil
		}
		defer unlock()
		// The worker's locks go when its code returns, before the task
		// is seen stopped.
		end := func(err error) {
			unlock()
			s.mu.Lock()
			t.finish(err)
			s.mu.Unlock()
		}
		for _, l := range spec.locks {
			release, err := s.lockConfig(s.ctx, spec.node, l.vmid, l.shared, l.timeout)
			if err != nil {
				end(err)
				return
			}
			releases = append(releases, release)
		}
		undo := func() {}
		if spec.begin != nil {
			s.mu.Lock()
			err := spec.begin(t)
			s.mu.Unlock()
			if err != nil {
				end(err)
				return
			}
		}
		if spec.undo != nil {
			undo = spec.undo
		}
		select {
		case <-time.After(delay):
		case <-s.ctx.Done():
			s.mu.Lock()
			undo()
			s.mu.Unlock()
			end(errors.New("interrupted by signal"))
			return
		}
		s.mu.Lock()
		if msg, ok := s.faults.TaskFailures[spec.typ]; ok {
			undo()
			s.mu.Unlock()
			end(errors.New(msg))
			return
		}
		s.mu.Unlock()
		end(spec.work(t))
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
	if !ownTask(t, c.authid) {
		if err := c.s.access.check(c.authid, "/nodes/"+c.str("node"), "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// ownTask is pve-manager PVE/API2/Tasks.pm $check_task_user: a token sees
// its own tasks, a user its own and its tokens'.
func ownTask(t *task, authid string) bool {
	owner, _, _ := strings.Cut(t.user, "!")
	return authid == t.user || authid == owner
}

// statusType is PVE::UPID::normalize_status_type.
func statusType(status string) string {
	switch {
	case status == "" || status == "unexpected status":
		return "unknown"
	case status == "OK":
		return "ok"
	case warningsRe().MatchString(status):
		return "warning"
	}
	return "error"
}

var warningsRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^WARNINGS: \d+$`) })

// GET /nodes/{node}/tasks (pve-manager PVE/API2/Tasks.pm node_tasks): by
// default the node's finished tasks ("archive"), the last ended first;
// "active" lists the running ones (status RUNNING), "all" both. Without
// Sys.Audit on the node a caller sees only its own tasks. Filters: user
// (a case-blind substring), type, vmid, errors, since/until (start
// time), status types; start and limit page through what matches, and
// total counts it.
func hTaskList(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	node := c.str("node")
	start, limit := c.intOr("start", 0), c.intOr("limit", 50)
	source := c.str("source")
	if source == "" {
		source = "archive"
	}
	types := map[string]bool{"ok": true, "warning": true, "error": true, "unknown": true}
	errorsOnly := c.boolOr("errors", false)
	if c.has("statusfilter") && !errorsOnly {
		types = map[string]bool{}
		for _, f := range splitList(c.str("statusfilter")) {
			types[strings.ToLower(f)] = true
		}
	} else if errorsOnly {
		types["ok"] = false
	}
	auditor := s.access.check(c.authid, "/nodes/"+node, "Sys.Audit") == nil
	var active, archived []*task
	for _, t := range s.tasks {
		if t.node != node {
			continue
		}
		if t.status == "stopped" {
			archived = append(archived, t)
		} else {
			active = append(active, t)
		}
	}
	slices.SortFunc(active, func(a, b *task) int { return cmp.Or(b.start.Compare(a.start), cmp.Compare(b.pid, a.pid)) })
	slices.SortFunc(archived, func(a, b *task) int {
		return cmp.Or(b.end.Compare(a.end), b.start.Compare(a.start), cmp.Compare(b.pid, a.pid))
	})
	count := 0
	out := []map[string]any{}
	keep := func(t *task, status string) bool {
		if f := c.str("userfilter"); f != "" && !strings.Contains(strings.ToLower(t.user), strings.ToLower(f)) {
			return false
		}
		if !auditor && !ownTask(t, c.authid) {
			return false
		}
		if f := c.str("typefilter"); f != "" && t.typ != f {
			return false
		}
		if c.has("vmid") && t.id != c.str("vmid") {
			return false
		}
		if c.has("since") && t.start.Unix() < int64(c.int("since")) {
			return false
		}
		if c.has("until") && t.start.Unix() > int64(c.int("until")) {
			return false
		}
		if !types[statusType(status)] {
			return false
		}
		count++
		return count > start && len(out) < limit
	}
	entry := func(t *task) map[string]any {
		e := map[string]any{"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstrt,
			"starttime": t.start.Unix(), "type": t.typ, "id": t.id}
		user, token, isToken := strings.Cut(t.user, "!")
		e["user"] = user
		if isToken {
			e["tokenid"] = token
		}
		return e
	}
	if source == "active" || source == "all" {
		for _, t := range active {
			if keep(t, "") {
				e := entry(t)
				e["status"] = "RUNNING"
				out = append(out, e)
			}
		}
	}
	if source != "active" {
		for _, t := range archived {
			if keep(t, t.exitstatus) {
				e := entry(t)
				e["endtime"], e["status"] = t.end.Unix(), t.exitstatus
				out = append(out, e)
			}
		}
	}
	c.total, c.totalSet = count, true
	return out, nil
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
