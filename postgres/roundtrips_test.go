package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit/pgproxy"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/storetest"
)

// TestCreateRoundTrips: a job's creation is one round trip to the
// database; under a quota two, however many statements its transaction
// has (BEGIN, the principal's lock and the reads of what it holds sent
// together, then the insert and COMMIT): six before, one a statement.
// A refusal is two (the reads, then ROLLBACK), and a failed insert
// leaves no transaction open on the pooled connection. Counted on the
// wire, by a proxy between the store and the database that reads what
// the client sends: a round trip ends with a Sync (the extended
// protocol's) or is a simple Query (pgx's liveness pings, which the
// pool sends on its own, left out).
func TestCreateRoundTrips(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.New(t)
	proxy := pgproxy.New(t, dbURL)
	s := open(t, proxy.URL)
	admit := func(h delegate.Holdings) error { return nil }
	refuse := func(h delegate.Holdings) error {
		return &delegate.QuotaError{Principal: "alice", Quota: "jobs not ended", Setting: "TEST", Use: "1", Asked: "1", Limit: "1"}
	}
	alice := delegate.WithPrincipal(ctx, &delegate.Principal{Name: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs}})
	audited := func(id string, a delegate.Admit) error {
		e := &delegate.AuditEntry{Time: time.Now(), Principal: "alice", Action: delegate.AuditSubmitted, Target: id}
		if err := s.CreateJobAudited(alice, storetest.NewJob(id), a, e); err != nil {
			return err
		}
		if e.Seq == 0 {
			t.Errorf("job %s: its audit entry's seq not read", id)
		}
		return nil
	}
	// Each statement is prepared once on a connection (pgx's statement
	// cache): the first of each kind is not counted.
	for _, a := range []delegate.Admit{nil, admit} {
		if err := audited("warm-"+map[bool]string{true: "quota", false: "plain"}[a != nil], a); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSandboxAdmitted(alice, newSandbox("sbx-warm"), admit); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		create  func() error
		trips   int64
		refused bool
	}{
		{"a job", func() error { return audited("plain", nil) }, 1, false},
		{"a job under a quota", func() error { return audited("quota", admit) }, 2, false},
		{"a sandbox under a quota", func() error { return s.CreateSandboxAdmitted(alice, newSandbox("sbx-1"), admit) }, 2, false},
		{"a job the quota refuses", func() error { return audited("refused", refuse) }, 2, true},
	} {
		before := proxy.Trips()
		err := c.create()
		var qe *delegate.QuotaError
		if c.refused != errors.As(err, &qe) || !c.refused && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := proxy.Trips() - before; got != c.trips {
			t.Errorf("%s: %d round trips, want %d", c.name, got, c.trips)
		}
	}
	if _, err := s.GetJob(ctx, "refused"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("the refused job was stored: %v", err)
	}
	// A failed insert under a quota (the id taken) is a conflict; the
	// connection it leaves goes on serving.
	if err := audited("quota", admit); !errors.Is(err, delegate.ErrConflict) {
		t.Errorf("a taken id under a quota: %v, want a conflict", err)
	}
	for _, id := range []string{"after-1", "after-2"} {
		if err := audited(id, admit); err != nil {
			t.Errorf("a job after a failed insert: %v", err)
		}
	}
	if h, err := s.Holdings(ctx, "alice"); err != nil || h.Jobs != 6 || h.Sandboxes != 2 {
		t.Errorf("alice holds %+v, %v; want 6 jobs and 2 sandboxes", h, err)
	}
}

func newSandbox(id string) *delegate.Sandbox {
	return &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: id}
}
