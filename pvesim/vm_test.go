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

// waitVM waits until a VM exists (a clone's task writes its config when
// it begins, just after the request).
func waitVM(t *testing.T, s *sim, id int) {
	t.Helper()
	for range 1000 {
		if _, ok := s.VM(id); ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("VM %d never appeared", id)
}

// TestCloneLock: while a clone runs, the new VM exists, locked "clone";
// config changes are refused at once; a start or a destroy waits for the
// clone's config locks (up to 10 s), as PVE's flock does.
func TestCloneLock(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": 600 * time.Millisecond}})
	ctx := ctxT(t)
	c := s.c
	upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	if err != nil {
		t.Fatal(err)
	}
	waitVM(t, s, 101)
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
	// A second clone into the same id collides at once.
	if _, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101}); !pve.IsAlreadyExists(err) ||
		reasonOf(err) != "unable to create VM 101: config file already exists" {
		t.Errorf("collision: %v", err)
	}
	// A start waits for the clone, then works.
	start, err := c.StartVM(ctx, "pve1", 101)
	if err != nil {
		t.Fatal(err)
	}
	// The template's destroy waits for the clone's shared lock, then finds
	// the new linked clone using its base volume.
	del, err := c.DeleteVM(ctx, "pve1", tplID, pve.DeleteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "pve1", start); err != nil {
		t.Errorf("start after the clone: %v", err)
	}
	if te := taskErr(t, s, del); te.ExitStatus != "base volume 'local-lvm:base-9000-disk-0' is still in use by linked cloned" {
		t.Errorf("delete template during clone: %v", te)
	}
	if conf, _ := c.VMConfig(ctx, "pve1", 101); conf.Lock != "" || conf.Name != "Copy-of-VM-debian-tpl" {
		t.Errorf("after clone: %+v", conf)
	}
}

// TestCloneLockTimeout: what waits for a clone longer than PVE's lock
// time-out gives up with lock_file_full's message (time-outs scaled down).
func TestCloneLockTimeout(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": time.Second}, LockTimeoutScale: 0.02})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	if err != nil {
		t.Fatal(err)
	}
	waitVM(t, s, 101)
	start, _ := s.c.StartVM(ctx, "pve1", 101)
	if te := taskErr(t, s, start); te.ExitStatus != "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout" {
		t.Errorf("start during a long clone: %v", te)
	}
	if err := s.c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
}

// TestNextIDCollision: nextid reserves nothing, so two clones may be
// given the same id; both requests pass (the config does not exist yet)
// and the task that loses fails with PVE's words: a lock time-out while
// the winner clones, or "config file already exists" once it is done.
func TestNextIDCollision(t *testing.T) {
	for _, tc := range []struct {
		name  string
		clone time.Duration
		want  string
	}{
		{"winner still cloning", 1500 * time.Millisecond, "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout"},
		{"winner done", 100 * time.Millisecond, "unable to create VM 100: config file already exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": tc.clone}})
			ctx := ctxT(t)
			a, _ := s.c.NextID(ctx)
			b, _ := s.c.NextID(ctx)
			if a != 100 || b != 100 {
				t.Fatalf("nextid %d, %d: want 100 twice (nothing is reserved)", a, b)
			}
			// Both tasks wait for the template's config lock (held here, as
			// a config update would), so both pass the request's check.
			release, err := s.lockConfig(ctx, "pve1", tplID, false, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			up1, err1 := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: a, Name: "first"})
			up2, err2 := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: b, Name: "second"})
			if err1 != nil || err2 != nil {
				t.Fatalf("requests: %v, %v", err1, err2)
			}
			time.Sleep(100 * time.Millisecond)
			release()
			e1, e2 := s.c.WaitTask(ctx, "", up1), s.c.WaitTask(ctx, "", up2)
			if (e1 == nil) == (e2 == nil) {
				t.Fatalf("want one winner: %v, %v", e1, e2)
			}
			lost, winner := e1, "second"
			if e1 == nil {
				lost, winner = e2, "first"
			}
			var te *pve.TaskError
			if !errors.As(lost, &te) || te.ExitStatus != tc.want {
				t.Errorf("loser: %v, want %q", lost, tc.want)
			}
			if v, ok := s.VM(100); !ok || v.Name != winner || v.Lock != "" {
				t.Errorf("VM 100 after the race: %+v (want %s's)", v, winner)
			}
		})
	}
}

