package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// As is ctx carrying a principal with scopes (none: jobs).
func As(name string, scopes ...delegate.Scope) context.Context {
	if len(scopes) == 0 {
		scopes = []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}
	}
	return delegate.WithPrincipal(context.Background(), &delegate.Principal{Name: name, Scopes: scopes})
}

// notFound fails t unless err is ErrNotFound (what another principal's
// id must read as).
func notFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("%s of another principal's: %v; want not found", what, err)
	}
}

// testPrincipals: a job and a sandbox belong to the principal of the
// context that made them; a read under another principal (without the
// operator scope) finds none of them, in every query that names them,
// through another handle too (the manifest cached by the first is not
// handed out), and a write that reads first finds none either; the
// operator and the server's own work see all; an idempotency key is its
// principal's.
func testPrincipals(t *testing.T, open Open) {
	alice, bob, op := As("alice"), As("bob"), As("root", delegate.ScopeAdmin)
	s := open()
	ja := NewJob("ja")
	ja.Manifest.Files = []delegate.File{{Path: "f", Content: "x"}}
	ja.IdempotencyKey = "k"
	if err := s.CreateJob(alice, ja); err != nil {
		t.Fatal(err)
	}
	if ja.Principal != "alice" {
		t.Fatalf("created under alice: principal %q", ja.Principal)
	}
	jb := NewJob("jb")
	jb.IdempotencyKey = "k" // bob's key: no conflict with alice's
	if err := s.CreateJob(bob, jb); err != nil {
		t.Fatalf("bob's job with alice's key: %v", err)
	}
	create(t, s, NewJob("jl")) // the server's own: the local user's
	if err := s.AddArtifact(alice, "ja", delegate.Artifact{Name: "out", Size: 1, SHA256: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEvent(alice, "ja", delegate.Event{Time: time.Now(), Message: "started"}, delegate.MaxTimeline); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AddQuestion(alice, NewQuestion("ja", "q1")); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBaseline(alice, "ja", "dir:/x", []byte("base")); err != nil {
		t.Fatal(err)
	}
	sa := &delegate.Sandbox{ID: "sbx-a", State: delegate.SandboxIdle, Backend: "local", Instance: "i-a",
		CreatedAt: time.Now().UTC(), LastUsedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Hour).UTC()}
	if err := s.CreateSandbox(alice, sa); err != nil {
		t.Fatal(err)
	}
	if _, err := s.JobManifest(alice, "ja"); err != nil { // cached now
		t.Fatal(err)
	}

	for i, st := range []delegate.Store{s, open()} {
		t.Run(fmt.Sprint("handle", i), func(t *testing.T) {
			_, err := st.GetJob(bob, "ja")
			notFound(t, "GetJob", err)
			_, err = st.JobManifest(bob, "ja")
			notFound(t, "JobManifest", err)
			_, err = st.JobFiles(bob, "ja")
			notFound(t, "JobFiles", err)
			_, err = st.UpdateJob(bob, "ja", func(j *delegate.Job) error { j.Progress = "bob was here"; return nil })
			notFound(t, "UpdateJob", err)
			_, err = st.GetSandbox(bob, "sbx-a")
			notFound(t, "GetSandbox", err)
			_, err = st.GetSandboxUncounted(bob, "sbx-a")
			notFound(t, "GetSandboxUncounted", err)
			_, err = st.UpdateSandbox(bob, "sbx-a", func(sb *delegate.Sandbox) error { sb.Reason = "bob"; return nil })
			notFound(t, "UpdateSandbox", err)
			_, err = st.Artifact(bob, "ja", "out")
			notFound(t, "Artifact", err)
			_, err = st.AnswerQuestion(bob, "ja", "q1", delegate.Answer{Action: delegate.AnswerDecline, At: time.Now()})
			notFound(t, "AnswerQuestion", err)
			_, err = st.JobWorkspace(bob, "ja")
			notFound(t, "JobWorkspace", err)
			if arts, err := st.Artifacts(bob, "ja"); err != nil || len(arts) != 0 {
				t.Errorf("Artifacts of another's: %v %v; want none", arts, err)
			}
			if evs, err := st.Events(bob, "ja"); err != nil || len(evs) != 0 {
				t.Errorf("Events of another's: %v %v; want none", evs, err)
			}
			if qs, err := st.Questions(bob, "ja"); err != nil || len(qs) != 0 {
				t.Errorf("Questions of another's: %v %v; want none", qs, err)
			}
			if got := jobIDs(t, st, bob, delegate.JobFilter{}); !slices.Equal(got, []string{"jb"}) {
				t.Errorf("bob lists %v; want his own [jb]", got)
			}
			// An explicit filter cannot widen what a reader sees.
			if got := jobIDs(t, st, bob, delegate.JobFilter{Principal: "alice"}); len(got) != 0 {
				t.Errorf("bob lists alice's with a filter: %v", got)
			}
			if sbs, err := st.ListSandboxes(bob, false, 10); err != nil || len(sbs) != 0 {
				t.Errorf("bob lists sandboxes %v %v; want none", sbs, err)
			}
			// The owner, the operator and the server itself see it.
			for name, ctx := range map[string]context.Context{"alice": alice, "the operator": op, "the server": context.Background()} {
				j, err := st.GetJob(ctx, "ja")
				if err != nil || j.Principal != "alice" {
					t.Errorf("%s reads alice's job: %+v %v", name, j, err)
				}
				if m, err := st.JobManifest(ctx, "ja"); err != nil || m.Task != "echo ja" {
					t.Errorf("%s reads its manifest: %v %v", name, m.Task, err)
				}
				if qs, err := st.Questions(ctx, "ja"); err != nil || len(qs) != 1 {
					t.Errorf("%s reads its questions: %v %v", name, qs, err)
				}
				if sb, err := st.GetSandbox(ctx, "sbx-a"); err != nil || sb.Principal != "alice" {
					t.Errorf("%s reads alice's sandbox: %+v %v", name, sb, err)
				}
			}
			if got := jobIDs(t, st, op, delegate.JobFilter{}); !slices.Equal(got, []string{"jl", "jb", "ja"}) {
				t.Errorf("the operator lists %v; want all", got)
			}
			if got := jobIDs(t, st, op, delegate.JobFilter{Principal: "bob"}); !slices.Equal(got, []string{"jb"}) {
				t.Errorf("the operator lists bob's: %v", got)
			}
		})
	}
	if j, err := s.GetJob(context.Background(), "jl"); err != nil || j.Principal != delegate.LocalPrincipal {
		t.Errorf("a job made without a principal: %+v %v; want the local user's", j, err)
	}
	for ctx, want := range map[context.Context]string{alice: "ja", bob: "jb"} {
		if j, err := s.JobByIdempotencyKey(ctx, "k"); err != nil || j.ID != want {
			t.Errorf("key k of %s: %v %v; want %s", delegate.OwnerOf(ctx), j, err, want)
		}
	}
	if j, err := s.GetJob(alice, "ja"); err != nil || j.Progress != "" {
		t.Errorf("bob's update reached alice's job: %+v %v", j, err)
	}
	// The owner's update keeps the principal.
	if j, err := s.UpdateJob(alice, "ja", func(j *delegate.Job) error { j.Progress = "mine"; return nil }); err != nil || j.Principal != "alice" {
		t.Errorf("alice's update: %+v %v", j, err)
	}
	if sb, err := s.UpdateSandbox(alice, "sbx-a", func(sb *delegate.Sandbox) error { sb.Reason = "x"; return nil }); err != nil || sb.Principal != "alice" {
		t.Errorf("alice's sandbox update: %+v %v", sb, err)
	}
}

func jobIDs(t *testing.T, s delegate.Store, ctx context.Context, f delegate.JobFilter) []string {
	t.Helper()
	jobs, _, err := s.ListJobs(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// testTokens: a token is stored with its hash (never found by another),
// listed oldest first, and revoked once (its first time kept); another
// handle sees a revocation at once; ids and hashes are unique.
func testTokens(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := &delegate.Token{ID: "tok-a", Principal: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes},
		Hash: "aa", CreatedAt: now, CreatedBy: "local", ExpiresAt: now.Add(time.Hour)}
	b := &delegate.Token{ID: "tok-b", Principal: "bob", Scopes: []delegate.Scope{delegate.ScopeAdmin}, Hash: "bb", CreatedAt: now}
	for _, tok := range []*delegate.Token{a, b} {
		if err := s.CreateToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	for _, dup := range []*delegate.Token{{ID: "tok-a", Principal: "x", Hash: "cc", CreatedAt: now}, {ID: "tok-c", Principal: "x", Hash: "aa", CreatedAt: now}} {
		if err := s.CreateToken(ctx, dup); !errors.Is(err, delegate.ErrConflict) {
			t.Errorf("a token with a taken id or hash: %v; want a conflict", err)
		}
	}
	got, err := open().TokenByHash(ctx, "aa")
	if err != nil || got.ID != "tok-a" || got.Principal != "alice" || !slices.Equal(got.Scopes, a.Scopes) ||
		!got.ExpiresAt.Equal(a.ExpiresAt) || got.CreatedBy != "local" || !got.RevokedAt.IsZero() || !got.Valid(now) {
		t.Fatalf("by hash: %+v %v", got, err)
	}
	if _, err := s.TokenByHash(ctx, "zz"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("an unknown hash: %v", err)
	}
	list, err := s.Tokens(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "tok-a" || list[1].ID != "tok-b" || !list[1].ExpiresAt.IsZero() {
		t.Fatalf("list: %+v %v", list, err)
	}
	r, err := s.RevokeToken(ctx, "tok-b", now.Add(time.Second))
	if err != nil || !r.RevokedAt.Equal(now.Add(time.Second)) || r.Valid(now.Add(2*time.Second)) {
		t.Fatalf("revoke: %+v %v", r, err)
	}
	if r, err := s.RevokeToken(ctx, "tok-b", now.Add(time.Minute)); err != nil || !r.RevokedAt.Equal(now.Add(time.Second)) {
		t.Errorf("revoked again: %+v %v; want the first time kept", r, err)
	}
	if got, err := open().TokenByHash(ctx, "bb"); err != nil || got.RevokedAt.IsZero() {
		t.Errorf("another handle reads the revoked token: %+v %v", got, err)
	}
	if _, err := s.RevokeToken(ctx, "tok-zz", now); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("revoke an unknown id: %v", err)
	}
}

// testAudit: entries are kept with their time and principal, listed
// newest first, by principal, since a time and page by page; a reader
// without the operator scope lists its own.
func testAudit(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	for i, e := range []delegate.AuditEntry{
		{Principal: "alice", Action: delegate.AuditSubmitted, Target: "job-1"},
		{Principal: "bob", Action: delegate.AuditSubmitted, Target: "job-2"},
		{Principal: "alice", Action: delegate.AuditAnswered, Target: "job-1", Detail: "question q1: accept"},
		{Principal: "local", Action: delegate.AuditTokenRevoked, Target: "tok-b"},
	} {
		e.Time = t0.Add(time.Duration(i) * time.Second)
		if err := s.AddAudit(ctx, &e); err != nil || e.Seq == 0 {
			t.Fatalf("add: %v (seq %d)", err, e.Seq)
		}
	}
	render := func(es []delegate.AuditEntry) string {
		var out string
		for _, e := range es {
			out += fmt.Sprintf("%s %s %s %q %s; ", e.Principal, e.Action, e.Target, e.Detail, e.Time.Sub(t0))
		}
		return out
	}
	all, err := open().Audit(ctx, delegate.AuditFilter{})
	want := `local token_revoked tok-b "" 3s; alice answered job-1 "question q1: accept" 2s; bob submitted job-2 "" 1s; alice submitted job-1 "" 0s; `
	if err != nil || render(all) != want {
		t.Fatalf("all:\n got %s %v\nwant %s", render(all), err, want)
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		f    delegate.AuditFilter
		want string
	}{
		{"by principal", ctx, delegate.AuditFilter{Principal: "alice"}, `alice answered job-1 "question q1: accept" 2s; alice submitted job-1 "" 0s; `},
		{"since", ctx, delegate.AuditFilter{Since: t0.Add(2 * time.Second)}, `local token_revoked tok-b "" 3s; alice answered job-1 "question q1: accept" 2s; `},
		{"a page", ctx, delegate.AuditFilter{Limit: 1, Before: all[1].Seq}, `bob submitted job-2 "" 1s; `},
		{"bob reads his own", As("bob"), delegate.AuditFilter{}, `bob submitted job-2 "" 1s; `},
		{"bob asks for alice's", As("bob"), delegate.AuditFilter{Principal: "alice"}, ``},
	} {
		got, err := s.Audit(c.ctx, c.f)
		if err != nil || render(got) != c.want {
			t.Errorf("%s:\n got %s %v\nwant %s", c.name, render(got), err, c.want)
		}
	}
}
