package proxmox

import (
	"context"
	"testing"

	"github.com/delegate-dev/delegate/pve"
)

func TestSurvey(t *testing.T) {
	t.Parallel()
	const gib = 1 << 30
	resources := []pve.Resource{
		{Type: "node", Node: "pve1", Status: "online", MaxMem: 32 * gib},
		{Type: "node", Node: "pve2", Status: "online", MaxMem: 16 * gib},
		{Type: "node", Node: "pve3", Status: "offline"},
		{Type: "storage", Node: "pve1", Storage: "ceph", Shared: true},
		{Type: "storage", Node: "pve1", Storage: "local-lvm"},
		{Type: "qemu", VMID: 9000, Node: "pve1", Template: true, MaxMem: 2 * gib, Status: "stopped"},
		{Type: "qemu", VMID: 100, Node: "pve1", Status: "running", MaxMem: 4 * gib},                                     // counts
		{Type: "qemu", VMID: 101, Node: "pve1", Status: "stopped", MaxMem: 8 * gib},                                     // someone's, stopped
		{Type: "qemu", VMID: 102, Node: "pve1", Status: "stopped", Lock: "clone", MaxMem: 1 * gib},                      // being cloned
		{Type: "qemu", VMID: 103, Node: "pve2", Status: "stopped", Tags: "delegate;delegate-ffff0000", MaxMem: 2 * gib}, // another delegate, starting
		{Type: "lxc", VMID: 104, Node: "pve2", Status: "running", MaxMem: 512 << 20},
		{Type: "qemu", VMID: 105, Node: "pve2", Status: "running", MaxMem: 3 * gib}, // ours, counted by its hold
		{Type: "qemu", VMID: 106, Node: "pve3", Status: "unknown"},                  // offline node
	}
	b, err := New(nil, Config{Instance: "abcd1234"})
	if err != nil {
		t.Fatal(err)
	}
	b.placer.reserve("pve2", pve.Resource{}, nil, false, 1024, 2).bind(105)
	cl := b.placer.survey(context.Background(), resources, nil)
	if len(cl.order) != 2 || cl.why != "" {
		t.Fatalf("online nodes %v (%s)", cl.order, cl.why)
	}
	if n := cl.nodes["pve1"]; n.capacity != 30*gib || n.used != 5*gib {
		t.Errorf("pve1: %+v", n)
	}
	if n := cl.nodes["pve2"]; n.capacity != 14*gib || n.used != 2*gib+512<<20 {
		t.Errorf("pve2: %+v", n)
	}
	if got, cpus := b.placer.heldOn("pve2", cl.vmids); got != 1<<30 || cpus != 2 {
		t.Errorf("held on pve2: %d", got)
	}
	if !cl.shared("pve1", []string{"ceph"}) || cl.shared("pve1", []string{"ceph", "local-lvm"}) || cl.shared("pve2", []string{"ceph"}) {
		t.Error("shared storage misread")
	}
	// A hold whose VM was destroyed elsewhere no longer counts.
	delete(cl.vmids, 105)
	if got, _ := b.placer.heldOn("pve2", cl.vmids); got != 0 {
		t.Errorf("held on pve2 after its VM went: %d", got)
	}

	// The operator's setting wins, per node or for all; without it and
	// without maxmem (no Sys.Audit), placement is blind and says why.
	blindRes := []pve.Resource{{Type: "node", Node: "pve1", Status: "online"}, {Type: "node", Node: "pve2", Status: "online"}}
	b.cfg.NodeMemory = map[string]int64{"pve1": 6 * gib}
	cl = b.placer.survey(context.Background(), blindRes, nil)
	if cl.nodes["pve1"].capacity != 6*gib || cl.nodes["pve2"].capacity != 0 || cl.why == "" {
		t.Errorf("per node: %+v %+v %q", cl.nodes["pve1"], cl.nodes["pve2"], cl.why)
	}
	b.cfg.NodeMemory = map[string]int64{"": 8 * gib, "pve1": 6 * gib}
	cl = b.placer.survey(context.Background(), blindRes, nil)
	if cl.nodes["pve1"].capacity != 6*gib || cl.nodes["pve2"].capacity != 8*gib || cl.why != "" {
		t.Errorf("default: %+v %+v %q", cl.nodes["pve1"], cl.nodes["pve2"], cl.why)
	}
}
