package pvesim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// mustTask starts a task and waits for it to succeed.
func mustTask(t *testing.T, s *sim, upid string, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitTask(ctxT(t), "", upid); err != nil {
		t.Fatal(err)
	}
}

// TestContainers: containers share the VMs' ids, list, start, stop, shut
// down, reboot and are destroyed like pve-container's API does it,
// refusing at once what pve-container refuses at once.
func TestContainers(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	if err := s.AddContainer("pve1", 200, "web", ContainerSpec{Cores: 2, Running: true, Tags: "prod"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddContainer("pve1", 201, "db", ContainerSpec{}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddContainer("pve1", 9000, "clash", ContainerSpec{}); err == nil {
		t.Error("a container took a VM's id")
	}
	cts, err := s.c.Guests(ctx, "pve1", pve.LXC)
	if err != nil || len(cts) != 2 || cts[0].Name != "web" || cts[0].Status != "running" || cts[0].Tags != "prod" ||
		cts[1].Status != "stopped" || cts[0].Type != pve.LXC {
		t.Fatalf("containers %+v %v", cts, err)
	}
	vms, err := s.c.Guests(ctx, "pve1", pve.QEMU)
	if err != nil || len(vms) != 1 || vms[0].VMID != 9000 || !bool(vms[0].Template) {
		t.Fatalf("VMs %+v %v", vms, err)
	}
	// The two kinds do not see each other's ids.
	if _, err := s.c.VMStatus(ctx, "pve1", 200); reasonOf(err) != "Configuration file 'nodes/pve1/qemu-server/200.conf' does not exist" {
		t.Errorf("qemu status of a container: %v", err)
	}
	if _, err := s.c.GuestStatus(ctx, "pve1", pve.LXC, 9000); reasonOf(err) != "Configuration file 'nodes/pve1/lxc/9000.conf' does not exist" {
		t.Errorf("lxc status of a VM: %v", err)
	}
	if id, _ := s.c.NextID(ctx); id != 100 {
		t.Errorf("nextid %d", id)
	}
	if free, _ := s.c.VMIDFree(ctx, 201); free {
		t.Error("a container's id is free")
	}
	// Cloning onto a container's id fails in the task, as pmxcfs refuses it.
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 201})
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "close (rename) atomic file '/etc/pve/nodes/pve1/qemu-server/201.conf' failed: File exists" {
		t.Errorf("clone onto a container: %q", te.ExitStatus)
	}

	st, err := s.c.GuestStatus(ctx, "pve1", pve.LXC, 200)
	if err != nil || st.Status != "running" || st.Type != "lxc" || st.CPUs != 2 || st.MaxMem != 512<<20 || st.PID == 0 {
		t.Fatalf("status %+v %v", st, err)
	}
	conf, err := s.c.GuestConfig(ctx, "pve1", pve.LXC, 200)
	if err != nil || conf["hostname"] != "web" || conf["digest"] == "" || conf["unprivileged"] != "1" ||
		!strings.HasPrefix(conf["rootfs"], "local-lvm:vm-200-disk-0,") || conf["ostype"] != "debian" {
		t.Fatalf("config %v %v", conf, err)
	}

	if _, err := s.c.StartGuest(ctx, "pve1", pve.LXC, 200); reasonOf(err) != "CT 200 already running" {
		t.Errorf("start of a running CT: %v", err)
	}
	if _, err := s.c.DeleteGuest(ctx, "pve1", pve.LXC, 200, pve.DeleteOptions{}); reasonOf(err) != "unable to destroy CT 200 - container is running" {
		t.Errorf("delete of a running CT: %v", err)
	}
	upid, err = s.c.RebootGuest(ctx, "pve1", pve.LXC, 200)
	mustTask(t, s, upid, err)
	if u, _ := pve.ParseUPID(upid); u.Type != "vzreboot" || u.ID != "200" {
		t.Errorf("reboot task %s", upid)
	}
	upid, err = s.c.ShutdownGuest(ctx, "pve1", pve.LXC, 200, pve.ShutdownOptions{})
	mustTask(t, s, upid, err)
	if st, _ := s.c.GuestStatus(ctx, "pve1", pve.LXC, 200); st.Status != "stopped" {
		t.Errorf("after shutdown: %s", st.Status)
	}
	for _, call := range []struct {
		name string
		do   func() (string, error)
		want string
	}{
		{"stop", func() (string, error) { return s.c.StopGuest(ctx, "pve1", pve.LXC, 200) }, "CT 200 not running"},
		{"shutdown", func() (string, error) {
			return s.c.ShutdownGuest(ctx, "pve1", pve.LXC, 200, pve.ShutdownOptions{})
		}, "CT 200 not running"},
		// pve-container's reboot says VM.
		{"reboot", func() (string, error) { return s.c.RebootGuest(ctx, "pve1", pve.LXC, 200) }, "VM 200 not running"},
	} {
		if _, err := call.do(); reasonOf(err) != call.want {
			t.Errorf("%s of a stopped CT: %v, want %q", call.name, err, call.want)
		}
	}
	upid, err = s.c.StartGuest(ctx, "pve1", pve.LXC, 201)
	mustTask(t, s, upid, err)
	upid, err = s.c.StopGuest(ctx, "pve1", pve.LXC, 201)
	mustTask(t, s, upid, err)
	upid, err = s.c.DeleteGuest(ctx, "pve1", pve.LXC, 201, pve.DeleteOptions{Purge: true})
	mustTask(t, s, upid, err)
	if _, ok := s.VM(201); ok {
		t.Error("deleted container still there")
	}
	res, _ := s.c.ClusterResources(ctx, pve.ResourceVM)
	var ids []string
	for _, r := range res {
		ids = append(ids, r.ID+" "+r.Type)
	}
	if !slices.Contains(ids, "lxc/200 lxc") || slices.Contains(ids, "lxc/201 lxc") {
		t.Errorf("resources %v", ids)
	}

	// A template does not start, in the task.
	if err := s.AddContainer("pve1", 210, "ct-tpl", ContainerSpec{Template: true}); err != nil {
		t.Fatal(err)
	}
	upid, err = s.c.StartGuest(ctx, "pve1", pve.LXC, 210)
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "you can't start a CT if it's a template" {
		t.Errorf("start of a CT template: %q", te.ExitStatus)
	}
}

// TestVMRebootAndList: a reboot is a new boot (what ran is gone, the
// agent answers again); a stopped VM is refused at once. The node's VM
// list is vmstatus's.
func TestVMRebootAndList(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 120, &pve.CloneOptions{Name: "rebooted"})
	before, _ := s.VM(id)
	pid, err := s.c.AgentExec(ctx, "pve1", id, []string{"sleep", "600"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	upid, err := s.c.RebootGuest(ctx, "pve1", pve.QEMU, id)
	mustTask(t, s, upid, err)
	after, _ := s.VM(id)
	if after.Status != "running" || after.Sandbox == "" || after.Sandbox == before.Sandbox {
		t.Errorf("after reboot: %+v (before %s)", after, before.Sandbox)
	}
	waitAgent(t, s, id)
	if _, err := s.c.AgentExecStatus(ctx, "pve1", id, pid); err == nil {
		t.Error("a command from before the reboot is still known")
	}
	list, err := s.c.Guests(ctx, "pve1", pve.QEMU)
	if err != nil || len(list) != 2 || list[0].VMID != 120 || list[0].Name != "rebooted" || list[0].Status != "running" ||
		list[0].PID == 0 || list[1].VMID != tplID || !bool(list[1].Template) {
		t.Errorf("list %+v %v", list, err)
	}
	upid, err = s.c.StopGuest(ctx, "pve1", pve.QEMU, id)
	mustTask(t, s, upid, err)
	if _, err := s.c.RebootGuest(ctx, "pve1", pve.QEMU, id); reasonOf(err) != "VM 120 not running" {
		t.Errorf("reboot of a stopped VM: %v", err)
	}
}

// TestSnapshots: create, list, rollback and delete as AbstractConfig
// does them: a rollback brings the snapshot's config back (keeping the
// description), stops a running VM, and moves the parent; deleting
// relinks the tree.
func TestSnapshots(t *testing.T) {
	s := newSim(t, Options{Storages: append(DefaultStorages(),
		StorageSpec{ID: "thick", Type: "lvm"}, StorageSpec{ID: "tank", Type: "zfspool"})})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 130, nil)
	// Options a running VM takes at once (cores would wait in [PENDING]).
	desc := "before"
	if err := s.c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Description: &desc, Options: map[string]string{"cpulimit": "1"}}); err != nil {
		t.Fatal(err)
	}
	upid, err := s.c.CreateSnapshot(ctx, "pve1", id, "s1", "first", true)
	mustTask(t, s, upid, err)
	if u, _ := pve.ParseUPID(upid); u.Type != "qmsnapshot" {
		t.Errorf("snapshot task %s", upid)
	}
	upid, err = s.c.CreateSnapshot(ctx, "pve1", id, "s1", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "snapshot name 's1' already used" {
		t.Errorf("second s1: %q", te.ExitStatus)
	}
	if _, err := s.c.CreateSnapshot(ctx, "pve1", id, "current", "", false); reasonOf(err) != "unable to use snapshot name 'current' (reserved name)" {
		t.Errorf("snapshot named current: %v", err)
	}
	desc = "after"
	if err := s.c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Description: &desc, Options: map[string]string{"onboot": "1", "cpulimit": "4"}}); err != nil {
		t.Fatal(err)
	}
	upid, err = s.c.CreateSnapshot(ctx, "pve1", id, "s2", "", false)
	mustTask(t, s, upid, err)
	snaps, err := s.c.Snapshots(ctx, "pve1", id)
	if err != nil || len(snaps) != 3 || snaps[0].Name != "s1" || snaps[0].Description != "first" || !bool(snaps[0].VMState) ||
		snaps[1].Name != "s2" || snaps[1].Parent != "s1" || snaps[2].Name != "current" || snaps[2].Parent != "s2" || !bool(snaps[2].Running) {
		t.Fatalf("snapshots %+v %v", snaps, err)
	}

	// Back to s1 (with RAM: it boots again), then to s2 (without).
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s1", false)
	mustTask(t, s, upid, err)
	cfg, _ := s.c.VMConfig(ctx, "pve1", id)
	if cfg.Option("cpulimit") != "1" || cfg.Description != "after" || cfg.Option("onboot") != "" || cfg.Option("parent") != "s1" || cfg.Lock != "" {
		t.Errorf("after rollback to s1: cpulimit %s, description %q, onboot %q, parent %q, lock %q",
			cfg.Option("cpulimit"), cfg.Description, cfg.Option("onboot"), cfg.Option("parent"), cfg.Lock)
	}
	if v, _ := s.VM(id); v.Status != "running" {
		t.Errorf("a snapshot with RAM left the VM %s", v.Status)
	}
	waitAgent(t, s, id)
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s2", false)
	mustTask(t, s, upid, err)
	cfg, _ = s.c.VMConfig(ctx, "pve1", id)
	if v, _ := s.VM(id); v.Status != "stopped" || cfg.Option("cpulimit") != "4" || cfg.Option("onboot") != "1" {
		t.Errorf("after rollback to s2: %s, cpulimit %s", v.Status, cfg.Option("cpulimit"))
	}
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "nope", false)
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "snapshot 'nope' does not exist" {
		t.Errorf("rollback to nothing: %q", te.ExitStatus)
	}
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s1", true)
	mustTask(t, s, upid, err)

	// Deleting s1 makes s2 a root.
	upid, err = s.c.DeleteSnapshot(ctx, "pve1", id, "s1")
	mustTask(t, s, upid, err)
	snaps, _ = s.c.Snapshots(ctx, "pve1", id)
	if len(snaps) != 2 || snaps[0].Name != "s2" || snaps[0].Parent != "" || snaps[1].Parent != "" {
		t.Errorf("after deleting s1: %+v", snaps)
	}
	upid, err = s.c.DeleteSnapshot(ctx, "pve1", id, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "snapshot 's1' does not exist" {
		t.Errorf("delete again: %q", te.ExitStatus)
	}
	// An unknown VM fails in the task too: qemu-server forks first.
	upid, err = s.c.DeleteSnapshot(ctx, "pve1", 999, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if te := taskErr(t, s, upid); te.ExitStatus != "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist" {
		t.Errorf("unknown VM: %q", te.ExitStatus)
	}

	// Templates and thick LVM take no snapshots; ZFS rolls back only to
	// the most recent one.
	upid, _ = s.c.CreateSnapshot(ctx, "pve1", tplID, "xx", "", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "you can't take a snapshot if it's a template" {
		t.Errorf("template: %q", te.ExitStatus)
	}
	for _, c := range []struct {
		storage string
		id      int
	}{{"thick", 131}, {"tank", 132}} {
		upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: c.id, Full: ptr(true), Storage: c.storage})
		mustTask(t, s, upid, err)
	}
	upid, _ = s.c.CreateSnapshot(ctx, "pve1", 131, "xx", "", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "snapshot feature is not available" {
		t.Errorf("thick LVM: %q", te.ExitStatus)
	}
	for _, name := range []string{"sa", "sb"} {
		upid, err := s.c.CreateSnapshot(ctx, "pve1", 132, name, "", false)
		mustTask(t, s, upid, err)
	}
	upid, _ = s.c.RollbackSnapshot(ctx, "pve1", 132, "sa", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "can't rollback, 'sa' is not most recent snapshot on 'tank:vm-132-disk-0'" {
		t.Errorf("ZFS rollback past b: %q", te.ExitStatus)
	}
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", 132, "sb", false)
	mustTask(t, s, upid, err)
}

// TestNodeTasks: finished tasks newest first with their end and status,
// running ones with source=active, filters and total; a token without
// Sys.Audit on the node sees only its own.
func TestNodeTasks(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmstart": 300 * time.Millisecond}})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 140})
	mustTask(t, s, upid, err)
	upid, err = s.c.StopGuest(ctx, "pve1", pve.QEMU, 140)
	mustTask(t, s, upid, err)
	s.SetFaults(Faults{TaskFailures: map[string]string{"qmshutdown": "shutdown failed on purpose"}})
	upid, _ = s.c.ShutdownGuest(ctx, "pve1", pve.QEMU, 140, pve.ShutdownOptions{})
	taskErr(t, s, upid)
	s.SetFaults(Faults{})
	start, err := s.c.StartGuest(ctx, "pve1", pve.QEMU, 140)
	if err != nil {
		t.Fatal(err)
	}

	tasks, total, err := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{})
	if err != nil || total != 3 || len(tasks) != 3 || tasks[0].Type != "qmshutdown" || tasks[0].Status != "shutdown failed on purpose" ||
		tasks[1].Type != "qmstop" || tasks[1].Status != "OK" || tasks[2].Type != "qmclone" || tasks[2].EndTime == 0 ||
		tasks[0].User != "root@pam" || tasks[0].TokenID != "delegate" {
		t.Fatalf("archive: %d %+v %v", total, tasks, err)
	}
	active, _, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{Source: "active"})
	if len(active) != 1 || active[0].UPID != start || active[0].Status != "RUNNING" {
		t.Errorf("active: %+v", active)
	}
	if all, total, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{Source: "all", Limit: 2}); len(all) != 2 || total != 4 || all[0].UPID != start {
		t.Errorf("all, 2 of them: %d %+v", total, all)
	}
	if errs, _, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{Errors: true}); len(errs) != 1 || errs[0].Type != "qmshutdown" {
		t.Errorf("errors: %+v", errs)
	}
	if typed, _, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{TypeFilter: "qmclone", VMID: tplID}); len(typed) != 1 {
		t.Errorf("qmclone of %d: %+v", tplID, typed)
	}
	if none, _, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{VMID: 999}); len(none) != 0 {
		t.Errorf("tasks of 999: %+v", none)
	}
	if skipped, total, _ := s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{Start: 2}); len(skipped) != 1 || total != 3 {
		t.Errorf("from 2: %d %+v", total, skipped)
	}
	mustTask(t, s, start, nil)

	// An auditor without Sys.Audit on the node sees its own tasks only.
	audit := makeToken(t, s, "ops@pve", "tk", "PVEVMAdmin", "/vms")
	if data := audit.ok(t, "GET", "/nodes/pve1/tasks").([]any); len(data) != 0 {
		t.Errorf("someone else's tasks: %v", data)
	}
	stop := audit.ok(t, "POST", "/nodes/pve1/qemu/140/status/stop")
	audit.waitOK(t, stop)
	if data := audit.ok(t, "GET", "/nodes/pve1/tasks").([]any); len(data) != 1 || data[0].(map[string]any)["upid"] != stop {
		t.Errorf("own tasks: %v", data)
	}
	root(s.Server).expect(t, 400, "Parameter verification failed.", "GET", "/nodes/pve1/tasks", "statusfilter", "ok,fine")
}

