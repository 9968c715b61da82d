// Package pgproxy is a TCP proxy to a PostgreSQL server's Unix socket, for
// tests: it counts the round trips clients ask for, and can be cut (every
// connection closed, new ones refused, as when the database is stopped or
// the network between a server and its store fails) and restored.
package pgproxy

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to one PostgreSQL server.
type Proxy struct {
	// URL is the database's URL through the proxy.
	URL   string
	trips atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

// New starts a proxy to the server of dbURL (a URL whose host is the
// directory of its Unix socket), stopped when the test ends.
func New(t testing.TB, dbURL string) *Proxy {
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
	p := &Proxy{URL: u.String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if p.isDown() {
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
			if p.down { // cut while it was dialled
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

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// Trips is how many round trips clients have asked for: their Syncs and
// simple Queries (but pings, "-- ping").
func (p *Proxy) Trips() int64 { return p.trips.Load() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Restore takes connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// forward copies what a client sends, message by message, counting its
// round trips. The first message, the startup one, has no type byte.
func (p *Proxy) forward(out io.Writer, in io.Reader) {
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
