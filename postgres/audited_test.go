package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/storetest"
)

// TestSubmitAuditedInOne: a job and the audit entry of its submission
// are stored together, in one statement: both, its entry numbered, or
// (a job the store refuses: its id taken) neither. The engine's submit
// on PostgreSQL goes that way: its entry is in the trail.
func TestSubmitAuditedInOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t)
	s := open(t, url)
	entry := func() *delegate.AuditEntry {
		return &delegate.AuditEntry{Time: time.Now().UTC(), Principal: "local", Action: delegate.AuditSubmitted, Target: "job-1", Detail: "script"}
	}
	e := entry()
	if err := s.CreateJobAudited(ctx, storetest.NewJob("job-1"), nil, e); err != nil || e.Seq == 0 {
		t.Fatalf("stored: seq %d, %v", e.Seq, err)
	}
	if err := s.CreateJobAudited(ctx, storetest.NewJob("job-1"), nil, entry()); !errors.Is(err, delegate.ErrConflict) {
		t.Fatalf("the same id again: %v", err)
	}
	if trail, err := s.Audit(ctx, delegate.AuditFilter{}); err != nil || len(trail) != 1 || trail[0].Seq != e.Seq || trail[0].Target != "job-1" {
		t.Fatalf("the trail: %+v, %v (one entry: the refused job's is not there)", trail, err)
	}

	// On a database of its own: job-1 above is no job to run.
	s = open(t, pgtest.New(t))
	eng := startEngine(t, s, sandboxtest.NewFake(), engine.Config{})
	job, err := eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	trail, err := s.Audit(ctx, delegate.AuditFilter{})
	if err != nil || len(trail) != 1 || trail[0].Target != job.ID || trail[0].Action != delegate.AuditSubmitted || trail[0].Detail != "script" {
		t.Fatalf("the trail after a submit: %+v, %v", trail, err)
	}
}
