package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// workspaceOf reads a job and its stored workspace.
func (rd *Reader) workspaceOf(ctx context.Context, id string) (*delegate.Job, *delegate.JobWorkspace, error) {
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	jw, err := rd.store.JobWorkspace(ctx, id)
	if err != nil {
		return j, nil, err
	}
	return j, jw, nil
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
	_, raw, err := rd.changeSet(ctx, id)
	if err != nil {
		return nil, err
	}
	j, err := rd.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	jw, src, err := baselineOf(ctx, rd.store, j)
	if err != nil {
		return nil, err
	}
	out := &delegate.ChangeSet{JobID: id, Baseline: jw.Baseline, Changes: raw}
	if src != nil {
		out.Source = *src
	}
	return out, nil
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
