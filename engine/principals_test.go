package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
)

func as(name string, scopes ...delegate.Scope) context.Context {
	return delegate.WithPrincipal(context.Background(), &delegate.Principal{Name: name, Scopes: scopes})
}

// TestQuotasPerPrincipal: a principal over a quota is refused at once
// with the quota, its use and the setting named; another principal, and
// the operator, are not held by it.
func TestQuotasPerPrincipal(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{Quotas: engine.Quotas{Jobs: 2, Sandboxes: 1, CPU: 3, MemoryBytes: 256 << 20}})
	alice, bob := as("alice", delegate.ScopeJobs, delegate.ScopeSandboxes), as("bob", delegate.ScopeJobs)
	submit := func(ctx context.Context, m delegate.Manifest) (*delegate.Job, error) {
		return f.eng.Submit(ctx, m, delegate.SubmitOptions{})
	}
	var first *delegate.Job
	for range 2 {
		j, err := submit(alice, script("sleep 60"))
		if err != nil {
			t.Fatal(err)
		}
		first = j
	}
	_, err := submit(alice, script("sleep 60"))
	var qe *delegate.QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, delegate.ErrConflict) || qe.Setting != "DELEGATE_QUOTA_JOBS" ||
		!strings.Contains(err.Error(), "jobs not ended: 2 now") || !strings.Contains(err.Error(), "the quota is 2") {
		t.Fatalf("alice's third job: %v, want the jobs quota named", err)
	}
	if _, err := submit(bob, script("sleep 60")); err != nil {
		t.Fatalf("bob is held by alice's quota: %v", err)
	}
	for range 3 {
		if _, err := submit(context.Background(), script("sleep 60")); err != nil {
			t.Fatalf("the operator is held by a quota: %v", err)
		}
	}
	if _, _, err := f.eng.Cancel(alice, first.ID); err != nil {
		t.Fatal(err)
	}
	// One job of alice's left (1 cpu, 64M): 3 more cores are over 3.
	big := script("true")
	big.Resources = &delegate.Resources{CPU: 3}
	if _, err := submit(alice, big); !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_CPU" || qe.Use != "1" || qe.Asked != "3" {
		t.Errorf("over the cpu quota: %v", err)
	}
	big.Resources = &delegate.Resources{Memory: "256M"}
	if _, err := submit(alice, big); !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_MEMORY" {
		t.Errorf("over the memory quota: %v", err)
	}
	// A kept sandbox (1 cpu, 64M) fits; a second is over the quota.
	if _, err := f.eng.OpenSandbox(alice, delegate.SandboxSpec{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.eng.OpenSandbox(alice, delegate.SandboxSpec{}); !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_SANDBOXES" {
		t.Errorf("a second kept sandbox: %v", err)
	}
	// Now alice's job and sandbox hold 2 of 3 cores: a job of 1 fits,
	// but it is her second not ended.
	if _, err := submit(alice, script("true")); err != nil {
		t.Errorf("a job within every quota: %v", err)
	}
}

// TestQuotaRace: many sandboxes opened (and jobs submitted) at once by one
// principal at a quota of n: exactly n are accepted, and each refusal
// names the quota, the use it read (n) and the setting. (Before the
// quota was decided where the job is stored, several passed the check on
// the same use.)
func TestQuotaRace(t *testing.T) {
	t.Parallel()
	const n, tries = 3, 20
	f := keptFixture(t, engine.Config{Quotas: engine.Quotas{Jobs: n, Sandboxes: n}})
	alice := as("alice", delegate.ScopeJobs, delegate.ScopeSandboxes)
	for _, tc := range []struct {
		what, setting, quota string
		try                  func() error
	}{
		{"sandboxes", "DELEGATE_QUOTA_SANDBOXES", "kept sandboxes", func() error {
			_, err := f.eng.OpenSandbox(alice, delegate.SandboxSpec{})
			return err
		}},
		{"jobs", "DELEGATE_QUOTA_JOBS", "jobs not ended", func() error {
			_, err := f.eng.Submit(alice, script("sleep 60"), delegate.SubmitOptions{})
			return err
		}},
	} {
		errs := make(chan error, tries)
		var wg sync.WaitGroup
		for range tries {
			wg.Go(func() { errs <- tc.try() })
		}
		wg.Wait()
		close(errs)
		accepted := 0
		for err := range errs {
			var qe *delegate.QuotaError
			switch {
			case err == nil:
				accepted++
			case !errors.As(err, &qe) || qe.Setting != tc.setting || qe.Use != strconv.Itoa(n) ||
				!strings.HasPrefix(err.Error(), fmt.Sprintf("over the quota of alice: %s: %d now, this asks for 1 more, the quota is %d (%s on the server)", tc.quota, n, n, tc.setting)):
				t.Errorf("%s: refused with %q, want the quota, its use and the setting named", tc.what, err)
			}
		}
		if accepted != n {
			t.Errorf("%s: %d of %d accepted at once at a quota of %d", tc.what, accepted, tries, n)
		}
		if got := f.backend.Len(); tc.what == "sandboxes" && got != n {
			t.Errorf("%d machines left for %d kept sandboxes (a refused one's is destroyed)", got, n)
		}
	}
}

// TestAuditTrail: what changes something is recorded with its
// principal; a principal without the admin scope reads its own entries,
// the operator everyone's.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	f := keptFixture(t, engine.Config{})
	alice, bob := as("alice", delegate.ScopeJobs, delegate.ScopeSandboxes), as("bob", delegate.ScopeJobs)
	j, err := f.eng.Submit(alice, script("sleep 60"), delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.eng.Cancel(bob, j.ID); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("bob cancels alice's job: %v, want not found", err)
	}
	if _, _, err := f.eng.Cancel(alice, j.ID); err != nil {
		t.Fatal(err)
	}
	sb, err := f.eng.OpenSandbox(alice, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.eng.ReleaseSandbox(alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	ps := engine.NewPrincipals(f.store, nil)
	if _, _, err := ps.CreateToken(alice, delegate.TokenRequest{Principal: "carol", Scopes: []delegate.Scope{delegate.ScopeJobs}}); !errors.Is(err, delegate.ErrForbidden) {
		t.Fatalf("alice makes a token: %v, want forbidden", err)
	}
	operator := delegate.WithPrincipal(context.Background(), delegate.Local())
	_, tok, err := ps.CreateToken(operator, delegate.TokenRequest{Principal: "carol", Scopes: []delegate.Scope{delegate.ScopeJobs}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.RevokeToken(operator, tok.ID); err != nil {
		t.Fatal(err)
	}
	all, err := ps.Audit(operator, delegate.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := len(all) - 1; i >= 0; i-- {
		got = append(got, all[i].Principal+" "+string(all[i].Action)+" "+all[i].Target)
	}
	want := []string{"alice submitted " + j.ID, "alice cancelled " + j.ID, "alice opened " + sb.ID, "alice released " + sb.ID,
		"local token_created " + tok.ID, "local token_revoked " + tok.ID}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the trail:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	mine, err := ps.Audit(alice, delegate.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 4 {
		t.Errorf("alice reads %d entries, want her 4", len(mine))
	}
}
