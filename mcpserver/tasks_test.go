package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/google/jsonschema-go/jsonschema"
)

// The Tasks extension over the stdio transport, byte for byte, on a mock
// service: what a 2026-07-28 client that declares it gets, and what one
// that does not gets.

// meta is a 2026-07-28 request's _meta; tasks adds the extension to its
// client's capabilities.
func meta(version string, tasks bool) string {
	caps := `{}`
	if tasks {
		caps = `{"extensions":{"` + mcpserver.TasksExtension + `":{}}}`
	}
	return `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":` + caps + `}`
}

// rpcReply is a JSON-RPC response as the tests read it.
type rpcReply struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64           `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// exchange sends one request and returns its response (skipping any
// notification before it).
func (c *rawConn) exchange(t *testing.T, id int, method, params string) rpcReply {
	t.Helper()
	c.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params))
	for {
		var r rpcReply
		data := c.receive(t)
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if r.ID == id && (r.Result != nil || r.Error != nil) {
			return r
		}
	}
}

// wireTask is a task as the tests read it.
type wireTask struct {
	ResultType     string `json:"resultType"`
	TaskID         string `json:"taskId"`
	Status         string `json:"status"`
	StatusMessage  string `json:"statusMessage"`
	CreatedAt      string `json:"createdAt"`
	LastUpdatedAt  string `json:"lastUpdatedAt"`
	TTLMs          *int64 `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs"`
	Result         *struct {
		ResultType        string                        `json:"resultType"`
		Content           []struct{ Type, Text string } `json:"content"`
		StructuredContent json.RawMessage               `json:"structuredContent"`
		IsError           bool                          `json:"isError"`
	} `json:"result"`
	Error json.RawMessage `json:"error"`
}

func decodeTask(t *testing.T, r rpcReply) wireTask {
	t.Helper()
	if r.Error != nil {
		t.Fatalf("error %+v", r.Error)
	}
	var task wireTask
	if err := json.Unmarshal(r.Result, &task); err != nil {
		t.Fatalf("%s: %v", r.Result, err)
	}
	var raw map[string]json.RawMessage
	json.Unmarshal(r.Result, &raw)
	if v, ok := raw["ttlMs"]; !ok || string(v) != "null" {
		t.Errorf("ttlMs must be present and null (jobs are kept): %s", r.Result)
	}
	return task
}

// taskService is a mock with jobs by id.
func taskService() (*service, *sync.Map) {
	s := newService()
	var jobs sync.Map
	now := time.Now()
	put := func(j *delegate.Job) { jobs.Store(j.ID, j) }
	put(&delegate.Job{ID: "run-1", Status: delegate.StatusRunning, Progress: "step 2/3", CreatedAt: now.Add(-8 * time.Second),
		UpdatedAt: now.Add(-time.Second), StartedAt: now.Add(-7 * time.Second)})
	put(&delegate.Job{ID: "prov-1", Status: delegate.StatusProvisioning, Progress: "cloning template", CreatedAt: now.Add(-time.Minute)})
	put(&delegate.Job{ID: "ok-1", Status: delegate.StatusSuccess, CreatedAt: t0, UpdatedAt: t0.Add(2 * time.Second)})
	put(&delegate.Job{ID: "fail-1", Status: delegate.StatusFailed, Error: "exit code 3", CreatedAt: t0})
	put(&delegate.Job{ID: "late-1", Status: delegate.StatusTimeout, Error: "timed out after 5s", CreatedAt: t0})
	put(&delegate.Job{ID: "gone-1", Status: delegate.StatusCancelled, Error: "cancelled by the client", CreatedAt: t0})
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		if m.Task == "" {
			return nil, &delegate.FieldError{Field: "manifest.task", Rule: "required"}
		}
		j := &delegate.Job{ID: "new-1", Status: delegate.StatusPending, Manifest: m, CreatedAt: time.Now(), UpdatedAt: time.Now()}
		put(j)
		return j, nil
	}
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		if j, ok := jobs.Load(id); ok {
			return j.(*delegate.Job), nil
		}
		return nil, fmt.Errorf("job %s: %w", id, delegate.ErrNotFound)
	}
	s.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		j, err := s.GetFn(ctx, id)
		if err != nil {
			return nil, err
		}
		if !j.Status.Terminal() {
			return nil, delegate.ErrNotFinished
		}
		exit := 0
		if j.Status == delegate.StatusFailed {
			exit = 3
		}
		return &delegate.JobResult{JobID: id, Status: j.Status, ExitCode: &exit, Output: []byte("out of " + id + "\n"), Error: j.Error, Duration: time.Second}, nil
	}
	return s, &jobs
}

