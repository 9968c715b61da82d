// Package mcpserver exposes the engine as MCP tools (official go-sdk). It is
// an adapter: parse arguments, call the engine, render. No job logic here.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is reported to clients; cmd sets it at build time.
var Version = "dev"

const (
	defaultResultBytes = 64 << 10
	// maxWait keeps wait_job under the per-call timeouts of real clients
	// (Claude Code gives up on a tool call after about a minute).
	maxWait = 50
)

// New builds the MCP server for an engine. Until ctx ends it tells
// subscribed clients about every change to a job (resources job://{id} and
// job://{id}/log).
func New(ctx context.Context, eng *engine.Engine, log *slog.Logger) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "delegate", Title: "delegate: run jobs in isolated sandboxes", Version: Version},
		&mcp.ServerOptions{
			Instructions: "Run work in a disposable isolated sandbox: submit_job returns a job_id at once; " +
				"wait_job blocks up to 50 s; get_job_result returns output and exit code.",
			Logger: log,
			// The SDK keeps the subscriptions; accepting them is enough.
			SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		})
	h := &handlers{eng: eng}
	addResources(s, eng)
	go publishUpdates(ctx, s, eng)
	mcp.AddTool(s, &mcp.Tool{
		Name: "submit_job",
		Description: "Start a job in a new isolated sandbox (cwd /workspace; no network unless network egress); returns job_id at once. " +
			"script: task via /bin/sh -c; custom: agent.command, task in $DELEGATE_TASK; claude: Claude CLI, task as prompt.",
		InputSchema:  compact(submitSchema(), false),
		Annotations:  annotations(false, false, false),
		OutputSchema: outputSchema[SubmitOut](),
	}, h.submit)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "get_job_status",
		Description:  "A job's status (pending, provisioning, running, success, failed, timeout, cancelled), progress, timeline (detailed, streaming) and timestamps.",
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[StatusOut](),
	}, h.status)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "wait_job",
		Description:  "Wait until a job finishes or timeout_seconds (default and max 50) pass; returns its status. Then get_job_result.",
		InputSchema:  compact(waitSchema(), false),
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[WaitOut](),
	}, h.wait)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "get_job_result",
		Description:  "Result of a finished job: exit_code, output (stdout+stderr; the last max_output_bytes, default 65536), error, artifacts. Fails while it runs.",
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[ResultOut](),
	}, h.result)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "get_job_logs",
		Description:  "Output (stdout+stderr) from cursor on, at most max_bytes (default 65536), and next_cursor; readable while running in statusMode streaming.",
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[LogsOut](),
	}, h.logs)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "cancel_job",
		Description:  "Kill an unfinished job's processes and destroy its sandbox. A finished job is left as it is.",
		Annotations:  annotations(false, true, true),
		OutputSchema: outputSchema[CancelOut](),
	}, h.cancel)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "release_job",
		Description:  "Destroy the sandbox a finished job with lifecycle persistent kept.",
		Annotations:  annotations(false, true, true),
		OutputSchema: outputSchema[ReleaseOut](),
	}, h.release)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "list_jobs",
		Description:  "Jobs newest first, optionally only one status; pass next_cursor back as cursor for the next page.",
		InputSchema:  compact(listSchema(), false),
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[ListOut](),
	}, h.list)
	return s
}

func annotations(readOnly, destructive, idempotent bool) *mcp.ToolAnnotations {
	closed := false
	return &mcp.ToolAnnotations{ReadOnlyHint: readOnly, DestructiveHint: &destructive, IdempotentHint: idempotent, OpenWorldHint: &closed}
}

// HTTPHandler serves MCP over Streamable HTTP with stateful sessions, so
// that cancellation and (later) subscriptions work.
func HTTPHandler(s *mcp.Server, sessionTimeout time.Duration, log *slog.Logger) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{SessionTimeout: sessionTimeout, Logger: log})
}

type handlers struct{ eng *engine.Engine }

// SubmitIn is submit_job's input.
type SubmitIn struct {
	Manifest       delegate.Manifest `json:"manifest"`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"retrying with the same key returns the same job"`
}

// SubmitOut is submit_job's output.
type SubmitOut struct {
	JobID  string          `json:"job_id"`
	Status delegate.Status `json:"status"`
}

func (h *handlers) submit(ctx context.Context, _ *mcp.CallToolRequest, in SubmitIn) (*mcp.CallToolResult, SubmitOut, error) {
	job, err := h.eng.SubmitWith(ctx, in.Manifest, engine.SubmitOptions{IdempotencyKey: in.IdempotencyKey})
	if err != nil {
		return nil, SubmitOut{}, toolError(err)
	}
	return nil, SubmitOut{JobID: job.ID, Status: job.Status}, nil
}

// JobIn names a job.
type JobIn struct {
	JobID string `json:"job_id" jsonschema:"the job_id returned by submit_job"`
}

// StatusOut is a job's status.
type StatusOut struct {
	JobID           string          `json:"job_id"`
	Status          delegate.Status `json:"status"`
	Progress        string          `json:"progress,omitempty"`
	Error           string          `json:"error,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
	DurationSeconds float64         `json:"duration_seconds"`
	OutputBytes     int64           `json:"output_bytes"`
	LastHeartbeat   *time.Time      `json:"last_heartbeat,omitempty"`
	// Timeline is kept in statusMode detailed.
	Timeline []delegate.Event `json:"timeline,omitempty"`
}

