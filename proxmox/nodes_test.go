package proxmox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
)

// TestNodesAllowedAndMaintenance (issue 39, 11): jobs go only to the
// nodes PROXMOX_NODES names, and not to one in HA maintenance mode.
func TestNodesAllowedAndMaintenance(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(3), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{Nodes: []string{"pve2", "pve3"}}, engine.Config{MaxConcurrent: 2})
	if err := sim.SetNodeMaintenance("pve3", true); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		j := s.wait(t, s.submit(t, fmt.Sprintf("echo %d", i), "", 0).ID)
		if j.Status != delegate.StatusSuccess {
			t.Fatalf("%s %q", j.Status, j.Error)
		}
		if steps := strings.Join(s.store.steps(j.ID), "; "); !strings.Contains(steps, "cloning from debian-job on pve2") {
			t.Errorf("job %d went elsewhere: %s", i, steps)
		}
	}
	if _, err := proxmox.New(c, proxmox.Config{Nodes: []string{"pve_1"}}); err == nil || !strings.Contains(err.Error(), "PROXMOX_NODES") {
		t.Errorf("a bad node name: %v", err)
	}
}

// TestAPIFailover (issue 39, 12): PROXMOX_HOST lists several nodes; with
// the first one down, calls go to the next, and jobs run (cloned from a
// copy of the template on a node that is up).
func TestAPIFailover(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(2), pvesim.TemplateSpec{}, nil)
	if err := sim.AddTemplate("pve2", 9001, "debian-job-pve2", pvesim.TemplateSpec{Tags: "delegate-template-debian-job"}); err != nil {
		t.Fatal(err)
	}
	secret := "failover-secret"
	if err := sim.AddToken(pvesim.Token{ID: "delegate@pve!tk", Secret: secret, Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, n := range []string{"pve1", "pve2"} {
		u, err := sim.ListenNode(n)
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, strings.TrimPrefix(u, "https://"))
	}
	env := map[string]string{"PROXMOX_HOST": strings.Join(hosts, ","), "PROXMOX_USER": "delegate@pve", "PROXMOX_TOKEN_NAME": "tk",
		"PROXMOX_TOKEN_VALUE": secret, "PROXMOX_SSL_MODE": "verify", "PROXMOX_FINGERPRINT": sim.Fingerprint()}
	cfg, err := pve.ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	cfg.TaskPollInterval, cfg.RetryDelay = 20*time.Millisecond, 20*time.Millisecond
	c, err := pve.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	if err := sim.SetNodeOnline("pve1", false); err != nil {
		t.Fatal(err)
	}
	j := s.wait(t, s.submit(t, "echo failover", "", 0).ID)
	if j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "failover\n" {
		t.Fatalf("%s %q %q", j.Status, j.Error, s.output(t, j.ID))
	}
}

// TestVMIDRange (issue 39, 13): with PROXMOX_VMID_RANGE, this server's
// VMs take vmids of the range only, past those taken, though
// /cluster/nextid would give a lower one.
func TestVMIDRange(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	// Someone's VM at the range's start.
	upid, err := c.CloneVM(t.Context(), "pve1", 9000, pve.CloneOptions{NewID: 5000, Name: "someones"})
	if err == nil {
		err = c.WaitTask(t.Context(), "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, c, proxmox.Config{VMIDRange: [2]int{5000, 5009}}, engine.Config{})
	var got []string
	for range 2 {
		j := s.wait(t, s.submit(t, "true", "", 0).ID)
		if j.Status != delegate.StatusSuccess {
			t.Fatalf("%s %q", j.Status, j.Error)
		}
		got = append(got, strings.SplitN(j.SandboxID, "-", 3)[1])
	}
	if strings.Join(got, ",") != "5001,5002" {
		t.Errorf("vmids %v, want 5001,5002", got)
	}
	for _, bad := range []string{"99-200", "5000", "6000-5000", "a-b"} {
		if _, _, err := proxmox.ParseVMIDRange(bad); err == nil {
			t.Errorf("ParseVMIDRange(%q) accepted", bad)
		}
	}
}

// TestDrain (issue 39, 11): a drained node (a line in its notes, which
// every server reads) takes no new VM; what is on it is listed, and a
// kept sandbox there goes on; undone, the node takes VMs again.
func TestDrain(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(2), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	admin, _ := client(t, sim, "admin@pve", pvesim.RoleAdministrator)
	// The nodes' notes are read afresh each time: a drain is seen at once.
	s := newServer(t, c, proxmox.Config{NodeNotesTTL: time.Nanosecond}, engine.Config{})
	kept := keptVM(t, s)
	v, _ := sim.VM(kept)
	vms, err := proxmox.Drain(t.Context(), admin, v.Node, false)
	if err != nil || len(vms) != 1 || vms[0].VMID != kept || vms[0].Kind != "kept sandbox" {
		t.Fatalf("drain %s: %+v %v", v.Node, vms, err)
	}
	for i := range 2 {
		j := s.wait(t, s.submit(t, fmt.Sprintf("echo %d", i), "", 0).ID)
		if steps := strings.Join(s.store.steps(j.ID), "; "); j.Status != delegate.StatusSuccess || strings.Contains(steps, " on "+v.Node) {
			t.Errorf("job %d on the drained node %s: %s %q: %s", i, v.Node, j.Status, j.Error, steps)
		}
	}
	if _, err := proxmox.Drain(t.Context(), admin, v.Node, true); err != nil {
		t.Fatal(err)
	}
	if nc, _ := admin.NodeConfig(t.Context(), v.Node); strings.Contains(nc.Description, "drained") {
		t.Errorf("notes after undo: %q", nc.Description)
	}
}
