package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Jobs as resources: job://{id} is the status JSON, job://{id}/log the
// output so far, job://{id}/artifacts/{name} an artifact.
func addResources(s *mcp.Server, svc Services, log *slog.Logger) {
	read := func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		res, err := readResource(ctx, svc, req.Params.URI)
		if err != nil {
			return nil, resourceError(ctx, log, req.Params.URI, err)
		}
		return res, nil
	}
	s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job", URITemplate: "job://{id}", MIMEType: "application/json",
		Description: "A job's status; subscribe for updates"}, read)
	s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-log", URITemplate: "job://{id}/log", MIMEType: "text/plain",
		Description: "A job's output so far; subscribe for updates"}, read)
	s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-artifact", URITemplate: "job://{id}/artifacts/{+name}",
		Description: "A file collected from a job"}, read)
	if svc.Workspaces != nil {
		s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-diff", URITemplate: "job://{id}/diff{?offset}", MIMEType: "text/x-diff",
			Description: "What a job changed in its workspace, as a unified diff, 64 KiB a page (a last line names the next page)"}, read)
		s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-patch", URITemplate: "job://{id}/patch", MIMEType: "text/x-diff",
			Description: "A job's workspace changes as a patch for git apply"}, read)
	}
	if svc.Network != nil {
		s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-network", URITemplate: "job://{id}/network", MIMEType: "application/json",
			Description: "A job's network log: every connection and DNS query through delegate's egress proxy, allowed or denied and why"}, read)
	}
}

// readResource reads one resource; its errors are resourceError's to
// answer (a missing job or artifact is the protocol's not-found).
func readResource(ctx context.Context, svcs Services, uri string) (*mcp.ReadResourceResult, error) {
	svc := svcs.Jobs
	rest, ok := strings.CutPrefix(uri, "job://")
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	id, sub, _ := strings.Cut(rest, "/")
	if ws := svcs.Workspaces; ws != nil && (sub == "patch" || sub == "diff" || strings.HasPrefix(sub, "diff?")) {
		return readChanges(ctx, ws, uri, id, sub)
	}
	switch {
	case sub == "":
		st, err := fullStatus(ctx, svc, id)
		if err != nil {
			return nil, err
		}
		data, _ := json.Marshal(struct {
			JobID string `json:"job_id"`
			StatusOut
		}{id, st})
		return contents(uri, "application/json", data), nil
	case sub == "log":
		out, err := readLog(ctx, svc, id)
		if err != nil {
			return nil, err
		}
		return contents(uri, "text/plain", out), nil
	case sub == "network":
		ns := svcs.Network
		if ns == nil {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		rep, err := networkLog(ctx, ns, id)
		if err != nil {
			return nil, err
		}
		data, _ := json.Marshal(rep)
		return contents(uri, "application/json", data), nil
	case strings.HasPrefix(sub, "artifacts/"):
		_, data, err := svc.ReadArtifact(ctx, id, strings.TrimPrefix(sub, "artifacts/"))
		if err != nil {
			return nil, err
		}
		if utf8.Valid(data) {
			return contents(uri, "text/plain", data), nil
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/octet-stream", Blob: data}}}, nil
	}
	return nil, mcp.ResourceNotFoundError(uri)
}

// networkLog reads a job's whole network log (all it keeps).
func networkLog(ctx context.Context, ns delegate.NetworkService, id string) (*delegate.NetworkReport, error) {
	rep, err := ns.Network(ctx, id, delegate.NetworkLogOptions{Limit: delegate.MaxNetworkLog})
	if err != nil {
		return nil, err
	}
	rep.Next = 0
	return rep, nil
}

// readLog reads all of a job's output kept so far, page by page (under the
// same rule as get_job_logs: while it runs, only in statusMode streaming).
func readLog(ctx context.Context, svc delegate.JobService, id string) ([]byte, error) {
	var out []byte
	cursor := ""
	for {
		l, err := svc.Logs(ctx, id, delegate.LogOptions{Cursor: cursor, MaxBytes: delegate.MaxLogBytes})
		if err != nil {
			return nil, err
		}
		out = append(out, l.Output...)
		if l.Done || len(l.Output) == 0 {
			return out, nil
		}
		cursor = l.NextCursor
	}
}

// readChanges reads job://{id}/patch, or a page of job://{id}/diff: a
// page that is not the last ends with a line naming the next one.
func readChanges(ctx context.Context, ws delegate.WorkspaceService, uri, id, sub string) (*mcp.ReadResourceResult, error) {
	if sub == "patch" {
		data, err := ws.Patch(ctx, id)
		if err != nil {
			return nil, err
		}
		return contents(uri, "text/x-diff", data), nil
	}
	var off int64
	if _, q, ok := strings.Cut(sub, "?"); ok {
		v, err := url.ParseQuery(q)
		if err == nil && v.Has("offset") {
			off, err = strconv.ParseInt(v.Get("offset"), 10, 64)
		}
		if err != nil {
			return nil, &delegate.FieldError{Field: "offset", Rule: "must be a number of bytes, the next page's (" + uri + ")"}
		}
	}
	page, err := ws.Diff(ctx, id, delegate.DiffOptions{Offset: off})
	if err != nil {
		return nil, err
	}
	text := page.Text
	if page.Next != 0 {
		text += fmt.Sprintf("\n[delegate: %d of %d bytes; next page: job://%s/diff?offset=%d]\n", page.Next, page.Total, id, page.Next)
	}
	return contents(uri, "text/x-diff", []byte(text)), nil
}

func contents(uri, mime string, data []byte) *mcp.ReadResourceResult {
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: mime, Text: strings.ToValidUTF8(string(data), "\uFFFD")}}}
}