func statusOf(j *delegate.Job) StatusOut {
	return StatusOut{
		JobID: j.ID, Status: j.Status, Progress: j.Progress, Error: j.Error,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt,
		StartedAt: timePtr(j.StartedAt), FinishedAt: timePtr(j.FinishedAt),
		DurationSeconds: seconds(j.Duration(time.Now())), OutputBytes: j.OutputBytes,
		LastHeartbeat: timePtr(j.LastHeartbeat),
	}
}

// fullStatus adds the timeline of a detailed job.
func fullStatus(ctx context.Context, eng *engine.Engine, j *delegate.Job) (StatusOut, error) {
	out := statusOf(j)
	if j.Manifest.StatusMode != delegate.StatusModeSimple {
		evs, err := eng.Events(ctx, j.ID)
		if err != nil {
			return out, err
		}
		out.Timeline = evs
	}
	return out, nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func seconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func (h *handlers) status(ctx context.Context, _ *mcp.CallToolRequest, in JobIn) (*mcp.CallToolResult, StatusOut, error) {
	j, err := h.eng.Get(ctx, in.JobID)
	if err != nil {
		return nil, StatusOut{}, toolError(err)
	}
	out, err := fullStatus(ctx, h.eng, j)
	return nil, out, err
}

// WaitIn is wait_job's input.
type WaitIn struct {
	JobID          string `json:"job_id"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

// WaitOut is where a job is after wait_job: small, because the next call
// is get_job_result (or another wait).
type WaitOut struct {
	JobID    string          `json:"job_id"`
	Status   delegate.Status `json:"status"`
	Progress string          `json:"progress,omitempty"`
	Error    string          `json:"error,omitempty"`
	Done     bool            `json:"done"`
}

func (h *handlers) wait(ctx context.Context, req *mcp.CallToolRequest, in WaitIn) (*mcp.CallToolResult, WaitOut, error) {
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxWait {
		return nil, WaitOut{}, fmt.Errorf("timeout_seconds: must be between 1 and %d (got %d)", maxWait, in.TimeoutSeconds)
	}
	wait := time.Duration(in.TimeoutSeconds) * time.Second
	if wait == 0 {
		wait = maxWait * time.Second
	}
	if _, err := h.eng.Get(ctx, in.JobID); err != nil {
		return nil, WaitOut{}, toolError(err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	token := req.Params.GetProgressToken()
	if token != nil {
		go h.reportProgress(wctx, req, token, in.JobID)
	}
	j, err := h.eng.Wait(wctx, in.JobID)
	if err != nil && ctx.Err() == nil {
		return nil, WaitOut{}, toolError(err)
	}
	if j == nil {
		return nil, WaitOut{}, fmt.Errorf("wait cancelled by the client")
	}
	return nil, WaitOut{JobID: j.ID, Status: j.Status, Progress: j.Progress, Error: j.Error, Done: j.Status.Terminal()}, nil
}

// reportProgress sends a progress notification whenever the job's stored
// progress changes, for clients that asked for them.
func (h *handlers) reportProgress(ctx context.Context, req *mcp.CallToolRequest, token any, id string) {
	last := ""
	for n := 1; ; n++ {
		changed := h.eng.Changed()
		if j, err := h.eng.Get(ctx, id); err == nil && !j.Status.Terminal() {
			msg := string(j.Status)
			if j.Progress != "" && j.Progress != msg {
				msg += ": " + j.Progress
			}
			if msg != last {
				last = msg
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// ResultIn is get_job_result's input.
type ResultIn struct {
	JobID          string `json:"job_id"`
	MaxOutputBytes int    `json:"max_output_bytes,omitempty"`
}

// ResultOut is a finished job's result.
type ResultOut struct {
	JobID           string              `json:"job_id"`
	Status          delegate.Status     `json:"status"`
	ExitCode        *int                `json:"exit_code,omitempty"`
	Output          string              `json:"output"`
	OutputOffset    int64               `json:"output_offset"`
	OutputBytes     int64               `json:"output_bytes"`
	OutputTruncated bool                `json:"output_truncated"`
	Error           string              `json:"error,omitempty"`
	Result          string              `json:"result,omitempty"`
	OOMKilled       bool                `json:"oom_killed,omitempty"`
	Artifacts       []delegate.Artifact `json:"artifacts"`
	DurationSeconds float64             `json:"duration_seconds"`
}

func (h *handlers) result(ctx context.Context, _ *mcp.CallToolRequest, in ResultIn) (*mcp.CallToolResult, ResultOut, error) {
	res, err := Result(ctx, h.eng, in.JobID, in.MaxOutputBytes)
	if err != nil {
		return nil, ResultOut{}, toolError(err)
	}
	return nil, res, nil
}

// Result builds a finished job's result; the CLI uses it too.
func Result(ctx context.Context, eng *engine.Engine, id string, maxBytes int) (ResultOut, error) {
	if maxBytes < 0 {
		return ResultOut{}, &delegate.FieldError{Field: "max_output_bytes", Rule: "must be positive"}
	}
	if maxBytes == 0 {
		maxBytes = defaultResultBytes
	}
	j, err := eng.Get(ctx, id)
	if err != nil {
		return ResultOut{}, err
	}
	if !j.Status.Terminal() {
		return ResultOut{}, fmt.Errorf("job %s is %s: %w; call wait_job (or get_job_status) until it finishes", id, j.Status, delegate.ErrNotFinished)
	}
	kept, err := eng.OutputSize(ctx, id)
	if err != nil {
		return ResultOut{}, err
	}
	offset := max(0, kept-int64(maxBytes))
	out, err := eng.Output(ctx, id, offset, maxBytes)
	if err != nil {
		return ResultOut{}, err
	}
	arts, err := eng.Artifacts(ctx, id)
	if err != nil {
		return ResultOut{}, err
	}
	return ResultOut{
		JobID: j.ID, Status: j.Status, ExitCode: j.ExitCode,
		Output: strings.ToValidUTF8(trimPartialRune(out, offset > 0), "\uFFFD"), OutputOffset: offset,
		OutputBytes: j.OutputBytes, OutputTruncated: j.OutputTruncated,
		Error: j.Error, Result: j.Result, OOMKilled: j.OOMKilled, Artifacts: arts,
		DurationSeconds: seconds(j.Duration(time.Now())),
	}, nil
}

// trimPartialRune drops a UTF-8 sequence cut in two by the offset.
func trimPartialRune(b []byte, cut bool) string {
	for cut && len(b) > 0 && !utf8.RuneStart(b[0]) {
		b = b[1:]
	}
	return string(b)
}

// CancelOut says what cancel_job did.
type CancelOut struct {
	JobID     string          `json:"job_id"`
	Status    delegate.Status `json:"status"`
	Cancelled bool            `json:"cancelled" jsonschema:"false when the job had already finished"`
}

func (h *handlers) cancel(ctx context.Context, _ *mcp.CallToolRequest, in JobIn) (*mcp.CallToolResult, CancelOut, error) {
	j, cancelled, err := h.eng.Cancel(ctx, in.JobID)
	if err != nil {
		return nil, CancelOut{}, toolError(err)
	}
	return nil, CancelOut{JobID: j.ID, Status: j.Status, Cancelled: cancelled}, nil
}

// ReleaseOut says what release_job did.
type ReleaseOut struct {
	JobID    string `json:"job_id"`
	Released bool   `json:"released" jsonschema:"false when it was already released"`
}

func (h *handlers) release(ctx context.Context, _ *mcp.CallToolRequest, in JobIn) (*mcp.CallToolResult, ReleaseOut, error) {
	j, released, err := h.eng.Release(ctx, in.JobID)
	if err != nil {
		return nil, ReleaseOut{}, toolError(err)
	}
	return nil, ReleaseOut{JobID: j.ID, Released: released}, nil
}

// ListIn is list_jobs' input.
type ListIn struct {
	Status delegate.Status `json:"status,omitempty"`
	Limit  int             `json:"limit,omitempty"`
	Cursor string          `json:"cursor,omitempty"`
}

// ListOut is one page of jobs.
type ListOut struct {
	Jobs       []JobSummary `json:"jobs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// JobSummary is a job in a list.
type JobSummary struct {
	JobID     string             `json:"job_id"`
	Status    delegate.Status    `json:"status"`
	AgentType delegate.AgentType `json:"agent_type"`
	Task      string             `json:"task"`
	CreatedAt time.Time          `json:"created_at"`
	ExitCode  *int               `json:"exit_code,omitempty"`
	// SandboxKept: a persistent job's sandbox is still there (release_job).
	SandboxKept bool `json:"sandbox_kept,omitempty"`
}

func (h *handlers) list(ctx context.Context, _ *mcp.CallToolRequest, in ListIn) (*mcp.CallToolResult, ListOut, error) {
	out, err := List(ctx, h.eng, in)
	if err != nil {
		return nil, ListOut{}, toolError(err)
	}
	return nil, out, nil
}

// List builds one page of job summaries; the CLI uses it too.
func List(ctx context.Context, eng *engine.Engine, in ListIn) (ListOut, error) {
	if in.Status != "" && !in.Status.Valid() {
		return ListOut{}, &delegate.FieldError{Field: "status", Rule: fmt.Sprintf("must be one of %s (got %q)", statusNames(), in.Status)}
	}
	if in.Limit < 0 || in.Limit > 200 {
		return ListOut{}, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and 200 (got %d)", in.Limit)}
	}
	jobs, next, err := eng.List(ctx, delegate.JobFilter{Status: in.Status, Limit: in.Limit, Cursor: in.Cursor})
	if err != nil {
		return ListOut{}, err
	}
	out := ListOut{Jobs: make([]JobSummary, 0, len(jobs)), NextCursor: next}
	for _, j := range jobs {
		task := j.Manifest.Task
		if task == "" && j.Manifest.Agent != nil {
			task = j.Manifest.Agent.Command
		}
		if r := []rune(task); len(r) > 80 {
			task = string(r[:79]) + "…"
		}
		out.Jobs = append(out.Jobs, JobSummary{JobID: j.ID, Status: j.Status, AgentType: j.Manifest.AgentType, Task: task, CreatedAt: j.CreatedAt, ExitCode: j.ExitCode,
			SandboxKept: j.Status.Terminal() && j.Manifest.Lifecycle == delegate.LifecyclePersistent && j.SandboxID != ""})
	}
	return out, nil
}

func statusNames() string {
	names := make([]string, len(delegate.Statuses))
	for i, s := range delegate.Statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// toolError turns an engine error into a message that tells the agent what
// to change.
func toolError(err error) error {
	switch {
	case errors.Is(err, delegate.ErrNotFound):
		return fmt.Errorf("job_id: %w (list_jobs shows existing jobs)", err)
	default:
		return err
	}
}

// Schemas: derived from the Go types, with the rules in descriptions. The
// rules are enforced by the domain's validation rather than as schema
// enums and bounds, because its errors name the field and say what to
// change; the SDK's schema errors do not.
func submitSchema() *jsonschema.Schema {
	s := mustSchema[SubmitIn]()
	m := s.Properties["manifest"]
	m.Description = "Job manifest. Relative file paths land in /workspace, the working directory."
	p := m.Properties
	p["agentType"].Description = "claude | script | custom"
	p["files"].Items.Properties["content"].Description = "base64"
	p["files"].Items.Properties["mode"].Description = "e.g. 0755 (default 0644)"
	p["secrets"].Description = "names of server-side secrets, injected as env vars"
	r := p["resources"]
	r.Properties["cpu"].Description = "cores (default 2)"
	r.Properties["memory"].Description = "e.g. 512M, 2G (default 2G)"
	r.Properties["disk"].Description = "size of /workspace, e.g. 1G (default 10G)"
	p["timeout"].Description = "seconds, 1..86400 (default 3600)"
	p["lifecycle"].Description = "ephemeral (default) | persistent"
	p["statusMode"].Description = "simple (default) | detailed | streaming"
	p["vmTemplate"].Description = "local backend: a rootfs directory; Proxmox: a template"
	p["artifacts"].Description = "globs under /workspace to keep, e.g. out/*.txt, **/*.log"
	p["network"].Description = "none (default) | egress (default for claude)"
	return s
}

func waitSchema() *jsonschema.Schema {
	s := mustSchema[WaitIn]()
	s.Properties["timeout_seconds"].Description = "1..50 (default 50)"
	return s
}

func listSchema() *jsonschema.Schema {
	s := mustSchema[ListIn]()
	s.Properties["status"].Description = statusNames()
	s.Properties["limit"].Description = "1..200 (default 20)"
	return s
}

func mustSchema[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(err) // a programming error in a type above
	}
	return s
}

// compact removes what costs tokens in tools/list without telling a model
// anything: "null" alternatives of optional fields (["null","array"] is
// just "array" to a caller), and, in output schemas, additionalProperties
// and required, which only a validator reads.
func compact(s *jsonschema.Schema, output bool) *jsonschema.Schema {
	if s == nil {
		return nil
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	if output {
		s.Required = nil
		if s.AdditionalProperties != nil && s.AdditionalProperties.Not != nil {
			s.AdditionalProperties = nil // the "false" schema
		}
	}
	for _, p := range s.Properties {
		compact(p, output)
	}
	compact(s.Items, output)
	if s.AdditionalProperties != nil {
		compact(s.AdditionalProperties, output)
	}
	return s
}

// outputSchema is the compact output schema of T.
func outputSchema[T any]() *jsonschema.Schema { return compact(mustSchema[T](), true) }
