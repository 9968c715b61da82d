package proxmox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
)

// migrationSim is two nodes with the template on shared storage (Ceph),
// where VMs migrate live; a migration takes a while.
func migrationSim(t *testing.T) *pvesim.Server {
	t.Helper()
	return simWith(t, pvesim.DefaultNodes(2), pvesim.TemplateSpec{Storage: "ceph"}, func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.SharedStorage("ceph"))
		o.TaskDelays = map[string]time.Duration{"qmigrate": 700 * time.Millisecond}
	})
}

// migrate moves a VM live to another node, as an administrator (or a
// balancer) does, and waits for the end.
func migrate(t *testing.T, admin *pve.Client, vmid int, from, to string) {
	t.Helper()
	ctx := context.Background()
	upid, err := admin.MigrateVM(ctx, from, vmid, pve.MigrateOptions{Target: to, Online: true})
	if err == nil {
		err = admin.WaitTask(ctx, from, upid)
	}
	if err != nil {
		t.Fatalf("migrate VM %d to %s: %v", vmid, to, err)
	}
}

// TestJobFollowsMigration (issue 39, 2): a job whose VM migrates live
// while it runs goes on to its end, its output whole, and its VM is
// destroyed where it went; nothing of this server's is left.
func TestJobFollowsMigration(t *testing.T) {
	t.Parallel()
	sim := migrationSim(t)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	admin, _ := client(t, sim, "admin@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, "echo before; sleep 3; echo after", "", 0)
	vmid := runningVM(t, s.eng, sim, j.ID)
	if v, _ := sim.VM(vmid); v.Node != "pve1" {
		t.Fatalf("the job's VM is on %s", v.Node)
	}
	migrate(t, admin, vmid, "pve1", "pve2")
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "before\nafter\n" {
		t.Fatalf("%s %q %q", got.Status, got.Error, s.output(t, j.ID))
	}
	noJobVMs(t, sim)
	if d := deletes(sim, token); d[vmid] != 1 {
		t.Errorf("deletes %v, want VM %d once", d, vmid)
	}
}

// TestKeptSandboxFollowsMigration (issue 39, 2): a kept sandbox whose VM
// a node's bulk migration moves (Node → Bulk Migrate before a reboot)
// keeps its files and runs its next command there, and is destroyed on
// its new node when released.
func TestKeptSandboxFollowsMigration(t *testing.T) {
	t.Parallel()
	sim := migrationSim(t)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	admin, _ := client(t, sim, "admin@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	ctx := context.Background()
	sb, err := s.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(task string) *delegate.Job {
		t.Helper()
		j, err := s.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: task, Sandbox: sb.ID}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.wait(t, j.ID)
	}
	if j := run("echo kept > note.txt"); j.Status != delegate.StatusSuccess {
		t.Fatalf("first command: %s %s", j.Status, j.Error)
	}
	got, err := s.eng.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	vmid, _, _ := strings.Cut(strings.TrimPrefix(got.Instance, "vm-"), "-")
	upid, err := admin.MigrateAll(ctx, "pve1", "pve2", 2)
	if err == nil {
		err = admin.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := sim.VM(atoiT(t, vmid)); v.Node != "pve2" {
		t.Fatalf("the kept VM is on %s after the bulk migration", v.Node)
	}
	if j := run("cat note.txt"); j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "kept\n" {
		t.Fatalf("second command: %s %s %q", j.Status, j.Error, s.output(t, j.ID))
	}
	if _, released, err := s.eng.ReleaseSandbox(ctx, sb.ID); err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	noJobVMs(t, sim)
	if d := deletes(sim, token); d[atoiT(t, vmid)] != 1 {
		t.Errorf("deletes of the kept VM %s: %v", vmid, d)
	}
}
