package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Kept sandboxes: three tools beside the job tools, offered with
// Services.Sandboxes (the engine, as cmd/ wires it), and release_job releases
// them too. A command in a kept sandbox is a job (submit_job with
// manifest.sandbox), so every job tool works on it unchanged; these tools
// only open and describe a sandbox and reach its files. Every agent
// session pays for each tool (TestToolsListSize): a fourth tool to
// release one would repeat release_job, which a persistent job's kept
// sandbox needs anyway.

// sandboxTools are the tools whose not-found errors are about their
// sandbox_id.
var sandboxTools = map[string]bool{"list_sandboxes": true, "sandbox_files": true}

// addReleaseTool adds release_job: with sandboxes, it releases a kept
// sandbox by its id or by the persistent job that made it.
func addReleaseTool(ts *Tools, h *handlers) {
	sb := h.sb
	if sb == nil {
		addTool(ts, &mcp.Tool{
			Name:         "release_job",
			Description:  "Destroy the sandbox a finished persistent job kept.",
			InputSchema:  inputSchema[JobIn](),
			Annotations:  annotations(false, true, true, false),
			OutputSchema: outputSchema[ReleaseOut](),
		}, h.release)
		return
	}
	addTool(ts, &mcp.Tool{
		Name:         "release_job",
		Description:  "Destroy a kept sandbox: by sandbox_id, or a finished persistent job's by job_id.",
		InputSchema:  inputSchema[ReleaseIn](),
		Annotations:  annotations(false, true, true, false),
		OutputSchema: outputSchema[ReleaseOut](),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in *ReleaseIn) (ReleaseOut, error) {
		switch {
		case (in.JobID == "") == (in.SandboxID == ""):
			return ReleaseOut{}, &delegate.FieldError{Field: "sandbox_id", Rule: "give sandbox_id or job_id, one of them"}
		case in.JobID != "":
			return h.release(ctx, req, &JobIn{JobID: in.JobID})
		}
		if err := need(ctx, delegate.ScopeSandboxes, "release_job of a sandbox_id"); err != nil {
			return ReleaseOut{}, err
		}
		_, released, err := sb.ReleaseSandbox(ctx, in.SandboxID)
		if err != nil {
			return ReleaseOut{}, err
		}
		return ReleaseOut{Released: released}, nil
	})
}

// ReleaseIn is release_job's input when the service keeps sandboxes.
type ReleaseIn struct {
	JobID     string `json:"job_id,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

func addSandboxTools(ts *Tools, sb delegate.SandboxService, cs delegate.CheckpointService) {
	if sb == nil {
		return
	}
	h := &sandboxHandlers{svc: sb}
	if cs == nil {
		addTool(ts, &mcp.Tool{
			Name:        "open_sandbox",
			Description: "A sandbox for many commands (submit_job manifest.sandbox) and sandbox_files; pauses when idle.",
			InputSchema: openSandboxSchema(),
			// Closed world: it runs nothing (commands are submit_job's).
			Annotations:  annotations(false, false, false, false),
			OutputSchema: outputSchema[OpenSandboxOut](),
		}, h.open)
	} else {
		addTool(ts, &mcp.Tool{
			Name:         "open_sandbox",
			Description:  "A sandbox for many commands (submit_job manifest.sandbox) and sandbox_files; pauses when idle. from and count fork one.",
			InputSchema:  forkSandboxSchema(),
			Annotations:  annotations(false, false, false, false),
			OutputSchema: outputSchema[ForkSandboxOut](),
		}, (&checkpointHandlers{svc: cs}).open(h.open))
		addCheckpointTool(ts, cs)
	}
	addTool(ts, &mcp.Tool{
		Name:         "list_sandboxes",
		Description:  "Kept sandboxes, or the one sandbox_id names.",
		InputSchema:  inputSchema[ListSandboxesIn](),
		Annotations:  annotations(true, false, true, false),
		OutputSchema: outputSchema[ListSandboxesOut](),
	}, h.list)
	addTool(ts, &mcp.Tool{
		Name:         "sandbox_files",
		Description:  "A sandbox's /workspace files. read: ≤1 MiB at offset, as text or (not UTF-8) content; next_offset until eof.",
		InputSchema:  filesSchema(),
		Annotations:  annotations(false, false, true, false),
		OutputSchema: outputSchema[FilesOut](),
	}, h.files)
	addSandboxResource(ts.server, sb, ts.log)
}

type sandboxHandlers struct{ svc delegate.SandboxService }

// OpenSandboxIn is open_sandbox's input: delegate.SandboxSpec without the
// pause timeout, which is the operator's.
type OpenSandboxIn struct {
	Resources   *delegate.Resources `json:"resources,omitempty"`
	VMTemplate  string              `json:"vmTemplate,omitempty"`
	Network     delegate.Network    `json:"network,omitempty"`
	IdleTimeout int                 `json:"idle_timeout,omitempty" delegate:"seconds"`
	Lifetime    int                 `json:"lifetime,omitempty" delegate:"seconds"`
}

// SandboxOut is a kept sandbox as the tools show it.
type SandboxOut struct {
	SandboxID string                `json:"sandbox_id"`
	State     delegate.SandboxState `json:"state"`
	// JobID is the persistent job that made it. (Its limits are what it
	// was opened with: every byte of tools/list counts.)
	JobID      string    `json:"job_id,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	// Commands counts the commands submitted to it, Running those not ended.
	Commands int    `json:"commands"`
	Running  int    `json:"running"`
	Reason   string `json:"reason,omitempty"`
	// Principal is whose sandbox it is: shown to an operator (and so
	// left out of the output schema).
	Principal string `json:"principal,omitempty" delegate:"operator"`
}

