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

// New builds the MCP server for an engine.
func New(eng *engine.Engine, log *slog.Logger) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "delegate", Title: "delegate: run jobs in isolated sandboxes", Version: Version},
		&mcp.ServerOptions{
			Instructions: "Run work in a disposable isolated sandbox: submit_job returns a job_id at once; " +
				"wait_job blocks up to 50 s; get_job_result returns output and exit code.",
			Logger: log,
		})
	h := &handlers{eng: eng}
	mcp.AddTool(s, &mcp.Tool{
		Name: "submit_job",
		Description: "Start a job in a new isolated sandbox (no network; cwd /workspace); returns job_id at once. " +
			"script: task via /bin/sh -c; custom: agent.command, task in $DELEGATE_TASK; claude: Claude CLI, task as prompt.",
		InputSchema: submitSchema(),
		Annotations: annotations(false, false, false),
	}, h.submit)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "get_job_status",
		Description: "A job's status (pending, provisioning, running, success, failed, timeout, cancelled), progress and timestamps.",
		Annotations: annotations(true, false, true),
	}, h.status)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "wait_job",
		Description: "Wait until a job finishes or timeout_seconds (default and max 50) pass; returns its status. Then call get_job_result.",
		InputSchema: waitSchema(),
		Annotations: annotations(true, false, true),
	}, h.wait)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "get_job_result",
		Description: "Result of a finished job: exit_code, output (stdout+stderr; the last max_output_bytes, default 65536), error, artifacts. Fails while it runs.",
		Annotations: annotations(true, false, true),
	}, h.result)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "cancel_job",
		Description: "Kill an unfinished job's processes and destroy its sandbox. A finished job is left as it is.",
		Annotations: annotations(false, true, true),
	}, h.cancel)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_jobs",
		Description: "Jobs newest first, optionally only one status; pass next_cursor back as cursor for the next page.",
		InputSchema: listSchema(),
		Annotations: annotations(true, false, true),
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
	Manifest delegate.Manifest `json:"manifest"`
}

// SubmitOut is submit_job's output.
type SubmitOut struct {
	JobID  string          `json:"job_id"`
	Status delegate.Status `json:"status"`
}

func (h *handlers) submit(ctx context.Context, _ *mcp.CallToolRequest, in SubmitIn) (*mcp.CallToolResult, SubmitOut, error) {
	job, err := h.eng.Submit(ctx, in.Manifest)
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
}

func statusOf(j *delegate.Job) StatusOut {
	return StatusOut{
		JobID: j.ID, Status: j.Status, Progress: j.Progress, Error: j.Error,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt,
		StartedAt: timePtr(j.StartedAt), FinishedAt: timePtr(j.FinishedAt),
		DurationSeconds: seconds(j.Duration(time.Now())), OutputBytes: j.OutputBytes,
	}
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
	return nil, statusOf(j), nil
}

// WaitIn is wait_job's input.
type WaitIn struct {
	JobID          string `json:"job_id"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

func (h *handlers) wait(ctx context.Context, req *mcp.CallToolRequest, in WaitIn) (*mcp.CallToolResult, StatusOut, error) {
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxWait {
		return nil, StatusOut{}, fmt.Errorf("timeout_seconds: must be between 1 and %d (got %d)", maxWait, in.TimeoutSeconds)
	}
	wait := time.Duration(in.TimeoutSeconds) * time.Second
	if wait == 0 {
		wait = maxWait * time.Second
	}
	if _, err := h.eng.Get(ctx, in.JobID); err != nil {
		return nil, StatusOut{}, toolError(err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	token := req.Params.GetProgressToken()
	if token != nil {
		go h.reportProgress(wctx, req, token, in.JobID)
	}
	j, err := h.eng.Wait(wctx, in.JobID)
	if err != nil && ctx.Err() == nil {
		return nil, StatusOut{}, toolError(err)
	}
	if j == nil {
		return nil, StatusOut{}, fmt.Errorf("wait cancelled by the client")
	}
	return nil, statusOf(j), nil
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
	JobID           string          `json:"job_id"`
	Status          delegate.Status `json:"status"`
	ExitCode        *int            `json:"exit_code,omitempty"`
	Output          string          `json:"output"`
	OutputOffset    int64           `json:"output_offset"`
	OutputBytes     int64           `json:"output_bytes"`
	OutputTruncated bool            `json:"output_truncated"`
	Error           string          `json:"error,omitempty"`
	OOMKilled       bool            `json:"oom_killed,omitempty"`
	Artifacts       []Artifact      `json:"artifacts"`
	DurationSeconds float64         `json:"duration_seconds"`
}

// Artifact is a file collected from the job's workspace.
type Artifact struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
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
	kept := min(j.OutputBytes, int64(eng.OutputLimit()))
	offset := max(0, kept-int64(maxBytes))
	out, err := eng.Output(ctx, id, offset, maxBytes)
	if err != nil {
		return ResultOut{}, err
	}
	return ResultOut{
		JobID: j.ID, Status: j.Status, ExitCode: j.ExitCode,
		Output: strings.ToValidUTF8(trimPartialRune(out, offset > 0), "\uFFFD"), OutputOffset: offset,
		OutputBytes: j.OutputBytes, OutputTruncated: j.OutputTruncated,
		Error: j.Error, OOMKilled: j.OOMKilled, Artifacts: []Artifact{},
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
		out.Jobs = append(out.Jobs, JobSummary{JobID: j.ID, Status: j.Status, AgentType: j.Manifest.AgentType, Task: task, CreatedAt: j.CreatedAt, ExitCode: j.ExitCode})
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
	p["task"].Description = "The work: shell script (script), prompt (claude), or data in $DELEGATE_TASK (custom)."
	p["agentType"].Description = "claude | script | custom"
	p["files"].Items.Properties["content"].Description = "base64"
	p["files"].Items.Properties["mode"].Description = "e.g. 0755 (default 0644)"
	p["secrets"].Description = "names of secrets set on the server; injected as env vars"
	r := p["resources"]
	r.Properties["cpu"].Description = "cores (default 2)"
	r.Properties["memory"].Description = "e.g. 512M, 2G (default 2G)"
	r.Properties["disk"].Description = "size of /workspace, e.g. 1G (default 10G)"
	p["timeout"].Description = "seconds, 1..86400 (default 3600)"
	p["lifecycle"].Description = "ephemeral (default) | persistent"
	p["statusMode"].Description = "simple (default) | detailed | streaming"
	p["vmTemplate"].Description = "local backend: a rootfs directory; Proxmox: a template"
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
