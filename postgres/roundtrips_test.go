package postgres_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
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
	proxy := newCountingProxy(t, dbURL)
	s := open(t, proxy.url)
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
		before := proxy.trips.Load()
		err := c.create()
		var qe *delegate.QuotaError
		if c.refused != errors.As(err, &qe) || !c.refused && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := proxy.trips.Load() - before; got != c.trips {
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

// countingProxy forwards TCP connections to a PostgreSQL server's Unix
// socket and counts the round trips clients ask for. Cut, it closes them
// all and refuses new ones, as when the database is stopped or the
// network fails, until restored.
type countingProxy struct {
	url   string
	trips atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

// cut closes every connection and refuses new ones.
func (p *countingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// restore takes connections again.
func (p *countingProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

func newCountingProxy(t *testing.T, dbURL string) *countingProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	sockets, _ := filepath.Glob(filepath.Join(u.Query().Get("host"), ".s.PGSQL.*[0-9]"))
	if len(sockets) != 1 {
		t.Fatalf("the server's socket in %s: %v", dbURL, sockets)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host, u.RawQuery = ln.Addr().String(), "sslmode=disable"
	p := &countingProxy{url: u.String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				in.Close()
				continue
			}
			out, err := net.Dial("unix", sockets[0])
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			if p.down {
				in.Close()
				out.Close()
			}
			p.mu.Unlock()
			wg.Go(func() { io.Copy(in, out); in.Close() })
			wg.Go(func() { p.forward(out, in); out.Close() })
		}
	})
	return p
}

// forward copies what a client sends, message by message, counting its
// Syncs and simple Queries (but pings). The first message, the startup
// one, has no type byte.
func (p *countingProxy) forward(out io.Writer, in io.Reader) {
	r := bufio.NewReader(in)
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(head)-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return
	}
	if _, err := out.Write(append(head, body...)); err != nil {
		return
	}
	head = make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if head[0] == 'S' || head[0] == 'Q' && string(body) != "-- ping\x00" {
			p.trips.Add(1)
		}
		if _, err := out.Write(append(head, body...)); err != nil {
			return
		}
	}
}