func TestTasksExtension(t *testing.T) {
	s, jobs := taskService()
	var cancelled []string
	s.CancelFn = func(ctx context.Context, id string) (*delegate.Job, bool, error) {
		j, err := s.GetFn(ctx, id)
		if err != nil {
			return nil, false, err
		}
		cancelled = append(cancelled, id)
		return j, !j.Status.Terminal(), nil
	}
	c := rawSessionWith(t, s, mcpserver.Limits{}, inputs[0])
	withTasks, without := meta("2026-07-28", true), meta("2026-07-28", false)
	id := 0
	next := func() int { id++; return id }

	t.Run("advertised", func(t *testing.T) {
		r := c.exchange(t, next(), "server/discover", `{`+without+`}`)
		var d struct {
			SupportedVersions []string `json:"supportedVersions"`
			Capabilities      struct {
				Extensions map[string]json.RawMessage `json:"extensions"`
			} `json:"capabilities"`
		}
		json.Unmarshal(r.Result, &d)
		if string(d.Capabilities.Extensions[mcpserver.TasksExtension]) != "{}" {
			t.Errorf("discover does not advertise the extension as {}: %s", r.Result)
		}
	})

	t.Run("submit_job answers with a task", func(t *testing.T) {
		r := c.exchange(t, next(), "tools/call", `{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"sleep 5"}},`+withTasks+`}`)
		task := decodeTask(t, r)
		if task.ResultType != "task" || task.TaskID != "new-1" || task.Status != "working" || task.StatusMessage != "pending" ||
			task.PollIntervalMs != 500 || task.CreatedAt == "" || task.LastUpdatedAt == "" || task.Result != nil {
			t.Errorf("CreateTaskResult %s", r.Result)
		}
		if _, err := time.Parse(time.RFC3339Nano, task.CreatedAt); err != nil {
			t.Errorf("createdAt: %v", err)
		}
		// Stored before the reply: the task is the job.
		if _, ok := jobs.Load(task.TaskID); !ok {
			t.Errorf("no job %s", task.TaskID)
		}
	})

	t.Run("without the extension, today's answer", func(t *testing.T) {
		for _, m := range []string{without, meta("2025-11-25", true)} {
			r := c.exchange(t, next(), "tools/call", `{"name":"submit_job","arguments":{"manifest":{"agentType":"script","task":"true"}},`+m+`}`)
			var res struct {
				ResultType        string `json:"resultType"`
				StructuredContent mcpserver.SubmitOut
			}
			if err := json.Unmarshal(r.Result, &res); err != nil || res.ResultType == "task" || res.StructuredContent.JobID != "new-1" {
				t.Errorf("%s: %s", m, r.Result)
			}
		}
	})

	t.Run("a refused submission is answered at once", func(t *testing.T) {
		r := c.exchange(t, next(), "tools/call", `{"name":"submit_job","arguments":{"manifest":{"agentType":"script"}},`+withTasks+`}`)
		if !strings.Contains(string(r.Result), `"isError":true`) || !strings.Contains(string(r.Result), "manifest.task: required") || strings.Contains(string(r.Result), `"task"`) {
			t.Errorf("%s", r.Result)
		}
	})

	get := []struct {
		id, status, message string
		isError             bool
		output              string
	}{
		{"run-1", "working", "running: step 2/3", false, ""},
		{"prov-1", "working", "provisioning: cloning template", false, ""},
		{"ok-1", "completed", "success", false, `{"status":"success","exit_code":0,"duration_seconds":1,"output_bytes":0,"output_truncated":false,"stderr":"","artifacts":[],"output":"out of ok-1\n"}`},
		{"fail-1", "completed", "failed: exit code 3", true, `{"status":"failed","exit_code":3,`},
		{"late-1", "completed", "timeout: timed out after 5s", true, `"status":"timeout"`},
		{"gone-1", "cancelled", "cancelled: cancelled by the client", false, ""},
	}
	for _, tc := range get {
		t.Run("tasks/get "+tc.id, func(t *testing.T) {
			r := c.exchange(t, next(), "tasks/get", `{"taskId":"`+tc.id+`",`+withTasks+`}`)
			task := decodeTask(t, r)
			if task.ResultType != "complete" || task.TaskID != tc.id || task.Status != tc.status || task.StatusMessage != tc.message {
				t.Errorf("%s", r.Result)
			}
			if (task.Status == "working") != (task.PollIntervalMs > 0) {
				t.Errorf("pollIntervalMs %d for a %s task", task.PollIntervalMs, task.Status)
			}
			if tc.status != "completed" {
				if task.Result != nil || task.Error != nil {
					t.Errorf("a %s task with a result: %s", tc.status, r.Result)
				}
				return
			}
			res := task.Result
			if res == nil || res.ResultType != "complete" || res.IsError != tc.isError || !strings.Contains(string(res.StructuredContent), tc.output) ||
				len(res.Content) != 1 || res.Content[0].Type != "text" || res.Content[0].Text != string(res.StructuredContent) {
				t.Fatalf("result %s", r.Result)
			}
			var out mcpserver.ResultOut
			if err := json.Unmarshal(res.StructuredContent, &out); err != nil || out.Artifacts == nil {
				t.Errorf("not get_job_result's output: %s (%v)", res.StructuredContent, err)
			}
		})
	}

	errorsTests := []struct {
		name, method, params string
		code                 int64
		message              string
	}{
		{"unknown id", "tasks/get", `{"taskId":"nope",` + withTasks + `}`, -32602, "Task not found"},
		{"no id", "tasks/get", `{` + withTasks + `}`, -32602, "taskId: required"},
		{"no extension", "tasks/get", `{"taskId":"ok-1",` + without + `}`, -32021, "Missing required client capability"},
		{"cancel unknown", "tasks/cancel", `{"taskId":"nope",` + withTasks + `}`, -32602, "Task not found"},
		{"update unknown", "tasks/update", `{"taskId":"nope","inputResponses":{},` + withTasks + `}`, -32602, "Task not found"},
		{"cancel without the extension", "tasks/cancel", `{"taskId":"run-1",` + without + `}`, -32021, mcpserver.TasksExtension},
	}
	for _, tc := range errorsTests {
		t.Run(tc.name, func(t *testing.T) {
			r := c.exchange(t, next(), tc.method, tc.params)
			if r.Error == nil || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.message) {
				t.Fatalf("%s: result %s error %+v", tc.method, r.Result, r.Error)
			}
			if tc.code == -32021 && !strings.Contains(string(r.Error.Data), `"requiredCapabilities":{"extensions":{"`+mcpserver.TasksExtension+`":{}}}`) {
				t.Errorf("data %s", r.Error.Data)
			}
		})
	}
	if len(cancelled) != 0 {
		t.Fatalf("cancelled %v without the extension", cancelled)
	}

	t.Run("tasks/cancel", func(t *testing.T) {
		for _, id := range []string{"run-1", "ok-1"} { // an ended job: acknowledged, left as it is
			r := c.exchange(t, next(), "tasks/cancel", `{"taskId":"`+id+`",`+withTasks+`}`)
			if r.Error != nil || !strings.Contains(string(r.Result), `"resultType":"complete"`) {
				t.Errorf("%s: %s %+v", id, r.Result, r.Error)
			}
		}
		if strings.Join(cancelled, ",") != "run-1,ok-1" {
			t.Errorf("cancelled %v", cancelled)
		}
	})

	t.Run("tasks/update of a task that asks nothing", func(t *testing.T) {
		r := c.exchange(t, next(), "tasks/update", `{"taskId":"run-1","inputResponses":{"q1":{"action":"accept","content":{"answer":"yes"}}},`+withTasks+`}`)
		if r.Error != nil || !strings.Contains(string(r.Result), `"resultType":"complete"`) {
			t.Errorf("%s %+v", r.Result, r.Error)
		}
	})
}

