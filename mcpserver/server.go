// Package mcpserver exposes a delegate.JobService as MCP tools and
// resources (official go-sdk). It is an adapter: parse arguments, call the
// service, render. What a job shows, and when, is the service's rule.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxWait keeps wait_job under the per-call timeouts of real clients
// (Claude Code gives up on a tool call after about a minute).
const maxWait = 50

// Services are the services the MCP tools and resources use, each by
// name: cmd/ wires them (the engine is every one), so that a service the
// engine stops implementing fails the build instead of leaving a tool out
// at run time. Jobs is required; a nil other leaves out what uses it.
type Services struct {
	Jobs delegate.JobService
	// Sandboxes: open_sandbox, list_sandboxes, sandbox_files, sandbox://
	// and release_job by sandbox_id.
	Sandboxes delegate.SandboxService
	// Questions: answer_job, wait_job's questions, input_required tasks.
	Questions delegate.QuestionService
	// Network: job://{id}/network and wait_job's allow.
	Network delegate.NetworkService
	// Workspaces: job://{id}/diff and job://{id}/patch.
	Workspaces delegate.WorkspaceService
	// Checkpoints (the checkpoints toolset): sandbox_checkpoint, and
	// open_sandbox's from and count (forks). With Sandboxes only.
	Checkpoints delegate.CheckpointService
}

// Server is the MCP server over delegate's services: the SDK's server with
// the job tools and resources, and PublishUpdates, which keeps subscribed
// clients told of changes while it runs.
type Server struct {
	*mcp.Server
	jobs delegate.JobService
}

// New builds the MCP server over svc.
func New(svc Services, log *slog.Logger) *Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "delegate", Title: "delegate: run jobs in isolated sandboxes", Version: buildinfo.Version()},
		&mcp.ServerOptions{
			Instructions: "Run work in a disposable isolated sandbox: submit_job returns a job_id at once; " +
				"wait_job blocks up to 50 s (call it again while done is false) and returns the result once done: exit code, error, " +
				"the ends of stderr and output (output_uri has all); get_job_result returns it again.",
			Logger: sdkLogger(log),
			// The SDK keeps the subscriptions; accepting them is enough.
			// Only to what the principal may read: another's job id is
			// not found here either (its updates would say it exists).
			SubscribeHandler: func(ctx context.Context, req *mcp.SubscribeRequest) error {
				return canSubscribe(ctx, svc, req.Params.URI)
			},
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
			Capabilities:       capabilities(),
		})
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handlers{svc: svc.Jobs, qs: svc.Questions, ns: svc.Network, sb: svc.Sandboxes}
	addTasks(s, h, log)
	ts := NewTools(s, log, "the sandbox backend or the job store").Scoped(delegate.ScopeJobs)
	addResources(s, svc, log)
	addSandboxTools(ts.Scoped(delegate.ScopeSandboxes), svc.Sandboxes, svc.Checkpoints)
	addTool(ts, &mcp.Tool{
		Name:         "submit_job",
		Description:  "Run a job in a new isolated sandbox; returns job_id at once. Then wait_job, get_job_result.",
		InputSchema:  submitSchema(),
		Annotations:  annotations(false, false, false, true),
		OutputSchema: submitOutputSchema(),
	}, h.submit)
	addTool(ts, &mcp.Tool{
		Name:         "wait_job",
		Description:  "Block until the job ends or asks, or timeout_seconds pass; repeat while done is false.",
		InputSchema:  waitSchema(),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[WaitOut](),
	}, h.wait)
	addTool(ts, &mcp.Tool{
		Name:         "get_job_status",
		Description:  "Status now, without waiting.",
		InputSchema:  inputSchema[JobIn](),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[StatusOut](),
	}, h.status)
	addTool(ts, &mcp.Tool{
		Name:         "get_job_result",
		Description:  "A finished job's exit code, output and stderr tails, artifacts.",
		InputSchema:  inputSchema[ResultIn](),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[ResultOut](),
	}, h.result)
	addTool(ts, &mcp.Tool{
		Name:         "get_job_logs",
		Description:  "Output from cursor on; while running only in statusMode streaming.",
		InputSchema:  inputSchema[LogsIn](),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[LogsOut](),
	}, h.logs)
	addTool(ts, &mcp.Tool{
		Name:         "cancel_job",
		Description:  "Kill an unfinished job; its sandbox goes unless persistent.",
		InputSchema:  inputSchema[JobIn](),
		Annotations:  annotations(false, true, true, false),
		OutputSchema: outputSchema[CancelOut](),
	}, h.cancel)
	addReleaseTool(ts, h)
	addAnswerTool(ts, h)
	addTool(ts, &mcp.Tool{
		Name:         "list_jobs",
		Description:  "Jobs, newest first.",
		InputSchema:  listSchema(),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[ListOut](),
	}, h.list)
	// Last, so that it is outermost: every method, the task methods
	// included, sees the request's principal.
	s.AddReceivingMiddleware(principals)
	return &Server{Server: s, jobs: svc.Jobs}
}

