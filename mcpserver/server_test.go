package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP adapter over a mock JobService, through the SDK's client on an
// in-memory transport: what each tool asks of the service, and what it
// renders.

// service is a mock whose Watch is a channel the test can push to. It
// takes questions too, as the engine does: its jobs ask none unless a
// test says (questions_test.go).
type service struct {
	mock.JobService
	mock.SandboxService
	mock.QuestionService
	changes chan string
}

func newService() *service {
	s := &service{changes: make(chan string, 16)}
	s.QuestionsFn = func(context.Context, string) ([]delegate.Question, error) { return nil, nil }
	s.WatchFn = func(ctx context.Context) <-chan string {
		out := make(chan string)
		go func() {
			defer close(out)
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-s.changes:
					select {
					case out <- id:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
		return out
	}
	return s
}

func connect(t *testing.T, svc delegate.JobService, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	server := newServer(ctx, svc, slog.New(slog.DiscardHandler))
	clientT, serverT := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, serverT, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// structured decodes a successful result's structured content into v.
func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", errorText(res))
	}
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("structured content %s: %v", raw, err)
	}
}

func errorText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

var (
	t0   = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	code = 3
)

func finishedJob(id string) *delegate.Job {
	return &delegate.Job{
		ID: id, Status: delegate.StatusFailed, Progress: "failed", Error: "exit code 3", ExitCode: &code,
		Manifest:  delegate.Manifest{AgentType: delegate.AgentScript, Task: "make", StatusMode: delegate.StatusModeDetailed},
		CreatedAt: t0, UpdatedAt: t0.Add(3 * time.Second), StartedAt: t0.Add(time.Second), FinishedAt: t0.Add(3 * time.Second),
		LastHeartbeat: t0.Add(2 * time.Second), OutputBytes: 12, TimelineDropped: 3,
	}
}

// fullService answers every read with something, for the schema check.
func fullService() *service {
	s := newService()
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		return &delegate.Job{ID: "job-1", Status: delegate.StatusPending, Manifest: m}, nil
	}
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) { return finishedJob(id), nil }
	s.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) {
		return []delegate.Event{{Time: t0, Message: "provisioning"}, {Time: t0.Add(time.Second), Message: "step 1/2"}}, nil
	}
	s.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) { return finishedJob(id), nil }
	s.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return &delegate.JobResult{JobID: id, Status: delegate.StatusFailed, ExitCode: &code, Output: []byte("out\n"), Stderr: []byte("err\n"), OutputBytes: 8,
			Error: "exit code 3", Duration: 2 * time.Second}, nil // Artifacts nil: rendered as an empty list
	}
	s.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		return &delegate.LogPage{JobID: id, Status: delegate.StatusFailed, Output: []byte("out\n"), NextCursor: "4", Done: true}, nil
	}
	s.CancelFn = func(ctx context.Context, id string) (*delegate.Job, bool, error) { return finishedJob(id), false, nil }
	s.ReleaseFn = func(ctx context.Context, id string) (*delegate.Job, bool, error) { return finishedJob(id), true, nil }
	s.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		return &delegate.JobPage{Jobs: []delegate.JobSummary{{ID: "job-1", Status: delegate.StatusSuccess, AgentType: delegate.AgentScript,
			Task: "make", CreatedAt: t0, ExitCode: &code, SandboxKept: true}}, NextCursor: "c2"}, nil
	}
	fullSandboxes(&s.SandboxService)
	s.AnswerFn = func(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
		return &delegate.Question{JobID: jobID, ID: id, State: delegate.QuestionAnswered, Answer: &a}, nil
	}
	return s
}

