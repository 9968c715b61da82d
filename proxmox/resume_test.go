package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestResumeSetsClock (issue 39, 6): a paused VM's clock stood still
// (kvmclock stops with its vCPUs; Proxmox does not set the guest's time
// on resume): after a resume the guest's time is set from the server's,
// in one exec, before anything else runs in it.
func TestResumeSetsClock(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	b, err := proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{JobID: "sbx-clock", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, MultiExec: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	p := sb.(sandbox.Pauser)
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	mark := len(sim.Requests())
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	var after []string
	for _, r := range sim.Requests()[mark:] {
		if r.TokenID == token {
			after = append(after, r.Method+" "+r.Path+" "+fmt.Sprint(r.Params["command"]))
		}
	}
	i := -1
	for k, r := range after {
		if strings.Contains(r, "/agent/exec ") && strings.Contains(r, "delegate-clock") {
			i = k
		}
	}
	if i < 0 || !strings.Contains(strings.Join(after[:i], "\n"), "/status/resume") {
		t.Fatalf("no clock set after the resume:\n%s", strings.Join(after, "\n"))
	}
}
