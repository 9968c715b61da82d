package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/delegate-dev/delegate"
)

// The read side of jobs' networks (part of delegate.NetworkService), over
// the store alone.

// Network implements delegate.NetworkService.
func (rd *Reader) Network(ctx context.Context, id string, opts delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
	if opts.Limit < 0 || opts.Limit > delegate.MaxNetworkLog {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxNetworkLog, opts.Limit)}
	}
	if opts.After < 0 {
		return nil, &delegate.FieldError{Field: "after", Rule: fmt.Sprintf("must be 0 or a seq of the log (got %d)", opts.After)}
	}
	netID, err := resolveNetwork(ctx, rd.store, id)
	if err != nil {
		return nil, err
	}
	n, err := rd.store.GetNetwork(ctx, netID)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, &delegate.NotFoundError{Resource: "network", ID: id, Reason: "its network does not go through delegate's egress proxy (network none, or a backend without it): there is no network log"}
	}
	if err != nil {
		return nil, err
	}
	entries, err := rd.store.NetworkLog(ctx, netID, opts)
	if err != nil {
		return nil, err
	}
	rep := &delegate.NetworkReport{JobID: id, Network: netID, Policy: n.Policy, Inject: n.Inject, Ended: !n.EndedAt.IsZero(),
		Summary: n.Summary, Entries: entries}
	limit := opts.Limit
	if limit == 0 {
		limit = delegate.DefaultNetworkPage
	}
	if len(entries) == limit {
		rep.Next = entries[len(entries)-1].Seq
	}
	return rep, nil
}

// networkResult is the network part of a finished job's result.
func (rd *Reader) networkResult(ctx context.Context, j *delegate.Job) *delegate.NetworkResult {
	if !j.Manifest.Network.Reaches() && j.Manifest.Sandbox == "" {
		return nil
	}
	rep, err := rd.Network(ctx, j.ID, delegate.NetworkLogOptions{Denied: true, Limit: delegate.MaxResultDenials})
	if err != nil {
		return nil
	}
	return &delegate.NetworkResult{Policy: rep.Policy, Summary: rep.Summary, Denied: rep.Entries}
}
