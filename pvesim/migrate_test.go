package pvesim

import (
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// migrationSim is two nodes with the template on shared storage.
func migrationSim(t *testing.T, delay time.Duration) *sim {
	t.Helper()
	s := newSim(t, Options{Nodes: DefaultNodes(2), Storages: append(DefaultStorages(), SharedStorage("ceph")),
		TaskDelays: map[string]time.Duration{"qmigrate": delay}})
	if err := s.AddTemplate("pve1", 9100, "ceph-tpl", TemplateSpec{Storage: "ceph"}); err != nil {
		t.Fatal(err)
	}
	return s
}

func bootFrom(t *testing.T, s *sim, tpl, id int) {
	t.Helper()
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tpl, pve.CloneOptions{NewID: id})
	if err == nil {
		err = s.c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	if upid, err = s.c.StartVM(ctx, "pve1", id); err == nil {
		err = s.c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitAgent(t, s, id)
}

// TestMigrate: an online migration keeps the guest running and its
// commands going; during it the config is locked "migrate" and stays on
// the source node; at its end the config is on the target node, the old
// node no longer has it, and the listing says where it went. Refusals
// are migrate_vm's.
func TestMigrate(t *testing.T) {
	s := migrationSim(t, 600*time.Millisecond)
	ctx := ctxT(t)
	c := s.c
	bootFrom(t, s, 9100, 200)
	pid, err := c.AgentExec(ctx, "pve1", 200, []string{"/bin/sh", "-c", "sleep 1.5; echo survived"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.MigrateVM(ctx, "pve1", 200, pve.MigrateOptions{Target: "pve2"}); reasonOf(err) != "can't migrate running VM without --online" {
		t.Errorf("offline migration of a running VM: %v", err)
	}
	var api *pve.APIError
	if _, err := c.MigrateVM(ctx, "pve1", 200, pve.MigrateOptions{Target: "pve1", Online: true}); !errorsAs(err, &api) || api.Errors["target"] != "target is local node." {
		t.Errorf("migration to its own node: %v", err)
	}
	if _, err := c.MigrateVM(ctx, "pve1", 200, pve.MigrateOptions{Target: "pve9", Online: true}); reasonOf(err) != "no such cluster node 'pve9'" {
		t.Errorf("migration to no node: %v", err)
	}

	upid, err := c.MigrateVM(ctx, "pve1", 200, pve.MigrateOptions{Target: "pve2", Online: true})
	if err != nil {
		t.Fatal(err)
	}
	// The window: locked, still on pve1, its agent answering there.
	cfg, err := c.VMConfig(ctx, "pve1", 200)
	if err != nil || cfg.Lock != "migrate" {
		t.Errorf("during the migration: lock %q, %v", cfg.Lock, err)
	}
	if err := c.SetVMConfig(ctx, "pve1", 200, pve.VMConfigUpdate{Tags: []string{"x"}}); reasonOf(err) != "VM is locked (migrate)" {
		t.Errorf("config change during the migration: %v", err)
	}
	if err := c.AgentPing(ctx, "pve1", 200); err != nil {
		t.Errorf("agent during the migration: %v", err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VMConfig(ctx, "pve1", 200); reasonOf(err) != "Configuration file 'nodes/pve1/qemu-server/200.conf' does not exist" {
		t.Errorf("the old node after the migration: %v", err)
	}
	cfg, err = c.VMConfig(ctx, "pve2", 200)
	if err != nil || cfg.Lock != "" {
		t.Fatalf("the new node: lock %q, %v", cfg.Lock, err)
	}
	res, _ := c.ClusterResources(ctx, pve.ResourceVM)
	for _, r := range res {
		if r.VMID == 200 && (r.Node != "pve2" || r.Status != "running") {
			t.Errorf("listed %+v", r)
		}
	}
	// The command started before goes on, read on the new node.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.AgentExecStatus(ctx, "pve2", 200, pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited {
			if string(st.Stdout) != "survived\n" {
				t.Errorf("the command's output %q", st.Stdout)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A VM on local storage is not live-migrated without its disks.
	bootFrom(t, s, tplID, 201)
	upid, err = c.MigrateVM(ctx, "pve1", 201, pve.MigrateOptions{Target: "pve2", Online: true})
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "can't live migrate attached local disks without with-local-disks option" {
		t.Errorf("local disks: %q", te.ExitStatus)
	}
	if v, _ := s.VM(201); v.Node != "pve1" || v.Lock != "" {
		t.Errorf("after the failed migration: %+v", v)
	}
}

// TestMigrateAll: a node's bulk migration moves every guest it can, a
// running one online, and says which it could not.
func TestMigrateAll(t *testing.T) {
	s := migrationSim(t, 100*time.Millisecond)
	ctx := ctxT(t)
	bootFrom(t, s, 9100, 300)
	upid, err := s.c.CloneVM(ctx, "pve1", 9100, pve.CloneOptions{NewID: 301})
	if err == nil {
		err = s.c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	upid, err = s.c.MigrateAll(ctx, "pve1", "pve2", 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{300, 301, 9100} {
		if v, _ := s.VM(id); v.Node != "pve2" {
			t.Errorf("VM %d on %s", id, v.Node)
		}
	}
	if v, _ := s.VM(300); v.Status != "running" || !v.AgentUp {
		t.Errorf("the running VM after its migration: %+v", v)
	}
	// The template on local storage stays, and the log says why.
	if v, _ := s.VM(tplID); v.Node != "pve1" {
		t.Errorf("the local template moved to %s", v.Node)
	}
	var log string
	for _, task := range s.Tasks() {
		if task.UPID == upid {
			log = strings.Join(task.Log, "\n")
		}
	}
	if !strings.Contains(log, "Migrating VM 300") || !strings.Contains(log, "All jobs finished, used 4 workers in total.") {
		t.Errorf("migrateall's log:\n%s", log)
	}
}