// TestSubscriptionsListenAcksNoTasks: a client asking subscriptions/listen
// for notifications/tasks is acknowledged without them (the SDK's listen
// stream carries only its own notifications), which tells it to poll.
func TestSubscriptionsListenAcksNoTasks(t *testing.T) {
	s, _ := taskService()
	c := rawSessionWith(t, s, mcpserver.Limits{}, inputs[0])
	c.send(t, `{"jsonrpc":"2.0","id":"listen","method":"subscriptions/listen","params":{"notifications":{"taskIds":["run-1"],"resourceSubscriptions":["job://run-1"]},`+meta("2026-07-28", true)+`}}`)
	ack := c.receive(t)
	var n struct {
		Method string `json:"method"`
		Params struct {
			Notifications map[string]json.RawMessage `json:"notifications"`
		} `json:"params"`
	}
	if err := json.Unmarshal(ack, &n); err != nil || n.Method != "notifications/subscriptions/acknowledged" {
		t.Fatalf("first message %s", ack)
	}
	if _, ok := n.Params.Notifications["taskIds"]; ok {
		t.Errorf("acknowledged task notifications it does not send: %s", ack)
	}
	if _, ok := n.Params.Notifications["resourceSubscriptions"]; !ok {
		t.Errorf("resource subscriptions not acknowledged: %s", ack)
	}
}