// TestStorageContent: the guests' disks and the files on a storage,
// each as check_volume_access lets the caller see it.
func TestStorageContent(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2)})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 150})
	mustTask(t, s, upid, err)
	if err := s.AddContainer("pve1", 151, "ct", ContainerSpec{}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"local:iso/debian-12.iso", "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
		"local:backup/vzdump-qemu-150-2026_01_01-00_00_00.vma.zst"} {
		if err := s.AddVolume("pve1", v, 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddVolume("pve1", "local-lvm:iso/x.iso", 1); err == nil {
		t.Error("an ISO on local-lvm")
	}
	vols, err := s.c.StorageContent(ctx, "pve1", "local-lvm", "", 0)
	var got []string
	for _, v := range vols {
		got = append(got, fmt.Sprintf("%s %s %s %d", v.VolID, v.Content, v.Format, v.VMID))
	}
	want := []string{"local-lvm:base-9000-disk-0 images raw 9000", "local-lvm:base-9000-disk-0/vm-150-disk-0 images raw 150",
		"local-lvm:vm-151-disk-0 rootdir raw 151"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("local-lvm:\n got %q %v\nwant %q", got, err, want)
	}
	if vols, _ := s.c.StorageContent(ctx, "pve2", "local-lvm", "", 0); len(vols) != 0 {
		t.Errorf("pve2's local-lvm: %+v", vols)
	}
	vols, _ = s.c.StorageContent(ctx, "pve1", "local", "vztmpl", 0)
	if len(vols) != 1 || vols[0].Format != "tzst" || vols[0].Size != 1<<30 {
		t.Errorf("templates: %+v", vols)
	}
	if vols, _ := s.c.StorageContent(ctx, "pve1", "local", "", 150); len(vols) != 1 || vols[0].Content != "backup" || vols[0].Format != "vma.zst" {
		t.Errorf("backups of 150: %+v", vols)
	}
	if _, err := s.c.StorageContent(ctx, "pve1", "nope", "", 0); reasonOf(err) != "storage 'nope' does not exist" {
		t.Errorf("unknown storage: %v", err)
	}
	// Datastore.Audit alone shows the templates and ISOs, not the disks
	// (they need VM.Config.Disk on their VM) nor the backups.
	audit := makeToken(t, s, "store@pve", "tk", "PVEAuditor", "/storage")
	if data := audit.ok(t, "GET", "/nodes/pve1/storage/local-lvm/content").([]any); len(data) != 0 {
		t.Errorf("disks without VM.Config.Disk: %v", data)
	}
	if data := audit.ok(t, "GET", "/nodes/pve1/storage/local/content").([]any); len(data) != 2 {
		t.Errorf("local for an auditor: %v", data)
	}
	root(s.Server).expect(t, 400, "Parameter verification failed.", "GET", "/nodes/pve1/storage/local/content", "content", "pictures")
}

// TestClusterStatus: a lone node, then a cluster whose quorum needs more
// than half its nodes; Sys.Audit on / is required.
func TestClusterStatus(t *testing.T) {
	one := newSim(t, Options{})
	st, err := one.c.ClusterStatus(ctxT(t))
	if err != nil || len(st) != 1 || st[0].Type != "node" || st[0].Name != "pve1" || !bool(st[0].Local) || st[0].NodeID != 0 {
		t.Fatalf("lone node: %+v %v", st, err)
	}
	s := newSim(t, Options{Nodes: DefaultNodes(3), ClusterName: "lab"})
	ctx := ctxT(t)
	s.SetNodeOnline("pve3", false)
	st, err = s.c.ClusterStatus(ctx)
	if err != nil || len(st) != 4 || st[0].Type != "cluster" || st[0].Name != "lab" || st[0].Nodes != 3 || !bool(st[0].Quorate) ||
		!bool(st[1].Local) || bool(st[2].Local) || !bool(st[2].Online) || bool(st[3].Online) || st[3].NodeID != 3 {
		t.Fatalf("cluster: %+v %v", st, err)
	}
	s.SetNodeOnline("pve2", false)
	if st, _ := s.c.ClusterStatus(ctx); bool(st[0].Quorate) {
		t.Error("quorate with one node of three")
	}
	vmadmin := makeToken(t, s, "vm@pve", "tk", "PVEVMAdmin", "/vms")
	vmadmin.expect(t, 403, "Permission check failed (/, Sys.Audit)", "GET", "/cluster/status")
}

// TestAdminResponsesMatchSchema: the answers of the methods the admin
// tools use fit their "returns" schema, and every request the client
// sent fits the method's parameters.
func TestAdminResponsesMatchSchema(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2)})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 160, nil)
	if err := s.AddContainer("pve1", 161, "ct", ContainerSpec{Running: true}); err != nil {
		t.Fatal(err)
	}
	s.AddVolume("pve1", "local:iso/x.iso", 1000)
	upid, err := s.c.CreateSnapshot(ctx, "pve1", id, "s1", "d", false)
	mustTask(t, s, upid, err)
	gets := []string{
		"/nodes/pve1/qemu", "/nodes/pve1/qemu?full=1", "/nodes/pve1/lxc", "/nodes/pve1/lxc/161/status/current",
		"/nodes/pve1/lxc/161/config", fmt.Sprintf("/nodes/pve1/qemu/%d/snapshot", id), "/nodes/pve1/tasks",
		"/nodes/pve1/tasks?source=all", "/nodes/pve1/storage/local-lvm/content", "/nodes/pve1/storage/local/content",
		"/cluster/status", "/nodes/pve1/storage",
	}
	for _, p := range gets {
		r := s.raw(t, "GET", "/api2/json"+p, "", "", "")
		if r.Status != 200 {
			t.Fatalf("GET %s: %d %s", p, r.Status, r.Reason)
		}
		m, _, ok := s.Schema().Lookup("GET", strings.SplitN(p, "?", 2)[0])
		if !ok {
			t.Fatalf("GET %s: no method", p)
		}
		if err := m.CheckReturns(r.Body["data"]); err != nil {
			t.Errorf("GET %s: %v\n%v", p, err, r.Body["data"])
		}
		if p == "/nodes/pve1/tasks" {
			if _, ok := r.Body["total"]; !ok {
				t.Error("tasks without total")
			}
		}
	}
	for _, call := range []func() (string, error){
		func() (string, error) { return s.c.RebootGuest(ctx, "pve1", pve.QEMU, id) },
		func() (string, error) { return s.c.RollbackSnapshot(ctx, "pve1", id, "s1", true) },
		func() (string, error) { return s.c.DeleteSnapshot(ctx, "pve1", id, "s1") },
		func() (string, error) { return s.c.RebootGuest(ctx, "pve1", pve.LXC, 161) },
		func() (string, error) {
			return s.c.ShutdownGuest(ctx, "pve1", pve.LXC, 161, pve.ShutdownOptions{ForceStop: true})
		},
		func() (string, error) { return s.c.StartGuest(ctx, "pve1", pve.LXC, 161) },
		func() (string, error) { return s.c.StopGuest(ctx, "pve1", pve.LXC, 161) },
		func() (string, error) {
			return s.c.DeleteGuest(ctx, "pve1", pve.LXC, 161, pve.DeleteOptions{Purge: true})
		},
	} {
		upid, err := call()
		mustTask(t, s, upid, err)
	}
	s.c.NodeTasks(ctx, "pve1", pve.TaskListOptions{Source: "all", Start: 1, Limit: 5, TypeFilter: "qmstart", UserFilter: "root", VMID: id, Errors: true})
	s.c.StorageContent(ctx, "pve1", "local", "iso", 0)
	s.c.ClusterStatus(ctx)
	for _, r := range s.Requests() {
		if _, _, err := s.Schema().Validate(r.Method, r.Path, r.Params); err != nil {
			t.Errorf("%s %s %v: %v", r.Method, r.Path, r.Params, err)
		}
		if r.Status != 200 && !(r.Status == 500 && r.Reason == "QEMU guest agent is not running") {
			t.Errorf("%s %s: %d %s", r.Method, r.Path, r.Status, r.Reason)
		}
	}
}

