package proxmox_test

import (
	"testing"
	"time"

	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// TestContract runs the sandbox contract's suite against the Proxmox
// backend, on the simulator (whose guests run their commands for real,
// under the real qemu-guest-agent where it is installed).
func TestContract(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	cfg := proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond, Instance: "contract1", CheckpointDir: t.TempDir()}
	sandboxtest.Run(t, sandboxtest.Harness{
		New: func(t *testing.T) sandbox.Backend {
			b, err := proxmox.New(c, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Spec:     func() sandbox.Spec { return sandbox.Spec{CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30} },
		Commands: true,
		Hidden:   "/workspace/.qga", // the simulator's agent (pvesim/doc.go, "Known differences")
		Restart: func(t *testing.T, _ sandbox.Backend) sandbox.Backend {
			b, err := proxmox.New(c, cfg) // the same instance: a restarted server
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	})
}
