package pvesim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

func ptr[T any](v T) *T { return &v }

// reasonOf is the Proxmox message of an API error ("" for others).
func reasonOf(err error) string {
	var api *pve.APIError
	if errors.As(err, &api) {
		return api.Reason
	}
	return ""
}

// taskErr waits for a task that must fail and returns its exit status.
func taskErr(t *testing.T, s *sim, upid string) *pve.TaskError {
	t.Helper()
	err := s.c.WaitTask(ctxT(t), "", upid)
	var te *pve.TaskError
	if !errors.As(err, &te) {
		t.Fatalf("task %s: %v, want a TaskError", upid, err)
	}
	if n := len(te.Log); n == 0 || te.Log[n-1] != "TASK ERROR: "+te.ExitStatus {
		t.Errorf("log tail %q does not end with the error", te.Log)
	}
	return te
}

// TestCloneLock: the new VM is locked while the clone runs; the source's
// config lock is held too.
func TestCloneLock(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": 600 * time.Millisecond}})
	ctx := ctxT(t)
	c := s.c
	upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	if err != nil {
		t.Fatal(err)
	}
	// While it runs: the new VM exists, locked, and says so.
	conf, err := c.VMConfig(ctx, "pve1", 101)
	if err != nil || conf.Lock != "clone" {
		t.Fatalf("config during clone: %+v %v", conf, err)
	}
	res, _ := c.ClusterResources(ctx, pve.ResourceVM)
	found := false
	for _, r := range res {
		found = found || (r.VMID == 101 && r.Lock == "clone")
	}
	if !found {
		t.Errorf("resources do not show the lock: %+v", res)
	}
	err = c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{Cores: 4})
	if !pve.IsLocked(err) || pve.LockReason(err) != "clone" || reasonOf(err) != "VM is locked (clone)" {
		t.Errorf("config during clone: %v", err)
	}
	start, err := c.StartVM(ctx, "pve1", 101)
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, start); te.ExitStatus != "VM is locked (clone)" || !pve.IsLocked(te) {
		t.Errorf("start during clone: %v", te)
	}
	// The template cannot be destroyed while cloned from.
	del, err := c.DeleteVM(ctx, "pve1", tplID, pve.DeleteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, del); te.ExitStatus != "can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout" {
		t.Errorf("delete template during clone: %v", te)
	}
	// A second clone into the same id collides at once.
	if _, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101}); !pve.IsAlreadyExists(err) ||
		reasonOf(err) != "unable to create VM 101: config file already exists" {
		t.Errorf("collision: %v", err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if conf, _ := c.VMConfig(ctx, "pve1", 101); conf.Lock != "" || conf.Name != "Copy-of-VM-debian-tpl" {
		t.Errorf("after clone: %+v", conf)
	}
}

// TestVMIDCollision: an existing vmid is refused by clone and nextid.
func TestVMIDCollision(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	if _, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: tplID}); reasonOf(err) != "unable to create VM 9000: config file already exists" {
		t.Errorf("clone onto the template: %v", err)
	}
	free, err := s.c.VMIDFree(ctx, tplID)
	if err != nil || free {
		t.Errorf("VMIDFree(9000) = %v, %v", free, err)
	}
	if free, err := s.c.VMIDFree(ctx, 555); err != nil || !free {
		t.Errorf("VMIDFree(555) = %v, %v", free, err)
	}
}

