// Package mcpserver exposes a delegate.JobService as MCP tools and
// resources (official go-sdk). It is an adapter: parse arguments, call the
// service, render. What a job shows, and when, is the service's rule.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is reported to clients; cmd sets it at build time.
var Version = "dev"

// maxWait keeps wait_job under the per-call timeouts of real clients
// (Claude Code gives up on a tool call after about a minute).
const maxWait = 50

// New builds the MCP server over a job service. Until ctx ends it tells
// subscribed clients about every change to a job (resources job://{id} and
// job://{id}/log).
func New(ctx context.Context, svc delegate.JobService, log *slog.Logger) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "delegate", Title: "delegate: run jobs in isolated sandboxes", Version: Version},
		&mcp.ServerOptions{
			Instructions: "Run work in a disposable isolated sandbox: submit_job returns a job_id at once; " +
				"wait_job blocks up to 50 s; get_job_result returns output and exit code.",
			Logger: log,
			// The SDK keeps the subscriptions; accepting them is enough.
			SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		})
	h := &handlers{svc: svc}
	addResources(s, svc)
	go publishUpdates(ctx, s, svc)
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
		Description:  fmt.Sprintf("Result of a finished job: exit_code, output (stdout+stderr; the last max_output_bytes, default %d), error, artifacts. Fails while it runs.", delegate.DefaultOutputTail),
		Annotations:  annotations(true, false, true),
		OutputSchema: outputSchema[ResultOut](),
	}, h.result)
	mcp.AddTool(s, &mcp.Tool{
		Name:         "get_job_logs",
		Description:  fmt.Sprintf("Output (stdout+stderr) from cursor on, at most max_bytes (default %d), and next_cursor; readable while running in statusMode streaming.", delegate.DefaultLogBytes),
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

type handlers struct{ svc delegate.JobService }

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
	job, err := h.svc.Submit(ctx, in.Manifest, delegate.SubmitOptions{IdempotencyKey: in.IdempotencyKey})
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
	// Timeline is kept in statusMode detailed and streaming.
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

// fullStatus is a job's status with its timeline.
func fullStatus(ctx context.Context, svc delegate.JobService, id string) (StatusOut, error) {
	j, err := svc.Get(ctx, id)
	if err != nil {
		return StatusOut{}, err
	}
	out := statusOf(j)
	if out.Timeline, err = svc.Timeline(ctx, id); err != nil {
		return StatusOut{}, err
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
	out, err := fullStatus(ctx, h.svc, in.JobID)
	if err != nil {
		return nil, StatusOut{}, toolError(err)
	}
	return nil, out, nil
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
	if _, err := h.svc.Get(ctx, in.JobID); err != nil {
		return nil, WaitOut{}, toolError(err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	token := req.Params.GetProgressToken()
	if token != nil {
		go h.reportProgress(wctx, req, token, in.JobID)
	}
	j, err := h.svc.Wait(wctx, in.JobID)
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
	changes := h.svc.Watch(ctx)
	// Another process sharing the store changes jobs without telling this
	// one: read again every second as well.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := ""
	for n := 1; ; n++ {
		if j, err := h.svc.Get(ctx, id); err == nil && !j.Status.Terminal() {
			msg := string(j.Status)
			if j.Progress != "" && j.Progress != msg {
				msg += ": " + j.Progress
			}
			if msg != last {
				last = msg
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg})
			}
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				break wait
			case changed, ok := <-changes:
				if !ok {
					return
				}
				if changed == id {
					break wait
				}
			}
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
	r, err := h.svc.Result(ctx, in.JobID, delegate.ResultOptions{OutputTail: in.MaxOutputBytes})
	if err != nil {
		return nil, ResultOut{}, toolError(err)
	}
	return nil, ResultOut{
		JobID: r.JobID, Status: r.Status, ExitCode: r.ExitCode,
		Output: text(r.Output), OutputOffset: r.OutputOffset,
		OutputBytes: r.OutputBytes, OutputTruncated: r.OutputTruncated,
		Error: r.Error, Result: r.Result, OOMKilled: r.OOMKilled, Artifacts: nonNil(r.Artifacts),
		DurationSeconds: seconds(r.Duration),
	}, nil
}

// nonNil makes a missing list an empty one: the schema says array, not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// text renders output as JSON text: bytes that are not UTF-8 become U+FFFD.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// CancelOut says what cancel_job did.
type CancelOut struct {
	JobID     string          `json:"job_id"`
	Status    delegate.Status `json:"status"`
	Cancelled bool            `json:"cancelled" jsonschema:"false when the job had already finished"`
}

func (h *handlers) cancel(ctx context.Context, _ *mcp.CallToolRequest, in JobIn) (*mcp.CallToolResult, CancelOut, error) {
	j, cancelled, err := h.svc.Cancel(ctx, in.JobID)
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
	j, released, err := h.svc.Release(ctx, in.JobID)
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
	page, err := h.svc.List(ctx, delegate.ListOptions{Status: in.Status, Limit: in.Limit, Cursor: in.Cursor})
	if err != nil {
		return nil, ListOut{}, toolError(err)
	}
	out := ListOut{Jobs: make([]JobSummary, 0, len(page.Jobs)), NextCursor: page.NextCursor}
	for _, j := range page.Jobs {
		out.Jobs = append(out.Jobs, JobSummary{JobID: j.ID, Status: j.Status, AgentType: j.AgentType, Task: j.Task,
			CreatedAt: j.CreatedAt, ExitCode: j.ExitCode, SandboxKept: j.SandboxKept})
	}
	return nil, out, nil
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
	case errors.Is(err, delegate.ErrNotFinished):
		return fmt.Errorf("%w (wait_job waits for it)", err)
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
	// The defaults a server configured with nothing uses.
	r.Properties["cpu"].Description = fmt.Sprintf("cores (default %d)", delegate.DefaultCPU)
	r.Properties["memory"].Description = fmt.Sprintf("e.g. 512M, 2G (default %s)", delegate.DefaultMemory)
	r.Properties["disk"].Description = fmt.Sprintf("size of /workspace, e.g. 1G (default %s)", delegate.DefaultDisk)
	p["timeout"].Description = fmt.Sprintf("seconds, 1..%d (default %d)", delegate.MaxTimeoutSeconds, delegate.DefaultTimeoutSeconds)
	p["lifecycle"].Description = "ephemeral (default) | persistent"
	p["statusMode"].Description = "simple (default) | detailed | streaming"
	p["vmTemplate"].Description = "local backend: a rootfs directory; Proxmox: a template"
	p["artifacts"].Description = "globs under /workspace to keep, e.g. out/*.txt, **/*.log"
	p["network"].Description = "none (default) | egress (default for claude)"
	return s
}

func waitSchema() *jsonschema.Schema {
	s := mustSchema[WaitIn]()
	s.Properties["timeout_seconds"].Description = fmt.Sprintf("1..%d (default %d)", maxWait, maxWait)
	return s
}

func listSchema() *jsonschema.Schema {
	s := mustSchema[ListIn]()
	s.Properties["status"].Description = statusNames()
	s.Properties["limit"].Description = fmt.Sprintf("1..%d (default %d)", delegate.MaxPageSize, delegate.DefaultPageSize)
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