// PublishUpdates sends notifications/resources/updated for a job's
// status, log and network resources whenever the service changes the
// job, until ctx ends (it returns nil then). The SDK delivers them only
// to the sessions subscribed to that URI. Run it beside the server, in
// the program's group.
func (s *Server) PublishUpdates(ctx context.Context) error {
	for id := range s.jobs.Watch(ctx) {
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id})
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id + "/log"})
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id + "/network"})
	}
	return nil
}

// capabilities are the SDK's defaults (logging; tools and resources are
// added as they are registered) and the Tasks extension.
func capabilities() *mcp.ServerCapabilities {
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}}
	caps.AddExtension(TasksExtension, nil)
	return caps
}

// annotations states every hint whose default would be wrong. The job
// tools act on delegate's own jobs (a closed world); submit_job's jobs may
// reach the network, which the default (open) says. A destructive hint is
// given only where it is not the default (true) and where it counts (not
// on read-only tools).
func annotations(readOnly, destructive, idempotent, openWorld bool) *mcp.ToolAnnotations {
	a := &mcp.ToolAnnotations{ReadOnlyHint: readOnly, IdempotentHint: idempotent}
	if !readOnly && !destructive {
		a.DestructiveHint = new(false)
	}
	if !openWorld {
		a.OpenWorldHint = new(false)
	}
	return a
}

// sdkLogger is log for the SDK, one level quieter: its INFO lines are one
// per event (a notification sent, a session connected), which at INFO
// would cost a write per job change. Warnings and errors stay.
func sdkLogger(log *slog.Logger) *slog.Logger {
	if log == nil {
		return nil
	}
	return slog.New(quieter{log.Handler()})
}

type quieter struct{ slog.Handler }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool {
	return q.Handler.Enabled(ctx, demote(l))
}

func (q quieter) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return q.Handler.Handle(ctx, r)
}

func (q quieter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quieter{q.Handler.WithAttrs(attrs)}
}
func (q quieter) WithGroup(name string) slog.Handler { return quieter{q.Handler.WithGroup(name)} }

// HTTPHandler serves MCP over Streamable HTTP: protocol 2026-07-28
// statelessly (the only way the SDK serves it over HTTP: each POST is a
// whole request, cancelled when its client goes away), the older
// protocols with stateful sessions, so that their cancellation and
// subscriptions work. Messages are read by limitBodies first (sizes, JSON
// rules), with the default Limits.
func HTTPHandler(s *mcp.Server, sessionTimeout time.Duration, log *slog.Logger) http.Handler {
	lim := Limits{}.withDefaults()
	server := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(server,
		&mcp.StreamableHTTPOptions{SessionTimeout: sessionTimeout, Logger: sdkLogger(log), MaxRequestBodyBytes: lim.MaxMessage})
	stateless := mcp.NewStreamableHTTPHandler(server,
		&mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true, Logger: sdkLogger(log), MaxRequestBodyBytes: lim.MaxMessage})
	return limitBodies(withTokenInfo(byProtocol(stateless, stateful)), lim, log)
}

// handlers are the job tools' handlers over the services they use.
type handlers struct {
	svc delegate.JobService
	qs  delegate.QuestionService // nil: a service that takes no questions
	ns  delegate.NetworkService  // nil: no egress proxy
	sb  delegate.SandboxService  // nil: no kept sandboxes
}