// sandboxOf is sb as ctx's principal sees it (its owner named to an
// operator).
func sandboxOf(ctx context.Context, sb *delegate.Sandbox) SandboxOut {
	out := SandboxOut{
		SandboxID: sb.ID, State: sb.State, JobID: sb.JobID,
		CreatedAt: msec(sb.CreatedAt), LastUsedAt: msec(sb.LastUsedAt), ExpiresAt: msec(sb.ExpiresAt),
		Commands: sb.Commands, Running: sb.Running, Reason: sb.Reason,
	}
	if delegate.PrincipalOf(ctx).Admin() {
		out.Principal = sb.Principal
	}
	return out
}

// OpenSandboxOut is a sandbox just opened: what the next calls need
// (list_sandboxes has the rest).
type OpenSandboxOut struct {
	SandboxID string                `json:"sandbox_id"`
	State     delegate.SandboxState `json:"state"`
	ExpiresAt time.Time             `json:"expires_at"`
}

func (h *sandboxHandlers) open(ctx context.Context, _ *mcp.CallToolRequest, in *OpenSandboxIn) (OpenSandboxOut, error) {
	spec := delegate.SandboxSpec{Resources: in.Resources, VMTemplate: in.VMTemplate, Network: in.Network,
		IdleTimeout: in.IdleTimeout, Lifetime: in.Lifetime}
	if err := spec.Validate(); err != nil {
		return OpenSandboxOut{}, err
	}
	sb, err := h.svc.OpenSandbox(ctx, spec)
	if err != nil {
		return OpenSandboxOut{}, err
	}
	return OpenSandboxOut{SandboxID: sb.ID, State: sb.State, ExpiresAt: msec(sb.ExpiresAt)}, nil
}

// ListSandboxesIn is list_sandboxes' input.
type ListSandboxesIn struct {
	SandboxID string `json:"sandbox_id,omitempty"`
}

// ListSandboxesOut lists sandboxes, newest first.
type ListSandboxesOut struct {
	Sandboxes []SandboxOut `json:"sandboxes"`
}

func (h *sandboxHandlers) list(ctx context.Context, _ *mcp.CallToolRequest, in *ListSandboxesIn) (ListSandboxesOut, error) {
	if in.SandboxID != "" {
		sb, err := h.svc.GetSandbox(ctx, in.SandboxID)
		if err != nil {
			return ListSandboxesOut{}, err
		}
		return ListSandboxesOut{Sandboxes: []SandboxOut{sandboxOf(ctx, sb)}}, nil
	}
	list, err := h.svc.ListSandboxes(ctx, delegate.SandboxListOptions{})
	if err != nil {
		return ListSandboxesOut{}, err
	}
	out := ListSandboxesOut{Sandboxes: make([]SandboxOut, 0, len(list))}
	for i := range list {
		out.Sandboxes = append(out.Sandboxes, sandboxOf(ctx, &list[i]))
	}
	return out, nil
}

// The operations of sandbox_files.
const (
	opRead  = "read"
	opWrite = "write"
	opList  = "list"
)

// FilesIn is sandbox_files' input; which fields count depends on op.
type FilesIn struct {
	SandboxID string `json:"sandbox_id"`
	Op        string `json:"op"`
	Path      string `json:"path,omitempty"`
	// read
	Offset int64 `json:"offset,omitempty"`
	Length int64 `json:"length,omitempty"`
	// write: the bytes as base64 (Content) or as text.
	Content *string `json:"content,omitempty"`
	Text    *string `json:"text,omitempty"`
	Mode    string  `json:"mode,omitempty"`
	// list
	Depth int `json:"depth,omitempty"`
	Limit int `json:"limit,omitempty"`
}