// TestStorageLock: parallel clones from one storage take turns on its
// lock; one that waits longer than the time-out fails. A local storage's
// lock is a node's flock, a shared one's pmxcfs's.
func TestStorageLock(t *testing.T) {
	for _, tc := range []struct {
		storage string
		want    string
	}{
		{"local-lvm", "clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout"},
		{"ceph", "clone failed: cfs-lock 'storage-ceph' error: got lock request timeout"},
	} {
		t.Run(tc.storage, func(t *testing.T) {
			s := newSim(t, Options{Storages: append(DefaultStorages(), SharedStorage("ceph")),
				StorageLockHold: 400 * time.Millisecond, LockTimeoutScale: 0.05}) // 500 ms
			if err := s.AddTemplate("pve1", 9100, "tpl", TemplateSpec{Storage: tc.storage}); err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			var upids []string
			for _, id := range []int{101, 102, 103} {
				upid, err := s.c.CloneVM(ctx, "pve1", 9100, pve.CloneOptions{NewID: id})
				if err != nil {
					t.Fatal(err)
				}
				upids = append(upids, upid)
			}
			var failed []string
			for _, upid := range upids {
				var te *pve.TaskError
				if err := s.c.WaitTask(ctx, "", upid); errors.As(err, &te) {
					failed = append(failed, te.ExitStatus)
				} else if err != nil {
					t.Fatal(err)
				}
			}
			if len(failed) != 1 || failed[0] != tc.want {
				t.Errorf("failed clones: %q, want one with %q", failed, tc.want)
			}
			if n := len(s.VMs()); n != 1+2+1 {
				t.Errorf("%d VMs: the failed clone left its config", n)
			}
		})
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
		{"explicit linked clone of a VM", 200, pve.CloneOptions{NewID: 204, Full: ptr(false)}, "Linked clone feature is not supported for 'local-lvm:vm-200-disk-0' (scsi0)"},
		{"storage on a linked clone", tplID, pve.CloneOptions{NewID: 202, Storage: "local-lvm"}, "parameter 'storage' not allowed for linked clones"},
		{"format on a linked clone", tplID, pve.CloneOptions{NewID: 202, Format: "qcow2"}, "parameter 'format' not allowed for linked clones"},
		{"other node, local storage", tplID, pve.CloneOptions{NewID: 202, Target: "pve2"}, "can't clone VM to node 'pve2' (VM uses local storage)"},
		// check_pool_exist raises a permission exception: a 403.
		{"unknown pool", tplID, pve.CloneOptions{NewID: 202, Pool: "jobs"}, "Permission check failed (pool 'jobs' does not exist)"},
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

// TestCapacity: a node's memory is reported, not enforced: PVE starts
// VMs beyond it (QEMU maps guest memory lazily), and refuses only a VM
// larger than the node; vCPUs (sockets x cores) may not exceed its cores.
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
	// Three 2 GiB VMs on 6 GiB, 1.5 of them the host's: all start.
	for _, id := range []int{101, 102, 103} {
		upid, _ := c.StartVM(ctx, "pve1", id)
		if err := c.WaitTask(ctx, "", upid); err != nil {
			t.Fatalf("start %d: %v", id, err)
		}
	}
	nodes, _ := c.Nodes(ctx)
	// mem counts what the guests use, not what they were given.
	if len(nodes) != 1 || nodes[0].MaxMem != 6<<30 || int64(nodes[0].Mem) != hostMemBase+3*guestUse(2<<30) || nodes[0].MaxCPU != 4 {
		t.Errorf("node: %+v", nodes)
	}
	// Already running: a failed task, not an HTTP error.
	upid, _ := c.StartVM(ctx, "pve1", 103)
	if te := taskErr(t, s, upid); te.ExitStatus != "VM 103 already running" {
		t.Errorf("second start: %v", te)
	}
	upid, _ = c.StopVM(ctx, "pve1", 101)
	c.WaitTask(ctx, "", upid)
	// More memory than the node has.
	if err := c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{MemoryMiB: 8192}); err != nil {
		t.Fatal(err)
	}
	upid, _ = c.StartVM(ctx, "pve1", 101)
	te := taskErr(t, s, upid)
	if te.ExitStatus != "start failed: QEMU exited with code 1" || !strings.Contains(strings.Join(te.Log, "\n"), "Cannot allocate memory") {
		t.Errorf("8 GiB on 6: %v %q", te, te.Log)
	}
	// More vCPUs than the node has.
	if err := c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{MemoryMiB: 1024, Cores: 3, Sockets: 2}); err != nil {
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

// TestParallelClones: clones that do not share an id all succeed side by
// side (the storage lock is held briefly by each).
func TestParallelClones(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": 200 * time.Millisecond}})
	ctx := ctxT(t)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 100 + i})
			if err == nil {
				err = s.c.WaitTask(ctx, "", upid)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := len(s.VMs()); n != 9 {
		t.Errorf("%d VMs, want the template and 8 clones", n)
	}
}

