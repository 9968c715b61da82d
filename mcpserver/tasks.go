package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Jobs as MCP Tasks: the Tasks extension (io.modelcontextprotocol/tasks,
// SEP-2663, protocol 2026-07-28). A client that declares the extension in
// a tools/call's _meta gets, for submit_job, a task instead of a job id:
// the task's id is the job's, so the job store (durable, written before
// Submit returns) is the task store, and a task outlives the client's
// connection and a restart of the server. The client then follows the
// task with tasks/get, which carries get_job_result's answer inline once
// the job has ended, and may end it with tasks/cancel. A job waiting for
// a person's answer (the root's question.go) makes its task
// input_required: its open questions are the task's inputRequests, each
// an elicitation in form mode keyed by the question's id, which the
// client answers with tasks/update. A client that does not declare the
// extension gets today's answers (and the questions through wait_job and
// answer_job, questions.go).
//
// The Go SDK (v1.8.0) has no Tasks types: the extension is advertised with
// ServerCapabilities.AddExtension, the task answer to tools/call is made
// in a receiving middleware, and tasks/* are custom methods. Status
// notifications (notifications/tasks through subscriptions/listen) need
// the SDK's listen stream, which only carries the SDK's own notifications
// (list changes, resource updates): clients follow pollIntervalMs instead.

// TasksExtension is the Tasks extension's identifier.
const TasksExtension = "io.modelcontextprotocol/tasks"

// modernProtocol is the first protocol version whose requests carry their
// client's capabilities (and so can declare the extension), served
// statelessly over HTTP.
const modernProtocol = "2026-07-28"

// The task statuses of SEP-2663 that a job takes. "failed" is not made:
// it is for a call that failed as a JSON-RPC call, which a submitted job
// never does.
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskCancelled     = "cancelled"
)

// Task is a job seen as a task (SEP-2663's DetailedTask).
type Task struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTLMs is null: delegate keeps a job until it is deleted.
	TTLMs          *int64 `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs,omitempty"`
	// Result is the CallToolResult of a completed task.
	Result json.RawMessage `json:"result,omitempty"`
	// InputRequests are the questions an input_required task waits for,
	// by question id: each an elicitation (questions.go).
	InputRequests map[string]inputRequest `json:"inputRequests,omitempty"`
}

// taskResult answers tools/call (resultType "task": a CreateTaskResult)
// and tasks/get (resultType "complete").
type taskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	Task
}

// ackResult is the empty acknowledgement of tasks/cancel and tasks/update.
type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

// taskParams are the params of tasks/get and tasks/cancel.
type taskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
}

// updateParams are the params of tasks/update.
type updateParams struct {
	mcp.ParamsBase
	TaskID         string                     `json:"taskId"`
	InputResponses map[string]json.RawMessage `json:"inputResponses"`
}

type tasks struct {
	log *slog.Logger
	svc delegate.JobService
	qs  delegate.QuestionService // nil: a service that takes no questions
	h   *handlers
	now func() time.Time
}