// FilesOut is what sandbox_files did: a read's bytes (Text when they are
// UTF-8, else Content in base64) and where to read on; a write's size; a
// listing. (The read's offset is the caller's: every byte of tools/list
// counts.)
type FilesOut struct {
	Text    *string `json:"text,omitempty"`
	Content *string `json:"content,omitempty"`
	// Size is the whole file's, read or written.
	Size       *int64 `json:"size,omitempty"`
	EOF        *bool  `json:"eof,omitempty"`
	NextOffset *int64 `json:"next_offset,omitempty"`
	// Entries are a listing's; Truncated says the limit stopped it.
	Entries   []FileEntry `json:"entries,omitzero"`
	Truncated bool        `json:"truncated,omitempty"`
}

// FileEntry is an entry of a listing.
type FileEntry struct {
	Path  string    `json:"path"`
	Type  string    `json:"type"`
	Size  int64     `json:"size"`
	Mode  string    `json:"mode"` // octal permissions, e.g. 0644
	MTime time.Time `json:"mtime"`
	Link  string    `json:"link,omitempty"`
}

func (h *sandboxHandlers) files(ctx context.Context, _ *mcp.CallToolRequest, in *FilesIn) (FilesOut, error) {
	// A field of another op is a mistake worth naming: it would be
	// ignored otherwise.
	for _, f := range []struct {
		name string
		set  bool
		op   string
	}{
		{"offset", in.Offset != 0, opRead}, {"length", in.Length != 0, opRead},
		{"content", in.Content != nil, opWrite}, {"text", in.Text != nil, opWrite}, {"mode", in.Mode != "", opWrite},
		{"depth", in.Depth != 0, opList}, {"limit", in.Limit != 0, opList},
	} {
		if f.set && in.Op != f.op {
			return FilesOut{}, &delegate.FieldError{Field: f.name, Rule: "is for op " + f.op + " only"}
		}
	}
	switch in.Op {
	case opRead:
		return h.read(ctx, in)
	case opWrite:
		return h.write(ctx, in)
	case opList:
		return h.listFiles(ctx, in)
	}
	return FilesOut{}, &delegate.FieldError{Field: "op", Rule: fmt.Sprintf("must be one of read, write, list, not %q", in.Op)}
}

func (h *sandboxHandlers) read(ctx context.Context, in *FilesIn) (FilesOut, error) {
	if in.Path == "" {
		return FilesOut{}, &delegate.FieldError{Field: "path", Rule: "is required for op read: the file's path under /workspace"}
	}
	if in.Offset < 0 {
		return FilesOut{}, &delegate.FieldError{Field: "offset", Rule: fmt.Sprintf("must be 0 or more, not %d", in.Offset)}
	}
	length := in.Length
	switch {
	case length == 0:
		length = delegate.MaxFileRead
	case length < 0 || length > delegate.MaxFileRead:
		return FilesOut{}, &delegate.FieldError{Field: "length", Rule: fmt.Sprintf(
			"must be between 1 and %d bytes, not %d: read a larger file in parts, each from the last one's next_offset", delegate.MaxFileRead, length)}
	}
	fc, err := h.svc.ReadSandboxFile(ctx, in.SandboxID, in.Path, in.Offset, length)
	if err != nil {
		return FilesOut{}, err
	}
	out := FilesOut{Size: new(fc.Size), EOF: new(fc.EOF)}
	if utf8.Valid(fc.Data) {
		out.Text = new(string(fc.Data))
	} else {
		out.Content = new(base64.StdEncoding.EncodeToString(fc.Data))
	}
	if !fc.EOF {
		out.NextOffset = new(fc.Offset + int64(len(fc.Data)))
	}
	return out, nil
}

func (h *sandboxHandlers) write(ctx context.Context, in *FilesIn) (FilesOut, error) {
	if in.Path == "" {
		return FilesOut{}, &delegate.FieldError{Field: "path", Rule: "is required for op write: the file's path under /workspace"}
	}
	var data []byte
	switch {
	case in.Content != nil && in.Text != nil:
		return FilesOut{}, &delegate.FieldError{Field: "content", Rule: "give content (base64) or text, not both"}
	case in.Content != nil:
		var err error
		if data, err = base64.StdEncoding.DecodeString(*in.Content); err != nil {
			return FilesOut{}, &delegate.FieldError{Field: "content", Rule: "not base64 (standard encoding, with padding)"}
		}
	case in.Text != nil:
		data = []byte(*in.Text)
	default:
		return FilesOut{}, &delegate.FieldError{Field: "content", Rule: "is required for op write: the bytes as base64 (or give text)"}
	}
	mode, err := parseMode(in.Mode)
	if err != nil {
		return FilesOut{}, err
	}
	if err := h.svc.WriteSandboxFile(ctx, in.SandboxID, in.Path, data, mode); err != nil {
		return FilesOut{}, err
	}
	return FilesOut{Size: new(int64(len(data)))}, nil
}