// TestUEFITemplate: a UEFI template's EFI vars disk and a TPM state are
// cloned like its disk (linked), and their formats have no backup key,
// as qemu-server's Drive.pm $efidisk_fmt and $tpmstate_fmt have none: a
// config update that sets it is refused, naming the drive.
func TestUEFITemplate(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(1)})
	if err := s.AddTemplate("pve1", 9001, "win11", TemplateSpec{OVMF: true, TPM: true}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	c := s.c
	upid, err := c.CloneVM(ctx, "pve1", 9001, pve.CloneOptions{NewID: 300})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	conf, err := c.VMConfig(ctx, "pve1", 300)
	if err != nil {
		t.Fatal(err)
	}
	if got := conf.Option("efidisk0"); !strings.HasPrefix(got, "local-lvm:base-9001-disk-1/vm-300-disk-") || !strings.HasSuffix(got, ",efitype=4m,pre-enrolled-keys=1,size=4M") {
		t.Errorf("efidisk0 %q", got)
	}
	if got := conf.Option("tpmstate0"); !strings.HasPrefix(got, "local-lvm:base-9001-disk-2/vm-300-disk-") || !strings.HasSuffix(got, ",size=4M,version=v2.0") {
		t.Errorf("tpmstate0 %q", got)
	}
	if conf.Option("bios") != "ovmf" {
		t.Errorf("bios %q", conf.Option("bios"))
	}
	for _, key := range []string{"efidisk0", "tpmstate0"} {
		err := c.SetVMConfig(ctx, "pve1", 300, pve.VMConfigUpdate{Options: map[string]string{key: conf.Option(key) + ",backup=0"}})
		var api *pve.APIError
		if !errors.As(err, &api) || api.StatusCode != 400 || api.Errors[key] != "invalid format - invalid key in comma-separated list property: backup\n" {
			t.Errorf("%s with backup=0: %v", key, err)
		}
	}
	// The disks take it.
	if err := c.SetVMConfig(ctx, "pve1", 300, pve.VMConfigUpdate{Options: map[string]string{"scsi0": conf.Option("scsi0") + ",backup=0"}}); err != nil {
		t.Errorf("scsi0 with backup=0: %v", err)
	}
	if err := c.WaitTask(ctx, "", mustStart(t, s, 300)); err != nil {
		t.Fatalf("start a UEFI VM: %v", err)
	}
}

func mustStart(t *testing.T, s *sim, vmid int) string {
	t.Helper()
	upid, err := s.c.StartVM(ctxT(t), "pve1", vmid)
	if err != nil {
		t.Fatal(err)
	}
	return upid
}