// toolTypes are each tool's input and output types, the source of its
// schemas.
var toolTypes = map[string]struct{ in, out reflect.Type }{
	"submit_job":     {reflect.TypeFor[mcpserver.SubmitIn](), reflect.TypeFor[mcpserver.SubmitOut]()},
	"wait_job":       {reflect.TypeFor[mcpserver.WaitIn](), reflect.TypeFor[mcpserver.WaitOut]()},
	"get_job_status": {reflect.TypeFor[mcpserver.JobIn](), reflect.TypeFor[mcpserver.StatusOut]()},
	"get_job_result": {reflect.TypeFor[mcpserver.ResultIn](), reflect.TypeFor[mcpserver.ResultOut]()},
	"get_job_logs":   {reflect.TypeFor[mcpserver.LogsIn](), reflect.TypeFor[mcpserver.LogsOut]()},
	"cancel_job":     {reflect.TypeFor[mcpserver.JobIn](), reflect.TypeFor[mcpserver.CancelOut]()},
	"release_job":    {reflect.TypeFor[mcpserver.JobIn](), reflect.TypeFor[mcpserver.ReleaseOut]()},
	"list_jobs":      {reflect.TypeFor[mcpserver.ListIn](), reflect.TypeFor[mcpserver.ListOut]()},
	"answer_job":     {reflect.TypeFor[mcpserver.AnswerJobIn](), reflect.TypeFor[mcpserver.AnswerJobOut]()},
}

func resolve(t *testing.T, schema any) *jsonschema.Resolved {
	t.Helper()
	raw, _ := json.Marshal(schema)
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("schema %s: %v", raw, err)
	}
	r, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("schema %s does not resolve: %v", raw, err)
	}
	return r
}

// TestToolOutputsMatchSchemas: every tool's structured output validates
// against the output schema it declares in tools/list, declares every
// field it has (the published schema names the fields without their
// types), and has the types of its Go output type (the typed schema,
// checked here so that clients need not pay for it); its text content is
// the same JSON.
func TestToolOutputsMatchSchemas(t *testing.T) {
	cs := connect(t, fullService(), nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]map[string]any{
		"answer_job": {"job_id": "job-1", "answers": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"a": 1}}}},
		"submit_job": {"manifest": map[string]any{"agentType": "script", "task": "make"}},
		"list_jobs":  {"status": "success", "limit": 5},
		// The sandbox tools (sandboxes_test.go checks each op of sandbox_files).
		"open_sandbox":   {"resources": map[string]any{"memory": "512M"}},
		"list_sandboxes": {},
		"sandbox_files":  {"sandbox_id": "sbx-1", "op": "read", "path": "f"},
	}
	if len(tools.Tools) != len(toolTypes) {
		t.Errorf("%d tools, want %d", len(tools.Tools), len(toolTypes))
	}
	for _, tool := range tools.Tools {
		t.Run(tool.Name, func(t *testing.T) {
			types, ok := toolTypes[tool.Name]
			if !ok {
				t.Fatalf("no types known for %s", tool.Name)
			}
			published := resolve(t, tool.OutputSchema)
			typed, err := jsonschema.ForType(types.out, nil)
			if err != nil {
				t.Fatal(err)
			}
			a := args[tool.Name]
			if a == nil {
				a = map[string]any{"job_id": "job-1"}
			}
			res := call(t, cs, tool.Name, a)
			if res.IsError {
				t.Fatalf("tool error: %s", errorText(res))
			}
			var instance any
			out, _ := json.Marshal(res.StructuredContent)
			json.Unmarshal(out, &instance)
			if err := published.Validate(instance); err != nil {
				t.Errorf("structured output %s does not match the declared schema: %v", out, err)
			}
			if err := resolve(t, typed).Validate(instance); err != nil {
				t.Errorf("structured output %s does not match the typed schema of %s: %v", out, types.out, err)
			}
			raw, _ := json.Marshal(tool.OutputSchema)
			var declared map[string]any
			json.Unmarshal(raw, &declared)
			if missing := undeclared(instance, declared, ""); len(missing) > 0 {
				t.Errorf("output fields %v are not in the declared schema %s", missing, raw)
			}
			var fromText any
			if err := json.Unmarshal([]byte(errorText(res)), &fromText); err != nil || !reflect.DeepEqual(fromText, instance) {
				t.Errorf("text content %s is not the structured content %s", errorText(res), out)
			}
		})
	}
}