// SubmitIn is submit_job's input.
type SubmitIn struct {
	Manifest delegate.Manifest `json:"manifest"`
	// IdempotencyKey: a retry with the same key returns the same job.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// SubmitOut is submit_job's output.
type SubmitOut struct {
	JobID  string          `json:"job_id"`
	Status delegate.Status `json:"status"`
}

func (h *handlers) submit(ctx context.Context, _ *mcp.CallToolRequest, in *SubmitIn) (SubmitOut, error) {
	if in.Manifest.Sandbox != "" || in.Manifest.Lifecycle == delegate.LifecyclePersistent {
		if err := need(ctx, delegate.ScopeSandboxes, "a job in, or keeping, a sandbox"); err != nil {
			return SubmitOut{}, err
		}
	}
	job, err := h.svc.Submit(ctx, in.Manifest, delegate.SubmitOptions{IdempotencyKey: in.IdempotencyKey})
	if err != nil {
		return SubmitOut{}, err
	}
	return SubmitOut{JobID: job.ID, Status: job.Status}, nil
}

// JobIn names a job.
type JobIn struct {
	JobID string `json:"job_id"`
}

// The outputs of the tools that take a job_id do not repeat it: the
// caller has it, and every byte of an output is read by a model.

// StatusOut is a job's status.
type StatusOut struct {
	Status          delegate.Status `json:"status"`
	Progress        string          `json:"progress,omitempty"`
	Error           string          `json:"error,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
	DurationSeconds float64         `json:"duration_seconds"`
	OutputBytes     int64           `json:"output_bytes"`
	// Timeline is kept in statusMode detailed and streaming: the newest
	// entries; TimelineDropped counts the older ones dropped.
	Timeline        []delegate.Event `json:"timeline,omitempty"`
	TimelineDropped int64            `json:"timeline_dropped,omitempty"`
	// SandboxID is the kept sandbox the job ran in or made.
	SandboxID string `json:"sandbox_id,omitempty"`
}

func statusOf(j *delegate.Job) StatusOut {
	return StatusOut{
		Status: j.Status, Progress: newsOf(j), Error: j.Error, CreatedAt: msec(j.CreatedAt),
		StartedAt: timePtr(j.StartedAt), FinishedAt: timePtr(j.FinishedAt),
		DurationSeconds: seconds(j.Duration(time.Now())), OutputBytes: j.OutputBytes,
		TimelineDropped: j.TimelineDropped, SandboxID: j.Sandbox,
	}
}

// fullStatus is a job's status with its timeline.
func fullStatus(ctx context.Context, svc delegate.JobService, id string) (StatusOut, error) {
	j, err := svc.Get(ctx, id)
	if err != nil {
		return StatusOut{}, err
	}
	out := statusOf(j)
	// A job in statusMode simple keeps no timeline: no need to ask.
	if j.Manifest.StatusMode != delegate.StatusModeSimple {
		if out.Timeline, err = svc.Timeline(ctx, id); err != nil {
			return StatusOut{}, err
		}
		for i := range out.Timeline {
			out.Timeline[i].Time = msec(out.Timeline[i].Time)
		}
	}
	return out, nil
}

// newsOf is a job's progress when it says more than its status does
// ("running" while running says nothing).
func newsOf(j *delegate.Job) string {
	if j.Progress == string(j.Status) {
		return ""
	}
	return j.Progress
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = msec(t)
	return &t
}

// msec drops what is below the millisecond: "…:38.904Z", not
// "…:38.904226827Z". An agent has no use for the nanoseconds and pays for
// each of their digits, twice a time (text and structured content).
func msec(t time.Time) time.Time { return t.Truncate(time.Millisecond) }

func seconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func (h *handlers) status(ctx context.Context, _ *mcp.CallToolRequest, in *JobIn) (StatusOut, error) {
	return fullStatus(ctx, h.svc, in.JobID)
}

// WaitIn is wait_job's input.
type WaitIn struct {
	JobID          string `json:"job_id"`
	TimeoutSeconds *int   `json:"timeout_seconds,omitempty" delegate:"seconds"`
	// Allow widens the running job's network allowlist before the wait.
	Allow []string `json:"allow,omitempty"`
}

// WaitOut is where a job is after wait_job; once the job has ended,
// Result is get_job_result's answer (a ResultOut, its schema left open:
// tools/list's budget), so that the wait that ends also answers.
type WaitOut struct {
	Status   delegate.Status `json:"status"`
	Done     bool            `json:"done"`
	Error    string          `json:"error,omitempty"`
	Progress string          `json:"progress,omitempty"`
	// Questions the job waits for answers to (answer_job): wait_job
	// returns at once while there are any.
	Questions []QuestionOut `json:"questions,omitempty"`
	Result    any           `json:"result,omitempty"` // a *ResultOut`
}

func (h *handlers) wait(ctx context.Context, req *mcp.CallToolRequest, in *WaitIn) (WaitOut, error) {
	wait := maxWait * time.Second
	if t := in.TimeoutSeconds; t != nil {
		if *t < 1 || *t > maxWait {
			return WaitOut{}, &delegate.FieldError{Field: "timeout_seconds", Rule: fmt.Sprintf("must be between 1 and %d (got %d; leave it out for %d)", maxWait, *t, maxWait)}
		}
		wait = time.Duration(*t) * time.Second
	}
	if _, err := h.svc.Get(ctx, in.JobID); err != nil {
		return WaitOut{}, err
	}
	if len(in.Allow) > 0 {
		ns := h.ns
		if ns == nil {
			return WaitOut{}, &delegate.FieldError{Field: "allow", Rule: "this server has no egress proxy whose allowlists could be widened"}
		}
		if _, err := ns.AllowNetwork(ctx, in.JobID, in.Allow, "mcp"); err != nil {
			return WaitOut{}, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	// The progress reports end with the call, which waits for them.
	var reports sync.WaitGroup
	defer reports.Wait()
	defer cancel()
	if token := req.Params.GetProgressToken(); token != nil {
		reports.Go(func() { h.reportProgress(wctx, req, token, in.JobID) })
	}
	j, questions, err := h.waitOrAsk(wctx, in.JobID)
	if err != nil && ctx.Err() == nil {
		return WaitOut{}, err
	}
	if j == nil {
		return WaitOut{}, fmt.Errorf("wait cancelled by the client")
	}
	out := WaitOut{Status: j.Status, Progress: newsOf(j), Error: j.Error, Done: j.Status.Terminal(), Questions: questions}
	if out.Done {
		res, err := h.result(ctx, nil, &ResultIn{JobID: in.JobID})
		if err != nil {
			return WaitOut{}, err
		}
		out.Result = &res
	}
	return out, nil
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
	JobID string `json:"job_id"`
	// MaxOutputBytes is how much of the end of stdout to show inline
	// (inlineOutput when 0); stderr's tail gets half of it.
	MaxOutputBytes int `json:"max_output_bytes,omitempty"`
}

// inlineOutput is how much of the end of a job's stdout a result shows
// when the caller does not say: 4 KiB, the end of a test run's report,
// where its summary is. A client puts a tool's whole answer into its
// model's context (Claude Code does not cap it), so the rest is read on
// demand: output_uri.
const inlineOutput = 4 << 10

// ResultOut is a finished job's result. Its fields are in the order a
// reader needs them, and the JSON keeps that order (a client that
// previews the start of an answer shows the exit code, not the output):
// how the job ended, the sizes, stderr's tail, then stdout's.
type ResultOut struct {
	Status delegate.Status `json:"status"`
	// ExitCode is the status the job's process ended with (137: killed),
	// ExitReason why: exited, oom, timeout, cancelled, none.
	ExitCode        *int                `json:"exit_code,omitempty"`
	ExitReason      delegate.ExitReason `json:"exit_reason,omitempty"`
	Error           string              `json:"error,omitempty"`
	OOMKilled       bool                `json:"oom_killed,omitempty"`
	DurationSeconds float64             `json:"duration_seconds"`
	// OutputBytes counts all the job wrote to both streams;
	// OutputTruncated says that Output and Stderr do not show all of it
	// (they show the ends, from a line's start), and OutputURI is then
	// the resource with all that was kept (both streams, interleaved).
	OutputBytes     int64  `json:"output_bytes"`
	OutputTruncated bool   `json:"output_truncated"`
	OutputURI       string `json:"output_uri,omitempty"`
	// Stderr is the end of the kept stderr, Output of the kept stdout
	// (delegate.JobResult says why apart; get_job_logs has the two
	// interleaved).
	Stderr string `json:"stderr"`
	Result string `json:"result,omitempty"`
	// Cache names the caches the job had an empty one of instead of its
	// project's, and why (delegate.JobResult.CacheMissed).
	Cache string `json:"cache,omitempty"`
	// SandboxID is the kept sandbox the job ran in or made.
	SandboxID string `json:"sandbox_id,omitempty"`
	// Artifacts are read as resources: job://{id}/artifacts/{name}.
	Artifacts []delegate.Artifact `json:"artifacts"`
	// Changes are what the job changed in its workspace (a job with
	// manifest.workspace: delegate.WorkspaceChanges); the diff is
	// job://{id}/diff, the patch job://{id}/patch. Its schema is left
	// open: tools/list's budget is spent, and the values name themselves.
	Changes json.RawMessage `json:"changes,omitempty"`
	// Network is a *delegate.NetworkResult for a job whose network went
	// through the egress proxy: its counts and denied attempts (the whole
	// log is job://{id}/network). Untyped here, so that tools/list does
	// not spell its fields out.
	Network json.RawMessage `json:"network,omitempty"`
	Output  string          `json:"output"`
}

func (h *handlers) result(ctx context.Context, _ *mcp.CallToolRequest, in *ResultIn) (ResultOut, error) {
	if in.MaxOutputBytes < 0 {
		return ResultOut{}, &delegate.FieldError{Field: "max_output_bytes", Rule: fmt.Sprintf("must be positive (got %d)", in.MaxOutputBytes)}
	}
	limit := in.MaxOutputBytes
	if limit == 0 {
		limit = inlineOutput
	}
	errLimit := max(limit/2, 1)
	// One byte more than is shown: whether the tail starts a line.
	tail := max(limit, errLimit) + 1
	r, err := h.svc.Result(ctx, in.JobID, delegate.ResultOptions{OutputTail: tail})
	if err != nil {
		return ResultOut{}, err
	}
	out, outCut := lineTail(r.Output, r.OutputOffset, limit)
	errs, errCut := lineTail(r.Stderr, r.StderrOffset, errLimit)
	artifacts := r.Artifacts
	if artifacts == nil {
		artifacts = []delegate.Artifact{} // the schema says array, not null
	}
	res := ResultOut{
		Status: r.Status, ExitCode: r.ExitCode, ExitReason: r.ExitReason, Error: r.Error, OOMKilled: r.OOMKilled,
		DurationSeconds: seconds(r.Duration), OutputBytes: r.OutputBytes,
		OutputTruncated: r.OutputTruncated || r.OutputLostBytes > 0 || outCut || errCut,
		Stderr:          text(errs), Result: r.Result, Cache: r.CacheMissed, SandboxID: r.Sandbox, Artifacts: artifacts,
		Changes: untyped(r.Changes), Network: untyped(r.Network), Output: text(out),
	}
	if res.OutputTruncated {
		res.OutputURI = "job://" + in.JobID + "/log"
	}
	return res, nil
}

// lineTail is the end of a stream, at most limit bytes of it, from the
// start of a line: b is the stream's end from offset on, read a byte
// longer than limit, so that the byte before what is shown tells whether
// it starts a line. A tail of one long line is cut where the limit falls
// (after a whole character). cut says whether any of the stream is left
// out.
func lineTail(b []byte, offset int64, limit int) (shown []byte, cut bool) {
	if offset == 0 && len(b) <= limit {
		return b, false
	}
	if len(b) > limit+1 {
		b = b[len(b)-limit-1:]
	}
	if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
		return b[i+1:], true
	}
	if len(b) > limit {
		b = b[len(b)-limit:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return b, true
}

// untyped is a part of a result as JSON whose schema tools/list leaves
// open (nil for none, which omitempty leaves out).
func untyped[T any](v *T) json.RawMessage {
	if v == nil {
		return nil
	}
	data, _ := json.Marshal(v)
	return data
}

// text renders output as JSON text: bytes that are not UTF-8 become U+FFFD.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// CancelOut says what cancel_job did.
type CancelOut struct {
	Status    delegate.Status `json:"status"`
	Cancelled bool            `json:"cancelled"` // false when the job had already finished
}

func (h *handlers) cancel(ctx context.Context, _ *mcp.CallToolRequest, in *JobIn) (CancelOut, error) {
	j, cancelled, err := h.svc.Cancel(ctx, in.JobID)
	if err != nil {
		return CancelOut{}, err
	}
	return CancelOut{Status: j.Status, Cancelled: cancelled}, nil
}

// ReleaseOut says what release_job did.
type ReleaseOut struct {
	Released bool `json:"released"` // false when it was already released
}

func (h *handlers) release(ctx context.Context, _ *mcp.CallToolRequest, in *JobIn) (ReleaseOut, error) {
	_, released, err := h.svc.Release(ctx, in.JobID)
	if err != nil {
		return ReleaseOut{}, err
	}
	return ReleaseOut{Released: released}, nil
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
	// ExitReason: why it ended (exit, timeout, cancelled, ...), as
	// get_job_result says.
	ExitReason delegate.ExitReason `json:"exit_reason,omitempty"`
	// SandboxKept: a persistent job's sandbox is still there (release_job).
	SandboxKept bool `json:"sandbox_kept,omitempty"`
	// Principal is whose job it is: shown to an operator (admin scope),
	// who lists everyone's (and so left out of the output schema).
	Principal string `json:"principal,omitempty" delegate:"operator"`
}

func (h *handlers) list(ctx context.Context, _ *mcp.CallToolRequest, in *ListIn) (ListOut, error) {
	page, err := h.svc.List(ctx, delegate.ListOptions{Status: in.Status, Limit: in.Limit, Cursor: in.Cursor})
	if err != nil {
		return ListOut{}, err
	}
	out := ListOut{Jobs: make([]JobSummary, 0, len(page.Jobs)), NextCursor: page.NextCursor}
	operator := delegate.PrincipalOf(ctx).Admin()
	for _, j := range page.Jobs {
		s := JobSummary{JobID: j.ID, Status: j.Status, AgentType: j.AgentType, Task: j.Task,
			CreatedAt: msec(j.CreatedAt), ExitCode: j.ExitCode, ExitReason: j.ExitReason, SandboxKept: j.SandboxKept}
		if operator {
			s.Principal = j.Principal
		}
		out.Jobs = append(out.Jobs, s)
	}
	return out, nil
}

// submitSchema: the manifest's fields, with what each one means. The
// docs/manifest.md has the details; the defaults quoted are a server configured
// with nothing.
func submitSchema() *jsonschema.Schema {
	s := inputSchema[SubmitIn]()
	describe(s, map[string]string{
		"manifest.agentType":        "script (default): task runs in sh; custom: agent.command, task in $DELEGATE_TASK; claude: task is a prompt",
		"manifest.files":            "in /workspace, the cwd",
		"manifest.files.content":    "base64",
		"manifest.sandbox":          "kept sandbox to run in; its commands trust each other",
		"manifest.secrets":          "server secrets, set as env vars",
		"manifest.resources.memory": "e.g. 512M",
		"manifest.vmTemplate":       "rootfs or template name",
		"manifest.statusMode":       "detailed: timeline; streaming: live logs",
		"manifest.artifacts":        "globs of files to keep",
		"manifest.stdin":            "base64, ≤1 MiB",
	})
	oneOf(s, "manifest.agentType", delegate.AgentScript, delegate.AgentCustom, delegate.AgentClaude)
	oneOf(s, "manifest.lifecycle", delegate.LifecycleEphemeral, delegate.LifecyclePersistent)
	oneOf(s, "manifest.statusMode", delegate.StatusModeSimple, delegate.StatusModeDetailed, delegate.StatusModeStreaming)
	networkSchema(at(s, "manifest.network"))
	durations(s, map[string]string{"manifest.timeout": fmt.Sprintf("seconds or 10m, default %d", delegate.DefaultTimeoutSeconds)})
	return s
}

// waitSchema: timeout_seconds takes "30s" too; the tool's description
// says the rest (tools/list's budget).
func waitSchema() *jsonschema.Schema {
	s := inputSchema[WaitIn]()
	durations(s, map[string]string{"timeout_seconds": fmt.Sprintf("≤%d", maxWait)})
	return s
}

// durations makes integer properties durations, as the decoder takes
// them (delegate:"seconds": an integer of seconds, or a string like
// "10m"): the type goes, the description says both. The description must
// not be empty: a schema with nothing in it is written as true, which
// JSON Schema allows but MCP clients refuse (the conformance suite's
// tools-list: a property's schema must be an object; TestSchemasAreObjects).
func durations(s *jsonschema.Schema, descriptions map[string]string) {
	for path, d := range descriptions {
		p := at(s, path)
		p.Type, p.Description = "", d
	}
}

// networkSchema: "none", "egress", or an allowlist object.
func networkSchema(p *jsonschema.Schema) {
	*p = jsonschema.Schema{AnyOf: []*jsonschema.Schema{
		{Enum: []any{string(delegate.NetworkNone), string(delegate.NetworkEgress)}},
		// An object and an array without their types, like the other
		// nested schemas (their properties and items show them).
		{Properties: map[string]*jsonschema.Schema{
			"allow": {Items: &jsonschema.Schema{Type: "string"}, Description: "pypi.org, *.x.org, h:443"},
			"ask":   {Type: "boolean"},
		}},
	}}
}

func listSchema() *jsonschema.Schema {
	s := inputSchema[ListIn]()
	oneOf(s, "status", delegate.Statuses...)
	return s
}
