//go:build linux

package local

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// TestNetnsPool: the maker starts at the second take (a process making
// one sandbox makes none ahead); the namespaces made ahead are new ones,
// each its own, loopback up and nothing else; the maker stops, and lets
// go of what it made, once nobody takes any.
func TestNetnsPool(t *testing.T) {
	canRun(t)
	p := newNetnsPool(slog.New(slog.DiscardHandler))
	p.idle = 200 * time.Millisecond
	f := p.take()
	p.mu.Lock()
	running := p.running
	p.mu.Unlock()
	if f != nil || running {
		t.Fatalf("the first take: %v, the maker running %v; want none made ahead", f, running)
	}
	var got []*os.File
	if !waitFor(10*time.Second, func() bool {
		if f := p.take(); f != nil {
			got = append(got, f)
		}
		return len(got) == 2
	}) {
		t.Fatalf("the pool made %d namespaces", len(got))
	}
	host, _ := os.Readlink("/proc/self/ns/net")
	a, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", got[0].Fd()))
	b, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", got[1].Fd()))
	if !strings.HasPrefix(a, "net:[") || a == host || b == host || a == b {
		t.Errorf("namespaces %s and %s, the host's %s: want two new ones", a, b, host)
	}
	for _, f := range got {
		if ifaces, err := inNetns(f, probeLoopback); err != nil || ifaces != "lo up 127.0.0.1" {
			t.Errorf("in a namespace made ahead: %q, %v; want only loopback, up", ifaces, err)
		}
		f.Close()
	}
	if !waitFor(5*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.running && len(p.ready) == 0
	}) {
		t.Error("the maker did not stop, or kept namespaces, once unused")
	}
}

// TestBackendClose: Close stops the maker of namespaces, waits for it and
// closes what it made (nothing of it is left running), and reports what
// failed to close instead of nil whatever happened.
func TestBackendClose(t *testing.T) {
	b := newBackend(t, 0)
	pool := b.nets.pool
	pool.take()
	pool.take() // the maker runs
	if !waitFor(10*time.Second, func() bool { return len(pool.ready) == netnsPoolSize }) {
		t.Fatal("the maker made no namespaces")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	pool.mu.Lock()
	running := pool.running
	pool.mu.Unlock()
	if running || len(pool.ready) != 0 {
		t.Errorf("after Close the maker runs (%v) or holds %d namespaces", running, len(pool.ready))
	}
	if f := pool.take(); f != nil || pool.running {
		t.Error("a closed pool makes namespaces again")
	}

	// A namespace that fails to close (closed already here) is reported.
	b2 := newBackend(t, 0)
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	b2.nets.pool.ready <- f
	if err := b2.Close(); err == nil || !strings.Contains(err.Error(), "network namespaces made ahead") {
		t.Errorf("Close with a namespace that fails to close = %v, want that failure", err)
	}
}

// inNetns runs fn on a thread moved into the network namespace f; the
// thread ends with it.
func inNetns(f *os.File, fn func() (string, error)) (string, error) {
	type result struct {
		s   string
		err error
	}
	ch := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread's namespace is not the process's
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{"", err}
			return
		}
		s, err := fn()
		ch <- result{s, err}
	}()
	r := <-ch
	return r.s, r.err
}

// probeLoopback describes the interfaces: "lo up 127.0.0.1" for a fresh
// sandbox namespace.
func probeLoopback() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	var out []string
	for _, i := range ifs {
		state := "down"
		if i.Flags&net.FlagUp != 0 {
			state = "up"
		}
		addrs, _ := i.Addrs()
		var as []string
		for _, a := range addrs {
			if ip, _, err := net.ParseCIDR(a.String()); err == nil && ip.To4() != nil {
				as = append(as, ip.String())
			}
		}
		out = append(out, strings.Join(append([]string{i.Name, state}, as...), " "))
	}
	return strings.Join(out, "; "), nil
}

// TestSandboxNetnsIsItsOwn: sandboxes running at once (their namespaces
// from the pool or not) each have a network namespace of their own.
func TestSandboxNetnsIsItsOwn(t *testing.T) {
	b := newBackend(t, 0)
	host, _ := os.Readlink("/proc/self/ns/net")
	seen := map[string]bool{host: true}
	for i := range 4 {
		sb := create(t, b, defaultSpec())
		p := start(t, sb, "/bin/sh", "-c", "readlink /proc/self/ns/net; sleep 60")
		var out []byte
		waitFor(10*time.Second, func() bool {
			outs, _ := p.ReadOutput(context.Background(), 0, 100)
			out = sandbox.Join(outs)
			return strings.HasSuffix(string(out), "\n")
		})
		ns := strings.TrimSpace(string(out))
		if !strings.HasPrefix(ns, "net:[") || seen[ns] {
			t.Errorf("sandbox %d: network namespace %q, seen before (the host's is %s): %v", i, ns, host, seen)
		}
		seen[ns] = true
		defer p.Kill(context.Background())
	}
}