// TestTemplates: the rules of templates and linked clones.
func TestTemplates(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2)})
	ctx := ctxT(t)
	c := s.c
	start, _ := c.StartVM(ctx, "pve1", tplID)
	if te := taskErr(t, s, start); te.ExitStatus != "you can't start a vm if it's a template" {
		t.Errorf("start template: %v", te)
	}
	upid, _ := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 200, Full: ptr(true)})
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		src    int
		opt    pve.CloneOptions
		reason string
	}{
		{"linked clone of a VM", 200, pve.CloneOptions{NewID: 201}, ""},
		{"explicit linked clone of a VM", 200, pve.CloneOptions{NewID: 204, Full: ptr(false)}, "Linked clone feature is not supported for drive 'scsi0'"},
		{"storage on a linked clone", tplID, pve.CloneOptions{NewID: 202, Storage: "local-lvm"}, "parameter 'storage' not allowed for linked clones"},
		{"format on a linked clone", tplID, pve.CloneOptions{NewID: 202, Format: "qcow2"}, "parameter 'format' not allowed for linked clones"},
		{"other node, local storage", tplID, pve.CloneOptions{NewID: 202, Target: "pve2"}, "can't clone VM to node 'pve2' (VM uses local storage)"},
		{"unknown pool", tplID, pve.CloneOptions{NewID: 202, Pool: "jobs"}, "pool 'jobs' does not exist"},
		{"full clone to a storage", tplID, pve.CloneOptions{NewID: 203, Full: ptr(true), Storage: "local-lvm"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			upid, err := c.CloneVM(ctx, "pve1", tt.src, tt.opt)
			if tt.reason == "" {
				// A VM (not a template) is cloned full by default.
				if err != nil {
					t.Fatal(err)
				}
				if err := c.WaitTask(ctx, "", upid); err != nil {
					t.Fatal(err)
				}
				return
			}
			if reasonOf(err) != tt.reason {
				t.Errorf("got %v, want %q", err, tt.reason)
			}
		})
	}
	conf, _ := c.VMConfig(ctx, "pve1", 201)
	if !strings.HasPrefix(conf.Option("scsi0"), "local-lvm:vm-201-disk-0,") {
		t.Errorf("default clone of a VM is full: %s", conf.Option("scsi0"))
	}
	// A template with linked clones cannot go.
	upid, _ = c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 210})
	c.WaitTask(ctx, "", upid)
	del, err := c.DeleteVM(ctx, "pve1", tplID, pve.DeleteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, del); te.ExitStatus != "base volume 'local-lvm:base-9000-disk-0' is still in use by linked cloned" {
		t.Errorf("delete used template: %v", te)
	}
	// Once its linked clone is gone, it can.
	del, _ = c.DeleteVM(ctx, "pve1", 210, pve.DeleteOptions{})
	if err := c.WaitTask(ctx, "", del); err != nil {
		t.Fatal(err)
	}
	del, _ = c.DeleteVM(ctx, "pve1", tplID, pve.DeleteOptions{})
	if err := c.WaitTask(ctx, "", del); err != nil {
		t.Errorf("delete unused template: %v", err)
	}
}