// parseMode reads octal permissions ("0644", "755"); "" is 0644. Only
// the permission bits: no setuid, setgid or sticky bit.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return 0o644, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o777 {
		return 0, &delegate.FieldError{Field: "mode", Rule: fmt.Sprintf("must be octal permissions from 0000 to 0777 such as 0644 or 0755, not %q", s)}
	}
	return fs.FileMode(n), nil
}

func (h *sandboxHandlers) listFiles(ctx context.Context, in *FilesIn) (FilesOut, error) {
	if in.Depth < 0 || in.Depth > delegate.MaxFileDepth {
		return FilesOut{}, &delegate.FieldError{Field: "depth", Rule: fmt.Sprintf("must be between 1 and %d, not %d", delegate.MaxFileDepth, in.Depth)}
	}
	if in.Limit < 0 || in.Limit > delegate.MaxFileLimit {
		return FilesOut{}, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d, not %d", delegate.MaxFileLimit, in.Limit)}
	}
	l, err := h.svc.ListSandboxFiles(ctx, in.SandboxID, delegate.FileListOptions{Path: in.Path, Depth: in.Depth, Limit: in.Limit})
	if err != nil {
		return FilesOut{}, err
	}
	out := FilesOut{Entries: make([]FileEntry, 0, len(l.Entries)), Truncated: l.Truncated}
	for _, e := range l.Entries {
		out.Entries = append(out.Entries, FileEntry{Path: e.Path, Type: e.Type, Size: e.Size, Mode: fmt.Sprintf("%04o", e.Mode.Perm()),
			MTime: msec(e.ModTime), Link: e.Link})
	}
	if len(out.Entries) == 0 {
		// An empty directory: an empty list, not an absent one.
		return FilesOut{Entries: []FileEntry{}}, nil
	}
	return out, nil
}

func openSandboxSchema() *jsonschema.Schema {
	s := inputSchema[OpenSandboxIn]()
	// The defaults are the server's settings: no number here.
	durations(s, map[string]string{"idle_timeout": "seconds or 10m", "lifetime": "seconds or 10m"})
	// The same as a job's: said, not spelled out again (tools/list's
	// budget).
	*at(s, "network") = jsonschema.Schema{Description: "as submit_job's"}
	return s
}

func filesSchema() *jsonschema.Schema {
	s := inputSchema[FilesIn]()
	describe(s, map[string]string{
		"content": "base64",
		"mode":    "octal",
	})
	oneOf(s, "op", opRead, opWrite, opList)
	return s
}

// sandboxError is toolError's answer to a sandbox that is not found: it
// names the argument that named it and how to list the sandboxes. nil
// for any other error.
func sandboxError(tool string, err error) error {
	if delegate.ErrorKind(err) != delegate.KindNotFound {
		return nil
	}
	field := "sandbox_id"
	if tool == "submit_job" {
		field = "manifest.sandbox"
	}
	var nf *delegate.NotFoundError
	switch found := errors.As(err, &nf); {
	case found && nf.Resource == "sandbox":
	case !found && sandboxTools[tool]: // a bare ErrNotFound of a tool that takes a sandbox_id is about it
	default:
		return nil
	}
	return fmt.Errorf("%s: %w (list_sandboxes shows the sandboxes that exist)", field, err)
}

// A kept sandbox as a resource: sandbox://{id} is list_sandboxes' answer
// for it, as JSON.
func addSandboxResource(s *mcp.Server, svc delegate.SandboxService, log *slog.Logger) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "sandbox", URITemplate: "sandbox://{id}", MIMEType: "application/json",
		Description: "A kept sandbox's state"}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		id, ok := strings.CutPrefix(uri, "sandbox://")
		if !ok || id == "" || strings.Contains(id, "/") {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		if err := need(ctx, delegate.ScopeSandboxes, uri); err != nil {
			return nil, err
		}
		sb, err := svc.GetSandbox(ctx, id)
		if err != nil {
			return nil, resourceError(ctx, log, uri, err)
		}
		data, err := json.Marshal(sandboxOf(ctx, sb))
		if err != nil {
			return nil, err
		}
		return contents(uri, "application/json", data), nil
	})
}