// TestSubmitOutputSchemaAdmitsBoth: submit_job's published output schema
// validates both of its answers' structured content: {job_id, status}, and
// the get_job_result output a Tasks client gets as the task's result.
func TestSubmitOutputSchemaAdmitsBoth(t *testing.T) {
	s, _ := taskService()
	cs := connect(t, s, nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var published *jsonschema.Resolved
	for _, tool := range tools.Tools {
		if tool.Name == "submit_job" {
			published = resolve(t, tool.OutputSchema)
			raw, _ := json.Marshal(tool.OutputSchema)
			if !strings.Contains(string(raw), "get_job_result") {
				t.Errorf("submit_job's output schema does not say what a task's result is: %s", raw)
			}
		}
	}
	var plain mcpserver.SubmitOut
	structured(t, call(t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "true"}}), &plain)
	c := rawSessionWith(t, s, mcpserver.Limits{}, inputs[0])
	for i, id := range []string{"ok-1", "fail-1"} {
		task := decodeTask(t, c.exchange(t, i+1, "tasks/get", `{"taskId":"`+id+`",`+meta("2026-07-28", true)+`}`))
		for _, out := range []any{plain, json.RawMessage(task.Result.StructuredContent)} {
			raw, _ := json.Marshal(out)
			var instance any
			json.Unmarshal(raw, &instance)
			if err := published.Validate(instance); err != nil {
				t.Errorf("%s does not validate against submit_job's output schema: %v", raw, err)
			}
		}
	}
}

