package delegate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestPrincipalScopes: admin holds every scope; a missing scope is
// forbidden, naming it; the readers of contexts.
func TestPrincipalScopes(t *testing.T) {
	jobs := &delegate.Principal{Name: "a", Scopes: []delegate.Scope{delegate.ScopeJobs}}
	admin := &delegate.Principal{Name: "op", Scopes: []delegate.Scope{delegate.ScopeAdmin}}
	for _, c := range []struct {
		p    *delegate.Principal
		s    delegate.Scope
		want bool
	}{
		{jobs, delegate.ScopeJobs, true}, {jobs, delegate.ScopeSandboxes, false}, {jobs, delegate.ScopeAdmin, false},
		{admin, delegate.ScopeJobs, true}, {admin, delegate.ScopeSandboxes, true}, {nil, delegate.ScopeJobs, false},
	} {
		if got := c.p.Has(c.s); got != c.want {
			t.Errorf("%v has %s: %v", c.p, c.s, got)
		}
	}
	err := jobs.Need(delegate.ScopeSandboxes, "open_sandbox")
	if !errors.Is(err, delegate.ErrForbidden) || err.Error() != "open_sandbox needs the sandboxes scope, which a's token does not have "+
		"(an operator makes one with: delegate tokens create NAME --scopes sandboxes)" {
		t.Errorf("need: %v", err)
	}
	bg := context.Background()
	for _, c := range []struct {
		ctx           context.Context
		reader, owner string
	}{
		{bg, "", "local"},
		{delegate.WithPrincipal(bg, jobs), "a", "a"},
		{delegate.WithPrincipal(bg, admin), "", "op"},
		{delegate.AsServer(delegate.WithPrincipal(bg, jobs)), "", "local"},
	} {
		if r, o := delegate.ReaderOf(c.ctx), delegate.OwnerOf(c.ctx); r != c.reader || o != c.owner {
			t.Errorf("reader %q owner %q; want %q %q", r, o, c.reader, c.owner)
		}
	}
}

// TestParseScopes: a list of scopes, or the field and the rule.
func TestParseScopes(t *testing.T) {
	for in, want := range map[string]string{"": "[jobs]", "jobs, sandboxes,jobs": "[jobs sandboxes]", "admin": "[admin]",
		"jobs,root": `--scopes: must be a comma-separated list of jobs, sandboxes, admin (got "root")`} {
		got, err := delegate.ParseScopes("--scopes", in)
		s := ""
		if err != nil {
			s = err.Error()
		} else {
			s = fmtScopes(got)
		}
		if s != want {
			t.Errorf("%q: %s; want %s", in, s, want)
		}
	}
	for name, ok := range map[string]bool{"alice": true, "": false, " x": false, "a\nb": false, "alice@example.com": true} {
		if err := delegate.CheckPrincipalName("name", name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
	}
}

func fmtScopes(s []delegate.Scope) string {
	out := "["
	for i, sc := range s {
		if i > 0 {
			out += " "
		}
		out += string(sc)
	}
	return out + "]"
}