// addTasks serves the extension (capabilities advertises it).
func addTasks(s *mcp.Server, h *handlers, log *slog.Logger) {
	t := &tasks{log: log, svc: h.svc, qs: h.qs, h: h, now: time.Now}
	s.AddReceivingMiddleware(t.middleware)
	// The names are not standard methods of the SDK, so these cannot fail.
	must(mcp.AddReceivingCustomMethod(s, "tasks/get", t.get))
	must(mcp.AddReceivingCustomMethod(s, "tasks/cancel", t.cancel))
	must(mcp.AddReceivingCustomMethod(s, "tasks/update", t.update))
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// declaresTasks reports whether a request's _meta declares the Tasks
// extension among its client's capabilities, on a protocol that has
// per-request capabilities. The SDK's ClientCapabilities does not keep
// extensions, so the raw _meta is read.
func declaresTasks(meta map[string]any) bool {
	if v, _ := meta[mcp.MetaKeyProtocolVersion].(string); v < modernProtocol {
		return false
	}
	caps, _ := meta[mcp.MetaKeyClientCapabilities].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	_, ok := ext[TasksExtension].(map[string]any)
	return ok
}

// middleware answers a submit_job whose request declares the extension
// with a task. The tool itself runs as for every client (its arguments
// decoded and checked, the job stored): a call it refuses is answered
// with its error at once, as the specification lets a server decide per
// call, and no task is made.
func (t *tasks) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || call.Params == nil || call.Params.Name != "submit_job" || !declaresTasks(call.Params.Meta) {
			return next(ctx, method, req)
		}
		res, err := next(ctx, method, req)
		out, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok || out.IsError {
			return res, err
		}
		var sub SubmitOut
		raw, _ := out.StructuredContent.(json.RawMessage)
		if err := json.Unmarshal(raw, &sub); err != nil {
			return nil, taskError(ctx, t.log, "Failed to create task", "", fmt.Errorf("reading the submission: %w", err))
		}
		// The job is stored: tasks/get on its id answers from now on.
		j, err := t.svc.Get(ctx, sub.JobID)
		if err != nil {
			return nil, taskError(ctx, t.log, "Failed to create task", sub.JobID, err)
		}
		task := t.seed(j)
		return &taskResult{ResultType: "task", Task: task}, nil
	}
}

// seed is the task a job is as it is created: its status without a result
// (a CreateTaskResult carries none; the client asks tasks/get).
func (t *tasks) seed(j *delegate.Job) Task {
	task := t.base(j)
	switch {
	case j.Status == delegate.StatusCancelled:
		task.Status = taskCancelled
	case j.Status.Terminal():
		task.Status = taskCompleted
	default:
		task.Status = taskWorking
	}
	return task
}

// base is what every view of a job as a task has.
func (t *tasks) base(j *delegate.Job) Task {
	return Task{
		TaskID: j.ID, StatusMessage: statusMessage(j),
		CreatedAt: isoTime(j.CreatedAt), LastUpdatedAt: isoTime(lastUpdated(j)),
		PollIntervalMs: pollInterval(j, t.now()).Milliseconds(),
	}
}

func lastUpdated(j *delegate.Job) time.Time {
	if j.UpdatedAt.IsZero() {
		return j.CreatedAt
	}
	return j.UpdatedAt
}

func isoTime(t time.Time) string { return msec(t).UTC().Format(time.RFC3339Nano) }

// statusMessage is the job's status and its latest progress ("running:
// step 2/3"), or why it ended.
func statusMessage(j *delegate.Job) string {
	msg := string(j.Status)
	if j.Status.Terminal() {
		if j.Error != "" {
			msg += ": " + j.Error
		}
		return msg
	}
	if p := newsOf(j); p != "" {
		msg += ": " + p
	}
	return msg
}

// Poll intervals: the client SHOULD wait this long before the next
// tasks/get. Short while a job waits for a place or a sandbox (on Proxmox
// a warm clone is ready in about a second, a cold one in about 20 s), then
// growing with the job's age, a quarter of it, so that a 5 s job is seen
// to end within about a second and a 2-minute one costs some twenty polls,
// not a hundred; never past the job's deadline.
const (
	minPoll          = 500 * time.Millisecond
	maxProvisionPoll = 2 * time.Second
	maxPoll          = 30 * time.Second
)

func pollInterval(j *delegate.Job, now time.Time) time.Duration {
	if j.Status.Terminal() {
		return 0 // nothing left to poll for: omitted
	}
	d := min(max(now.Sub(j.CreatedAt)/4, minPoll), maxPoll)
	switch j.Status {
	case delegate.StatusPending, delegate.StatusProvisioning:
		d = min(d, maxProvisionPoll)
	case delegate.StatusRunning:
		if !j.StartedAt.IsZero() {
			deadline := j.StartedAt.Add(time.Duration(j.Manifest.TimeoutSeconds()) * time.Second)
			d = min(d, max(deadline.Sub(now), minPoll))
		}
	}
	return d.Round(time.Millisecond)
}

