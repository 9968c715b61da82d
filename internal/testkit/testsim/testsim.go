// Package testsim starts a fast Proxmox simulator for tests. It is
// imported by test files only.
package testsim

import (
	"context"
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