// undeclared lists the fields of a JSON value that the schema (as JSON)
// does not name.
func undeclared(v any, schema map[string]any, path string) []string {
	var missing []string
	switch v := v.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		for k, sub := range v {
			p, ok := props[k].(map[string]any)
			if !ok {
				missing = append(missing, path+k)
				continue
			}
			if len(p) == 0 {
				continue // declared, its schema left open (wait_job's result)
			}
			missing = append(missing, undeclared(sub, p, path+k+".")...)
		}
	case []any:
		items, _ := schema["items"].(map[string]any)
		for _, e := range v {
			missing = append(missing, undeclared(e, items, path)...)
		}
	}
	return missing
}

func TestSubmit(t *testing.T) {
	s := newService()
	var got delegate.Manifest
	var gotOpts delegate.SubmitOptions
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		got, gotOpts = m, opts
		return &delegate.Job{ID: "job-9", Status: delegate.StatusPending}, nil
	}
	cs := connect(t, s, nil)
	var out mcpserver.SubmitOut
	structured(t, call(t, cs, "submit_job", map[string]any{
		"manifest":        map[string]any{"agentType": "script", "task": "echo hi", "timeout": 30, "env": map[string]any{"A": "b"}},
		"idempotency_key": "k1",
	}), &out)
	if out.JobID != "job-9" || out.Status != delegate.StatusPending {
		t.Errorf("output %+v", out)
	}
	if got.AgentType != delegate.AgentScript || got.Task != "echo hi" || got.Timeout == nil || *got.Timeout != 30 || got.Env["A"] != "b" || gotOpts.IdempotencyKey != "k1" {
		t.Errorf("the service got %+v %+v", got, gotOpts)
	}
}

// TestErrors: what the service says reaches the agent, with the hint that
// tells it what to do next.
func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"not found", fmt.Errorf("job job-x: %w", delegate.ErrNotFound), []string{"job_id", "not found", "list_jobs"}},
		{"not finished", fmt.Errorf("job job-x is running: %w", delegate.ErrNotFinished), []string{"job not finished", "wait_job"}},
		{"bad option", &delegate.FieldError{Field: "max_output_bytes", Rule: "must be positive"}, []string{"max_output_bytes: must be positive"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newService()
			s.ResultFn = func(context.Context, string, delegate.ResultOptions) (*delegate.JobResult, error) { return nil, tc.err }
			res := call(t, connect(t, s, nil), "get_job_result", map[string]any{"job_id": "job-x"})
			if !res.IsError {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(errorText(res), w) {
					t.Errorf("%q does not say %q", errorText(res), w)
				}
			}
		})
	}
}

func TestResultAndLogsRendering(t *testing.T) {
	s := newService()
	var gotResult delegate.ResultOptions
	s.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		gotResult = opts
		return &delegate.JobResult{JobID: id, Status: delegate.StatusSuccess, Output: []byte("ok \xff\n"), OutputOffset: 7, Stderr: []byte("warn \xfe\n"),
			Duration: 1500 * time.Millisecond, Artifacts: []delegate.Artifact{{Name: "out.txt", Size: 3, SHA256: strings.Repeat("a", 64)}}}, nil
	}
	var gotLogs delegate.LogOptions
	s.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		gotLogs = opts
		return &delegate.LogPage{JobID: id, Status: delegate.StatusRunning, Output: []byte("a\xc3(b"), NextCursor: "17"}, nil
	}
	cs := connect(t, s, nil)
	var r mcpserver.ResultOut
	structured(t, call(t, cs, "get_job_result", map[string]any{"job_id": "job-1", "max_output_bytes": 100}), &r)
	if gotResult.OutputTail != 101 { // a byte more: whether the tail starts a line
		t.Errorf("max_output_bytes became %+v", gotResult)
	}
	if r.Output != "ok \uFFFD\n" || r.Stderr != "warn \uFFFD\n" || r.DurationSeconds != 1.5 || len(r.Artifacts) != 1 {
		t.Errorf("result %+v", r)
	}
	var l mcpserver.LogsOut
	structured(t, call(t, cs, "get_job_logs", map[string]any{"job_id": "job-1", "cursor": "10", "max_bytes": 7}), &l)
	if gotLogs.Cursor != "10" || gotLogs.MaxBytes != 7 {
		t.Errorf("logs options %+v", gotLogs)
	}
	if l.Output != "a\uFFFD(b" || l.NextCursor != "17" || l.Done || l.Status != delegate.StatusRunning {
		t.Errorf("logs %+v", l)
	}
}