// errTaskNotFound is SEP-2663's error for an id that is no task.
func errTaskNotFound(id string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Failed to retrieve task: Task not found (no job %q)", id)}
}

// errNoTasks answers a tasks/* request from a client that did not declare
// the extension (SEP-2663: MUST be -32021, naming the capability).
func errNoTasks() error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{TasksExtension: map[string]any{}}}})
	return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Message: "Missing required client capability: " + TasksExtension, Data: data}
}

// job reads the job a tasks/* request names, with the errors the
// specification gives.
func (t *tasks) job(ctx context.Context, meta map[string]any, id string) (*delegate.Job, error) {
	if !declaresTasks(meta) {
		return nil, errNoTasks()
	}
	if id == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "taskId: required (the taskId of a task submit_job made)"}
	}
	j, err := t.svc.Get(ctx, id)
	if err != nil {
		return nil, taskError(ctx, t.log, "Failed to retrieve task", id, err)
	}
	return j, nil
}

// get answers tasks/get: working while the job is pending, provisioning or
// running; input_required while it runs and waits for answers; completed, with get_job_result's answer inline (isError when
// the job failed or timed out), once it has ended; cancelled. failed is
// for a call that failed as a JSON-RPC call, which a submitted job never
// does: everything a job can end with is a tool result.
func (t *tasks) get(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*taskResult, error) {
	j, err := t.job(ctx, p.Meta, p.TaskID)
	if err != nil {
		return nil, err
	}
	task, err := t.detailed(ctx, j)
	if err != nil {
		return nil, err
	}
	return &taskResult{ResultType: "complete", Task: task}, nil
}

// detailed is a job as tasks/get shows it.
func (t *tasks) detailed(ctx context.Context, j *delegate.Job) (Task, error) {
	task := t.seed(j)
	if task.Status == taskWorking {
		return t.withQuestions(ctx, j, task)
	}
	if task.Status != taskCompleted {
		return task, nil
	}
	out, err := t.h.result(ctx, nil, &ResultIn{JobID: j.ID})
	if err != nil {
		return Task{}, taskError(ctx, t.log, "Failed to retrieve task: reading the job's result", j.ID, err)
	}
	res, err := toolResult(out, j.Status != delegate.StatusSuccess)
	if err != nil {
		return Task{}, taskError(ctx, t.log, "Failed to retrieve task", j.ID, err)
	}
	task.Result = res
	return task, nil
}

// toolResult is a CallToolResult as the task's result, in the shape
// addTool gives every tool's answer (the JSON as structured content and as
// text), with the resultType that 2026-07-28 results carry.
func toolResult(out any, isError bool) (json.RawMessage, error) {
	data, err := encode(out)
	if err != nil {
		return nil, fmt.Errorf("encoding the task's result: %w", err)
	}
	return encode(struct {
		ResultType        string             `json:"resultType"`
		Content           []*mcp.TextContent `json:"content"`
		StructuredContent json.RawMessage    `json:"structuredContent"`
		IsError           bool               `json:"isError,omitempty"`
	}{"complete", []*mcp.TextContent{{Text: string(data)}}, data, isError})
}

// cancel answers tasks/cancel as cancel_job does: cooperatively, and an
// ended job stays as it ended.
func (t *tasks) cancel(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*ackResult, error) {
	if _, err := t.job(ctx, p.Meta, p.TaskID); err != nil {
		return nil, err
	}
	if _, _, err := t.svc.Cancel(ctx, p.TaskID); err != nil {
		return nil, taskError(ctx, t.log, "Failed to cancel task", p.TaskID, err)
	}
	return &ackResult{ResultType: "complete"}, nil
}

// inputRequest is an open question as an input request: an elicitation
// in form mode. It is the same on every poll while the question is open
// (a requester tells questions apart by their ids and contents).
type inputRequest struct {
	Method string             `json:"method"`
	Params elicitationRequest `json:"params"`
}

