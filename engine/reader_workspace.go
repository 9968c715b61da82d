package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/workspace"
)

// The read side of workspaces (delegate.WorkspaceService), over the store
// alone: a job's changes, their diff, patch and change set.

var _ delegate.WorkspaceService = (*Reader)(nil)

// Changes implements delegate.WorkspaceService.
func (rd *Reader) Changes(ctx context.Context, id string) (*delegate.WorkspaceChanges, error) {
	j, jw, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, err
	}
	return changesSummary(j, jw)
}

func changesSummary(j *delegate.Job, jw *delegate.JobWorkspace) (*delegate.WorkspaceChanges, error) {
	if jw.Summary != nil {
		return jw.Summary, nil
	}
	if !j.Status.Terminal() {
		return nil, fmt.Errorf("job %s is %s: %w: its changes are known when it ends", j.ID, j.Status, delegate.ErrNotFinished)
	}
	return &delegate.WorkspaceChanges{Files: []delegate.ChangedFile{}, Error: "not computed: the job ended before its workspace could be read back (" + j.Error + ")"}, nil
}

// workspaceOf reads a job and its stored workspace; for a kept
// sandbox's id, its latest command that has ended.
func (rd *Reader) workspaceOf(ctx context.Context, id string) (*delegate.Job, *delegate.JobWorkspace, error) {
	if strings.HasPrefix(id, "sbx-") {
		return rd.latestOf(ctx, id)
	}
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	jw, err := rd.store.JobWorkspace(ctx, id)
	if err != nil {
		return j, nil, noWorkspaceYet(j, err)
	}
	return j, jw, nil
}

// noWorkspaceYet says why a job with a workspace source has none stored:
// it is not there yet (the job is importing it, or waits to), or its
// import failed; the store's "submitted without manifest.workspace" is
// true only of a job without one.
func noWorkspaceYet(j *delegate.Job, err error) error {
	if !errors.Is(err, delegate.ErrNotFound) || j.Manifest.Workspace == nil && j.Manifest.Sandbox == "" {
		return err
	}
	if !j.Status.Terminal() {
		return fmt.Errorf("job %s is %s: %w: its changes are known when it ends (wait_job)", j.ID, j.Status, delegate.ErrNotFinished)
	}
	if j.Manifest.Workspace == nil {
		return err // a command in a kept sandbox: the sandbox's maker had none
	}
	return &delegate.NotFoundError{Resource: "job", ID: j.ID, Reason: "has no workspace: its import did not complete (" + j.Error + ")"}
}