// TestCapacity: a node's memory and cores bound what starts on it.
func TestCapacity(t *testing.T) {
	s := newSim(t, Options{Nodes: []NodeSpec{{Name: "pve1", CPUs: 4, MemoryBytes: 6 << 30}}})
	ctx := ctxT(t)
	c := s.c
	for _, id := range []int{101, 102, 103} {
		upid, _ := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: id})
		if err := c.WaitTask(ctx, "", upid); err != nil {
			t.Fatal(err)
		}
	}
	// 6 GiB, 1.5 of them the host's: two 2 GiB VMs fit, a third does not.
	for _, id := range []int{101, 102} {
		upid, _ := c.StartVM(ctx, "pve1", id)
		if err := c.WaitTask(ctx, "", upid); err != nil {
			t.Fatalf("start %d: %v", id, err)
		}
	}
	upid, _ := c.StartVM(ctx, "pve1", 103)
	te := taskErr(t, s, upid)
	if te.ExitStatus != "start failed: QEMU exited with code 1" || !strings.Contains(strings.Join(te.Log, "\n"), "Cannot allocate memory") {
		t.Errorf("third start: %v %q", te, te.Log)
	}
	nodes, _ := c.Nodes(ctx)
	if len(nodes) != 1 || nodes[0].MaxMem != 6<<30 || nodes[0].Mem != hostMemBase+4<<30 || nodes[0].MaxCPU != 4 {
		t.Errorf("node: %+v", nodes)
	}
	// Starting it again after another stops works.
	upid, _ = c.StopVM(ctx, "pve1", 101)
	c.WaitTask(ctx, "", upid)
	upid, _ = c.StartVM(ctx, "pve1", 103)
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Errorf("start after room was made: %v", err)
	}
	// Already running: a failed task, not an HTTP error.
	upid, _ = c.StartVM(ctx, "pve1", 103)
	if te := taskErr(t, s, upid); te.ExitStatus != "VM 103 already running" {
		t.Errorf("second start: %v", te)
	}
	// More vCPUs than the node has.
	if err := c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{Cores: 3, Sockets: 2}); err != nil {
		t.Fatal(err)
	}
	upid, _ = c.StartVM(ctx, "pve1", 101)
	if te := taskErr(t, s, upid); te.ExitStatus != "MAX 4 vcpus allowed per VM on this node" {
		t.Errorf("6 vCPUs on 4 cores: %v", te)
	}
	// A bridge the node does not have.
	c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{Cores: 1, Sockets: 1, Nets: map[int]string{0: "virtio,bridge=vmbr9"}})
	upid, _ = c.StartVM(ctx, "pve1", 101)
	if te := taskErr(t, s, upid); te.ExitStatus != "bridge 'vmbr9' does not exist" {
		t.Errorf("unknown bridge: %v", te)
	}
}

// TestResize: disks grow (a task), never shrink.
func TestResize(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	c := s.c
	upid, _ := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	c.WaitTask(ctx, "", upid)
	upid, err := c.ResizeDisk(ctx, "pve1", 101, "scsi0", "+2G")
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := pve.ParseUPID(upid); u.Type != "resize" {
		t.Errorf("task type %q", u.Type)
	}
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	conf, _ := c.VMConfig(ctx, "pve1", 101)
	if !strings.Contains(conf.Option("scsi0"), "size=10G") {
		t.Errorf("after +2G: %s", conf.Option("scsi0"))
	}
	upid, _ = c.ResizeDisk(ctx, "pve1", 101, "scsi0", "4G")
	if te := taskErr(t, s, upid); te.ExitStatus != "shrinking disks is not supported" {
		t.Errorf("shrink: %v", te)
	}
	upid, _ = c.ResizeDisk(ctx, "pve1", 101, "scsi1", "+1G")
	if te := taskErr(t, s, upid); te.ExitStatus != "disk 'scsi1' does not exist" {
		t.Errorf("missing disk: %v", te)
	}
	if _, err := c.ResizeDisk(ctx, "pve1", 101, "scsi0", "1GB"); !pve.IsParamError(err) {
		t.Errorf("bad size: %v", err)
	}
}

// TestTaskLogPaging: start, limit and total of a task log, and the tail
// WaitTask keeps.
func TestTaskLogPaging(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	upid, _ := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	s.c.WaitTask(ctx, "", upid)
	lines, total, err := s.c.TaskLog(ctx, "pve1", upid, 0, 50)
	if err != nil || total != len(lines) || total < 2 || lines[0].N != 1 || lines[total-1].T != "TASK OK" {
		t.Fatalf("log: %v %d %v", lines, total, err)
	}
	if lines[0].T != "create linked clone of drive scsi0 (local-lvm:base-9000-disk-0)" {
		t.Errorf("first line %q", lines[0].T)
	}
	tail, total2, _ := s.c.TaskLog(ctx, "pve1", upid, total-1, 5)
	if total2 != total || len(tail) != 1 || tail[0].N != int64ToInt(total) {
		t.Errorf("tail: %v %d", tail, total2)
	}
}

func int64ToInt(n int) pve.Int { return pve.Int(n) }