type elicitationRequest struct {
	Mode            string        `json:"mode"`
	Message         string        `json:"message"`
	RequestedSchema delegate.Form `json:"requestedSchema"`
}

// withQuestions makes a running job that waits for answers
// input_required, its open questions the input requests.
func (t *tasks) withQuestions(ctx context.Context, j *delegate.Job, task Task) (Task, error) {
	if t.qs == nil || j.Status != delegate.StatusRunning {
		return task, nil
	}
	qs, err := t.qs.Questions(ctx, j.ID)
	if err != nil {
		return Task{}, taskError(ctx, t.log, "Failed to retrieve task: reading the job's questions", j.ID, err)
	}
	for _, q := range qs {
		if q.State != delegate.QuestionOpen {
			continue
		}
		if task.InputRequests == nil {
			task.InputRequests = map[string]inputRequest{}
			task.Status = taskInputRequired
			task.StatusMessage = "waiting for an answer: " + clipRunes(q.Message, 200)
		}
		task.InputRequests[q.ID] = inputRequest{Method: "elicitation/create",
			Params: elicitationRequest{Mode: "form", Message: q.Message, RequestedSchema: q.Form}}
	}
	return task, nil
}

func clipRunes(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// update answers tasks/update: each response to an open question is its
// answer (an ElicitResult: action, content). Responses to keys that are
// not outstanding (no such question, or answered or closed meanwhile) are
// ignored, as the specification says; a response that does not fit its
// question's form is an error naming it (the others are kept).
func (t *tasks) update(ctx context.Context, _ *mcp.ServerSession, p *updateParams) (*ackResult, error) {
	if _, err := t.job(ctx, p.Meta, p.TaskID); err != nil {
		return nil, err
	}
	if t.qs == nil || len(p.InputResponses) == 0 {
		return &ackResult{ResultType: "complete"}, nil
	}
	qs, err := t.qs.Questions(ctx, p.TaskID)
	if err != nil {
		return nil, taskError(ctx, t.log, "Failed to update task: reading the job's questions", p.TaskID, err)
	}
	var bad []string
	for _, q := range qs {
		raw, ok := p.InputResponses[q.ID]
		if !ok || q.State != delegate.QuestionOpen {
			continue
		}
		var r struct {
			Action  delegate.AnswerAction `json:"action"`
			Content map[string]any        `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			bad = append(bad, fmt.Sprintf("inputResponses.%s: must be an elicitation result {action, content}", q.ID))
			continue
		}
		_, err := t.qs.Answer(ctx, p.TaskID, q.ID, delegate.Answer{Action: r.Action, Content: r.Content, By: "tasks/update"})
		var fe *delegate.FieldError
		switch kind := delegate.ErrorKind(err); {
		case err == nil, kind == delegate.KindConflict, kind == delegate.KindTerminal, kind == delegate.KindNotFound:
			// answered, or no longer outstanding
		case errors.As(err, &fe):
			bad = append(bad, fmt.Sprintf("inputResponses.%s.%s: %s", q.ID, fe.Field, fe.Rule))
		default:
			return nil, taskError(ctx, t.log, "Failed to update task", p.TaskID, err)
		}
	}
	if len(bad) > 0 {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: strings.Join(bad, "; ")}
	}
	return &ackResult{ResultType: "complete"}, nil
}

// submitOutputSchema names submit_job's fields and says that a Tasks
// client gets get_job_result's instead. Like every output schema here it
// requires nothing and forbids nothing, so that both answers validate
// (TestSubmitOutputSchemaAdmitsBoth); naming get_job_result's fields again
// would cost every session's tools/list some 300 bytes for what the
// description says in 30.
func submitOutputSchema() json.RawMessage {
	var s map[string]any
	must(json.Unmarshal(outputSchema[SubmitOut](), &s))
	s["description"] = "task: get_job_result's"
	data, err := json.Marshal(s)
	must(err)
	return data
}