// latestOf finds a kept sandbox's latest command that has ended (the job
// that made it counts), and its workspace: each command's changes are
// all of the sandbox's since the import.
func (rd *Reader) latestOf(ctx context.Context, sbx string) (*delegate.Job, *delegate.JobWorkspace, error) {
	sb, err := rd.store.GetSandboxUncounted(ctx, sbx)
	if err != nil {
		return nil, nil, err
	}
	running := ""
	for cursor := ""; ; {
		page, next, err := rd.store.ListJobs(ctx, delegate.JobFilter{Sandbox: sb.ID, Cursor: cursor, Limit: 100})
		if err != nil {
			return nil, nil, err
		}
		for _, j := range page {
			if !j.Status.Terminal() {
				running = j.ID
				continue
			}
			jw, err := rd.store.JobWorkspace(ctx, j.ID)
			if errors.Is(err, delegate.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, nil, err
			}
			return j, jw, nil
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if running != "" {
		return nil, nil, fmt.Errorf("sandbox %s: %w: its first command, %s, has not ended", sb.ID, delegate.ErrNotFinished, running)
	}
	return nil, nil, &delegate.NotFoundError{Resource: "sandbox", ID: sb.ID, Reason: "has no workspace: it was opened without one (sandboxes open --workspace, or a job with manifest.workspace and lifecycle persistent)"}
}

// changeSet reads a finished job's changes whole.
func (rd *Reader) changeSet(ctx context.Context, id string) (*workspace.Changes, []byte, error) {
	j, jw, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	sum, err := changesSummary(j, jw)
	if err != nil {
		return nil, nil, err
	}
	if jw.Changes == nil {
		return nil, nil, fmt.Errorf("job %s: no changes were kept: %s: %w", id, sum.Error, delegate.ErrNotFound)
	}
	raw, err := gunzipped(jw.Changes)
	if err != nil {
		return nil, nil, fmt.Errorf("job %s: the stored changes: %w", id, err)
	}
	var cs workspace.Changes
	if err := json.Unmarshal(raw, &cs); err != nil {
		return nil, nil, fmt.Errorf("job %s: the stored changes: %w", id, err)
	}
	return &cs, raw, nil
}

// Diff implements delegate.WorkspaceService.
func (rd *Reader) Diff(ctx context.Context, id string, opts delegate.DiffOptions) (*delegate.DiffPage, error) {
	if opts.Offset < 0 {
		return nil, &delegate.FieldError{Field: "offset", Rule: fmt.Sprintf("must be 0 or the next of the page before (got %d)", opts.Offset)}
	}
	if opts.Limit < 0 || opts.Limit > delegate.MaxDiffPage {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d bytes (got %d)", delegate.MaxDiffPage, opts.Limit)}
	}
	cs, _, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	p := cs.Diff(workspace.DiffOptions{Offset: opts.Offset, Limit: opts.Limit})
	return &delegate.DiffPage{Text: p.Text, Offset: p.Offset, Next: p.Next, Total: p.Total, Omitted: p.Omitted}, nil
}

// Patch implements delegate.WorkspaceService.
func (rd *Reader) Patch(ctx context.Context, id string) ([]byte, error) {
	cs, _, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	return cs.Patch(0)
}

// ChangeSet implements delegate.WorkspaceService.
func (rd *Reader) ChangeSet(ctx context.Context, id string) (*delegate.ChangeSet, error) {
	j, _, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, err
	}
	_, raw, err := rd.changeSet(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	jw, src, err := baselineOf(ctx, rd.store, j)
	if err != nil {
		return nil, err
	}
	out := &delegate.ChangeSet{JobID: j.ID, Sandbox: j.Sandbox, Baseline: jw.Baseline, Changes: raw}
	if src != nil {
		out.Source = *src
	}
	return out, nil
}

// chainOf is what the applies of a job follow each other in: its kept
// sandbox, or the job itself.
func chainOf(j *delegate.Job) string {
	if j.Sandbox != "" {
		return j.Sandbox
	}
	return j.ID
}

// LastApplied implements delegate.WorkspaceService.
func (rd *Reader) LastApplied(ctx context.Context, id, target string) (*delegate.ChangeSet, error) {
	j, _, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return nil, err
	}
	last, err := rd.store.LastApply(ctx, chainOf(j), target)
	if err != nil || last == "" {
		return nil, err
	}
	return rd.ChangeSet(ctx, last)
}

// RecordApplied implements delegate.WorkspaceService: the one write of
// the read side, a fact about the target rather than about the job.
func (rd *Reader) RecordApplied(ctx context.Context, id, target string) error {
	j, _, err := rd.workspaceOf(ctx, id)
	if err != nil {
		return err
	}
	if err := rd.store.SaveApply(ctx, chainOf(j), target, j.ID); err != nil {
		return err
	}
	rd.audit.Record(ctx, delegate.AuditApplied, id, "into "+target)
	return nil
}

// resultChanges is the changes a result shows: nil for a job without a
// workspace.
func (rd *Reader) resultChanges(ctx context.Context, j *delegate.Job) (*delegate.WorkspaceChanges, error) {
	if j.Manifest.Workspace == nil && j.Manifest.Sandbox == "" {
		return nil, nil
	}
	jw, err := rd.store.JobWorkspace(ctx, j.ID)
	if errors.Is(err, delegate.ErrNotFound) {
		if j.Manifest.Workspace == nil {
			return nil, nil // a command in a sandbox without a workspace
		}
		jw = &delegate.JobWorkspace{}
	} else if err != nil {
		return nil, err
	}
	return changesSummary(j, jw)
}