// TestPendingConfig: a config change to a running VM waits in [PENDING]
// for what it cannot hot-plug (cores, memory), applies at once what it can
// (tags, name, cpulimit); GET config shows the pending values unless
// current=1; GET pending lists them; the next start applies them.
func TestPendingConfig(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 140, nil)
	before, _ := s.c.VMConfig(ctx, "pve1", id)
	if err := s.c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Cores: 4, MemoryMiB: 1024, Tags: []string{"b", "a"},
		Options: map[string]string{"cpulimit": "1.5"}, Delete: []string{"ostype"}}); err != nil {
		t.Fatal(err)
	}
	merged, _ := s.c.VMConfig(ctx, "pve1", id)
	current, _ := s.c.CurrentVMConfig(ctx, "pve1", id)
	if merged.Cores != 4 || merged.MemoryMiB() != 1024 || merged.Option("ostype") != "" || merged.Tags != "a;b" {
		t.Errorf("GET config: cores %d memory %d ostype %q tags %q", merged.Cores, merged.MemoryMiB(), merged.Option("ostype"), merged.Tags)
	}
	if current.Cores != before.Cores || current.MemoryMiB() != before.MemoryMiB() || current.Option("ostype") != "l26" ||
		current.Tags != "a;b" || current.Option("cpulimit") != "1.5" {
		t.Errorf("current=1: cores %d memory %d ostype %q tags %q cpulimit %q", current.Cores, current.MemoryMiB(), current.Option("ostype"),
			current.Tags, current.Option("cpulimit"))
	}
	if merged.Digest == before.Digest || merged.Digest != current.Digest {
		t.Errorf("digests %s %s %s", before.Digest, merged.Digest, current.Digest)
	}
	opts, err := s.c.Pending(ctx, "pve1", id)
	if err != nil {
		t.Fatal(err)
	}
	changed := map[string]string{}
	for _, o := range opts {
		if o.Changed() {
			changed[o.Key] = fmt.Sprintf("%s>%s/%d", o.Value, o.Pending, o.Delete)
		}
	}
	if want := map[string]string{"cores": "2>4/0", "memory": "2048>1024/0", "ostype": "l26>/1"}; fmt.Sprint(changed) != fmt.Sprint(want) {
		t.Errorf("pending %v, want %v", changed, want)
	}
	for _, f := range []func(context.Context, string, int) (string, error){s.c.StopVM, s.c.StartVM} {
		upid, err := f(ctx, "pve1", id)
		mustTask(t, s, upid, err)
	}
	after, _ := s.c.CurrentVMConfig(ctx, "pve1", id)
	if v, _ := s.VM(id); after.Cores != 4 || after.MemoryMiB() != 1024 || after.Option("ostype") != "" || len(v.Pending) != 0 {
		t.Errorf("after a restart: cores %d memory %d ostype %q pending %v", after.Cores, after.MemoryMiB(), after.Option("ostype"), v.Pending)
	}
}
