package mcpserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/delegate-dev/delegate"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Jobs as resources: job://{id} is the status JSON, job://{id}/log the
// output so far, job://{id}/artifacts/{name} an artifact.
func addResources(s *mcp.Server, svc delegate.JobService, log *slog.Logger) {
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
	if _, ok := svc.(delegate.NetworkService); ok {
		s.AddResourceTemplate(&mcp.ResourceTemplate{Name: "job-network", URITemplate: "job://{id}/network", MIMEType: "application/json",
			Description: "A job's network log: every connection and DNS query through delegate's egress proxy, allowed or denied and why"}, read)
	}
}

// readResource reads one resource; its errors are resourceError's to
// answer (a missing job or artifact is the protocol's not-found).
func readResource(ctx context.Context, svc delegate.JobService, uri string) (*mcp.ReadResourceResult, error) {
	rest, ok := strings.CutPrefix(uri, "job://")
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	id, sub, _ := strings.Cut(rest, "/")
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
		ns, ok := svc.(delegate.NetworkService)
		if !ok {
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

func contents(uri, mime string, data []byte) *mcp.ReadResourceResult {
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: mime, Text: strings.ToValidUTF8(string(data), "\uFFFD")}}}
}

// publishUpdates sends notifications/resources/updated for a job's status
// and log resources whenever the engine changes the job. The SDK delivers
// them only to the sessions subscribed to that URI.
func publishUpdates(ctx context.Context, s *mcp.Server, svc delegate.JobService) {
	for id := range svc.Watch(ctx) {
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id})
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id + "/log"})
		s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "job://" + id + "/network"})
	}
}