func TestStatusAndList(t *testing.T) {
	s := fullService()
	var gotList delegate.ListOptions
	list := s.ListFn
	s.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		gotList = opts
		return list(ctx, opts)
	}
	cs := connect(t, s, nil)
	var st mcpserver.StatusOut
	structured(t, call(t, cs, "get_job_status", map[string]any{"job_id": "job-1"}), &st)
	if st.Status != delegate.StatusFailed || len(st.Timeline) != 2 || st.TimelineDropped != 3 || st.DurationSeconds != 2 || st.StartedAt == nil || !st.StartedAt.Equal(t0.Add(time.Second)) {
		t.Errorf("status %+v", st)
	}
	var l mcpserver.ListOut
	structured(t, call(t, cs, "list_jobs", map[string]any{"status": "success", "limit": 5, "cursor": "c1"}), &l)
	if gotList != (delegate.ListOptions{Status: delegate.StatusSuccess, Limit: 5, Cursor: "c1"}) {
		t.Errorf("list options %+v", gotList)
	}
	if len(l.Jobs) != 1 || !l.Jobs[0].SandboxKept || l.Jobs[0].Task != "make" || l.NextCursor != "c2" {
		t.Errorf("list %+v", l)
	}
	var c mcpserver.CancelOut
	structured(t, call(t, cs, "cancel_job", map[string]any{"job_id": "job-1"}), &c)
	if c.Cancelled || c.Status != delegate.StatusFailed {
		t.Errorf("cancel of a finished job %+v", c)
	}
	var r mcpserver.ReleaseOut
	structured(t, call(t, cs, "release_job", map[string]any{"job_id": "job-1"}), &r)
	if !r.Released {
		t.Errorf("release %+v", r)
	}
}

// TestWait: the wait is bounded for real clients' per-call timeouts, and
// progress goes to clients that asked for it, on every change the service
// announces.
func TestWait(t *testing.T) {
	s := newService()
	var mu sync.Mutex
	progress := "provisioning sandbox"
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		mu.Lock()
		defer mu.Unlock()
		return &delegate.Job{ID: id, Status: delegate.StatusRunning, Progress: progress}, nil
	}
	notified := make(chan string, 10)
	s.WaitFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		deadline, ok := ctx.Deadline()
		if !ok || time.Until(deadline) > 50*time.Second || time.Until(deadline) < 40*time.Second {
			t.Errorf("wait without the 50 s bound: %v %v", deadline, ok)
		}
		if msg := <-notified; msg != "running: provisioning sandbox" {
			t.Errorf("first progress %q", msg)
		}
		mu.Lock()
		progress = "step 2/3"
		mu.Unlock()
		s.changes <- "job-other" // not this job: no new read is needed
		s.changes <- id
		if msg := <-notified; msg != "running: step 2/3" {
			t.Errorf("second progress %q", msg)
		}
		return &delegate.Job{ID: id, Status: delegate.StatusSuccess, Progress: "success"}, nil
	}
	s.ResultFn = func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
		return &delegate.JobResult{JobID: id, Status: delegate.StatusSuccess, ExitCode: new(0), ExitReason: delegate.ExitReasonExited,
			Output: []byte("ok\n"), OutputBytes: 3}, nil
	}
	cs := connect(t, s, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		notified <- req.Params.Message
	}})
	params := &mcp.CallToolParams{Name: "wait_job", Arguments: map[string]any{"job_id": "job-1"}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	var out mcpserver.WaitOut
	structured(t, res, &out)
	if !out.Done || out.Status != delegate.StatusSuccess {
		t.Errorf("wait %+v", out)
	}
	// The wait that ends answers with the result, how it ended first.
	if want := `{"status":"success","done":true,"result":{"status":"success","exit_code":0,"exit_reason":"exited",`; !strings.HasPrefix(errorText(res), want) ||
		!strings.HasSuffix(errorText(res), `"output":"ok\n"}}`) {
		t.Errorf("wait_job answered %s, want it to start %s and end with the output", errorText(res), want)
	}
	if res := call(t, cs, "wait_job", map[string]any{"job_id": "job-1", "timeout_seconds": 51}); !res.IsError || !strings.Contains(errorText(res), "timeout_seconds") {
		t.Errorf("timeout_seconds 51: %s", errorText(res))
	}
}

