package postgres_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/postgres/pgtest"
)

// TestRevocationAcrossServers: two servers share the database, each with
// its own guard (its own pool of connections), and a request of the same
// token open on each (an MCP session's stream); the token revoked through
// a third (the CLI of any of them) ends both within a recheck, each guard
// re-reading the store every httpauth.RecheckInterval (0.8 s: under a
// second with the read; the figures are logged); a new request on either
// is refused.
func TestRevocationAcrossServers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := pgtest.New(t)
	cli := open(t, url)
	const secret = "dlg_across-servers-0123456789abcdef"
	tok := &delegate.Token{ID: "tok-across", Principal: "alice", Scopes: []delegate.Scope{delegate.ScopeJobs},
		Hash: delegate.HashToken(secret), CreatedAt: time.Now().UTC()}
	if err := cli.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	var ended []<-chan struct{}
	var guards []*httpauth.Guard
	for range 2 {
		g := &httpauth.Guard{Tokens: open(t, url)}
		guards = append(guards, g)
		go g.Recheck(ctx, httpauth.RecheckInterval, time.Hour)
		r := httptest.NewRequest("GET", "/mcp", nil)
		r.Header.Set("Authorization", "Bearer "+secret)
		p, cred, done, err := g.Principal(r)
		if err != nil || p.Name != "alice" {
			t.Fatalf("alice's token on a server: %v %v", p, err)
		}
		defer done()
		ended = append(ended, cred.Done())
	}
	revoked := time.Now()
	if _, err := cli.RevokeToken(ctx, tok.ID, revoked); err != nil {
		t.Fatal(err)
	}
	for i, e := range ended {
		select {
		case <-e:
			t.Logf("server %d ended the revoked token's request %v after the revocation", i+1, time.Since(revoked).Round(time.Millisecond))
		case <-time.After(3 * httpauth.RecheckInterval):
			t.Fatalf("server %d: the revoked token's request is still open after %v", i+1, time.Since(revoked))
		}
	}
	for i, g := range guards {
		r := httptest.NewRequest("GET", "/mcp", nil)
		r.Header.Set("Authorization", "Bearer "+secret)
		if _, _, _, err := g.Principal(r); !errors.Is(err, delegate.ErrUnauthenticated) {
			t.Errorf("server %d: a new request with the revoked token: %v", i+1, err)
		}
	}
}