// TestTasksErrorTable: a tasks/* request that fails in the service is
// answered through the error table, as a tool call is: the store's or
// the backend's own words are logged in full, never sent; an error of a
// kind of ours reaches the client in our words.
func TestTasksErrorTable(t *testing.T) {
	const sqlText = "SQL logic error: no such table: job_questions (1)"
	internal := fmt.Errorf("read job: %w", errors.New(sqlText))
	unavailable := fmt.Errorf("%w: %s", delegate.ErrUnavailable, sqlText)
	withTasks := meta("2026-07-28", true)
	open := []delegate.Question{{ID: "q1", JobID: "run-1", State: delegate.QuestionOpen, Message: "go on?"}}
	for _, tc := range []struct {
		name, method, params string
		break_               func(s *service, err error)
		err                  error
		code                 int64
		want                 string
	}{
		{"get: the job", "tasks/get", `{"taskId":"run-1",` + withTasks + `}`,
			func(s *service, err error) {
				s.GetFn = func(context.Context, string) (*delegate.Job, error) { return nil, err }
			},
			internal, -32603, "Failed to retrieve task: the server failed (its log says why)"},
		{"get: the result", "tasks/get", `{"taskId":"ok-1",` + withTasks + `}`,
			func(s *service, err error) {
				s.ResultFn = func(context.Context, string, delegate.ResultOptions) (*delegate.JobResult, error) { return nil, err }
			},
			internal, -32603, "Failed to retrieve task: reading the job's result: the server failed"},
		{"get: the questions", "tasks/get", `{"taskId":"run-1",` + withTasks + `}`,
			func(s *service, err error) {
				s.QuestionsFn = func(context.Context, string) ([]delegate.Question, error) { return nil, err }
			},
			unavailable, -32603, "Failed to retrieve task: reading the job's questions: the sandbox backend or the job store does not answer now"},
		{"cancel", "tasks/cancel", `{"taskId":"run-1",` + withTasks + `}`,
			func(s *service, err error) {
				s.CancelFn = func(context.Context, string) (*delegate.Job, bool, error) { return nil, false, err }
			},
			internal, -32603, "Failed to cancel task: the server failed"},
		{"update: the questions", "tasks/update", `{"taskId":"run-1","inputResponses":{"q1":{"action":"accept"}},` + withTasks + `}`,
			func(s *service, err error) {
				s.QuestionsFn = func(context.Context, string) ([]delegate.Question, error) { return nil, err }
			},
			internal, -32603, "Failed to update task: reading the job's questions: the server failed"},
		{"update: the answer", "tasks/update", `{"taskId":"run-1","inputResponses":{"q1":{"action":"accept"}},` + withTasks + `}`,
			func(s *service, err error) {
				s.QuestionsFn = func(context.Context, string) ([]delegate.Question, error) { return open, nil }
				s.AnswerFn = func(context.Context, string, string, delegate.Answer) (*delegate.Question, error) { return nil, err }
			},
			internal, -32603, "Failed to update task: the server failed"},
		{"update: an answer of a kind of ours", "tasks/update", `{"taskId":"run-1","inputResponses":{"q1":{"action":"accept"}},` + withTasks + `}`,
			func(s *service, err error) {
				s.QuestionsFn = func(context.Context, string) ([]delegate.Question, error) { return open, nil }
				s.AnswerFn = func(context.Context, string, string, delegate.Answer) (*delegate.Question, error) { return nil, err }
			},
			fmt.Errorf("answer: %w", delegate.ErrForbidden), -32602, "Failed to update task: answer: token belongs to another job"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := taskService()
			tc.break_(s, tc.err)
			log, logs := testkit.NewLog()
			c := rawSessionLog(t, s, mcpserver.Limits{}, inputs[0], log)
			r := c.exchange(t, 1, tc.method, tc.params)
			if r.Error == nil || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.want) {
				t.Fatalf("result %s error %+v; want %d %q", r.Result, r.Error, tc.code, tc.want)
			}
			if strings.Contains(r.Error.Message, "SQL") {
				t.Errorf("the client reads the store's words: %q", r.Error.Message)
			}
			if delegate.ErrorKind(tc.err) == delegate.KindInternal && !strings.Contains(logs.String(), sqlText) {
				t.Errorf("the log lacks the error in full:\n%s", logs)
			}
		})
	}
}