func TestResources(t *testing.T) {
	s := fullService()
	s.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		// Two pages: the resource is the whole output.
		if opts.Cursor == "" {
			return &delegate.LogPage{JobID: id, Output: []byte("first "), NextCursor: "6"}, nil
		}
		return &delegate.LogPage{JobID: id, Output: []byte("second"), NextCursor: "12", Done: true}, nil
	}
	s.ReadArtifactFn = func(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
		switch name {
		case "out/report.txt":
			return delegate.Artifact{Name: name}, []byte("report"), nil
		case "bin":
			return delegate.Artifact{Name: name}, []byte{0xff, 0}, nil
		}
		return delegate.Artifact{}, nil, delegate.ArtifactNotFound(id, name)
	}
	get := s.GetFn
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		if id == "job-nope" {
			return nil, delegate.JobNotFound(id)
		}
		return get(ctx, id)
	}
	updated := make(chan string, 10)
	cs := connect(t, s, &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
		updated <- req.Params.URI
	}})
	ctx := context.Background()
	read := func(uri string) *mcp.ResourceContents {
		t.Helper()
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		return res.Contents[0]
	}
	var st struct {
		JobID string `json:"job_id"`
		mcpserver.StatusOut
	}
	if err := json.Unmarshal([]byte(read("job://job-1").Text), &st); err != nil || st.JobID != "job-1" || len(st.Timeline) != 2 {
		t.Errorf("status resource: %+v %v", st, err)
	}
	if got := read("job://job-1/log").Text; got != "first second" {
		t.Errorf("log resource %q", got)
	}
	if got := read("job://job-1/artifacts/out/report.txt"); got.Text != "report" {
		t.Errorf("text artifact %+v", got)
	}
	if got := read("job://job-1/artifacts/bin"); string(got.Blob) != "\xff\x00" || got.MIMEType != "application/octet-stream" {
		t.Errorf("binary artifact %+v", got)
	}
	// What is missing is named, with the protocol's code for it.
	for uri, want := range map[string]string{
		"job://job-nope":                `job "job-nope": not found`,
		"job://job-1/artifacts/missing": `artifact "missing" of job job-1: not found`,
		"job://job-1/other":             "Resource not found",
	} {
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		var wire *jsonrpc.Error
		if !errors.As(err, &wire) || wire.Code != mcp.CodeResourceNotFound || !strings.Contains(wire.Message, want) {
			t.Errorf("%s: %v, want code %d saying %q", uri, err, mcp.CodeResourceNotFound, want)
		}
	}

	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "job://job-1"}); err != nil {
		t.Fatal(err)
	}
	// In the newest protocol the subscription is a listen stream the
	// server registers a moment after Subscribe returns: announce the
	// change until it arrives.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case uri := <-updated:
			if uri != "job://job-1" {
				t.Fatalf("update of %s, which is not subscribed", uri)
			}
			return
		case <-tick.C:
			s.changes <- "job-1"
		case <-timeout:
			t.Fatal("no notifications/resources/updated for a subscribed job")
		}
	}
}

// newServer serves svc with the services it implements (as cmd/ wires the
// engine, which implements them all), its updates published until ctx
// ends.
func newServer(ctx context.Context, svc delegate.JobService, log *slog.Logger) *mcpserver.Server {
	s := mcpserver.New(servicesOf(svc), log)
	go s.PublishUpdates(ctx)
	return s
}

// servicesOf names the services svc implements.
func servicesOf(svc delegate.JobService) mcpserver.Services {
	out := mcpserver.Services{Jobs: svc}
	out.Sandboxes, _ = svc.(delegate.SandboxService)
	out.Questions, _ = svc.(delegate.QuestionService)
	out.Network, _ = svc.(delegate.NetworkService)
	out.Workspaces, _ = svc.(delegate.WorkspaceService)
	out.Checkpoints, _ = svc.(delegate.CheckpointService)
	return out
}
