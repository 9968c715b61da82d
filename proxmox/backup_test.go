package proxmox_test

import (
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
)

// TestBackupLockAndNoPurge (issue 39, 8): a backup job of mode "all"
// holds lock: backup on a job VM when the job ends; its destroy waits for
// the lock to go (it gave up after 20 polls), and no destroy asks for
// purge, which rewrites the cluster's backup and replication jobs.
func TestBackupLockAndNoPurge(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, "sleep 1; echo done", "", 0)
	vmid := runningVM(t, s.eng, sim, j.ID)
	if err := sim.SetVMLock(vmid, "backup"); err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan struct{})
	go func() {
		defer close(unlocked)
		time.Sleep(3 * time.Second) // a config-only backup of the VM
		sim.SetVMLock(vmid, "")
	}()
	if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "done\n" {
		t.Fatalf("%s %q %q", got.Status, got.Error, s.output(t, j.ID))
	}
	<-unlocked
	noJobVMs(t, sim)
	if d := deletes(sim, token); d[vmid] != 1 {
		t.Errorf("deletes %v, want VM %d once", d, vmid)
	}
	for _, r := range sim.Requests() {
		if r.Method == "DELETE" && r.Params["purge"] != nil {
			t.Errorf("a destroy with purge: %s %v", r.Path, r.Params)
		}
	}
}
