// Package testsim starts a fast Proxmox simulator for tests. It is
// imported by test files only.
package testsim

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pvesim"
)

// Start starts a fast Proxmox simulator of nodes (tasks of 20 ms,
// boots of 100 ms, no delay after a failed login), tuned by tune, closed
// when the test ends. Its guests' sandboxes live in a temporary directory.
func Start(t testing.TB, nodes []pvesim.NodeSpec, tune func(*pvesim.Options)) *pvesim.Server {
	t.Helper()
	opts := pvesim.Options{
		Nodes:            nodes,
		TaskDelay:        20 * time.Millisecond,
		BootDelay:        100 * time.Millisecond,
		AuthFailureDelay: -1,
		SandboxDir:       t.TempDir(),
	}
	if tune != nil {
		tune(&opts)
	}
	sim, err := pvesim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// Printed runs a `delegate pve-sim` (run, given a context and its
// stdout) until the test ends, and returns the settings it prints
// (`export KEY='value'` lines, up to the line saying it runs). run's
// context is cancelled at the test's end, and waited for.
func Printed(t testing.TB, run func(ctx context.Context, stdout io.Writer)) map[string]string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		go io.Copy(io.Discard, pr)
		<-done
	})
	env := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "# pvesim runs as pid") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "="); ok {
			env[k] = strings.Trim(v, "'")
		}
	}
	return env
}
