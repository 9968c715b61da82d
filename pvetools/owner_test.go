package pvetools

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mock"
)

// fakeJobs is a job service holding a fixed set of jobs (only List and
// Get are used).
func fakeJobs(jobs ...*delegate.Job) *mock.JobService {
	return &mock.JobService{
		ListFn: func(_ context.Context, o delegate.ListOptions) (*delegate.JobPage, error) {
			page := &delegate.JobPage{}
			for _, j := range jobs {
				if o.Status == "" || j.Status == o.Status {
					page.Jobs = append(page.Jobs, delegate.JobSummary{ID: j.ID, Status: j.Status})
				}
			}
			return page, nil
		},
		GetFn: func(_ context.Context, id string) (*delegate.Job, error) {
			for _, j := range jobs {
				if j.ID == id {
					return j, nil
				}
			}
			return nil, delegate.ErrNotFound
		},
	}
}

// TestJobVMsProtected: a VM a running job holds is not changed, nor is
// anything run in it, without force (start, stop, shutdown, reboot,
// delete, clone, config and disk changes, snapshots of any kind, agent
// commands and file writes), whether the job store already records its
// sandbox (vm-<vmid>, or vm-<vmid>-<job> since ownership is explicit) or
// the job is still provisioning it (its name or tag says whose it is); a
// finished job's VM and other VMs are free, and reading is always.
func TestJobVMsProtected(t *testing.T) {
	const (
		byStore   = 100 // the job store records its sandbox
		byNewID   = 101 // the same, with the job in the sandbox id
		byName    = 102 // provisioning: only its name says whose it is
		byTag     = 103 // provisioning: only its tag
		finished  = 104 // its job has ended
		unrelated = 105
	)
	jobs := fakeJobs(
		&delegate.Job{ID: "job-running1", Status: delegate.StatusRunning, SandboxID: "vm-100"},
		&delegate.Job{ID: "job-running2", Status: delegate.StatusRunning, SandboxID: "vm-101-job-running2"},
		&delegate.Job{ID: "job-prov3", Status: delegate.StatusProvisioning},
		&delegate.Job{ID: "job-prov4", Status: delegate.StatusProvisioning},
		&delegate.Job{ID: "job-done5", Status: delegate.StatusSuccess, SandboxID: "vm-104"},
	)
	h := newHarness(t, options{elevated: true, jobs: jobs})
	names := map[int]string{byStore: "delegate-job-running1", byNewID: "delegate-ab12cd34-job-running2", byName: "delegate-ab12cd34-job-prov3",
		byTag: "tagged", finished: "delegate-job-done5", unrelated: "mine"}
	for _, id := range slices.Sorted(maps.Keys(names)) {
		call[TaskOut](t, h, "proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID, "newid": id, "name": names[id]})
	}
	// Tagged as the job's (which the tag then protects: force).
	call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": byTag,
		"config": map[string]any{"tags": "delegate;job-prov4"}})
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "create", "snapname": "s1", "force": true})
	before := len(h.sim.Tasks())

	owners := map[int]string{byStore: "job-running1", byNewID: "job-running2", byName: "job-prov3", byTag: "job-prov4"}
	calls := func(id int) map[string]map[string]any {
		vm := map[string]any{"node": "pve1", "vmid": id}
		with := func(extra map[string]any) map[string]any {
			out := maps.Clone(vm)
			maps.Copy(out, extra)
			return out
		}
		return map[string]map[string]any{
			"proxmox_guest_start":         vm,
			"proxmox_guest_stop":          vm,
			"proxmox_guest_shutdown":      vm,
			"proxmox_guest_reboot":        vm,
			"proxmox_guest_delete":        vm,
			"proxmox_guest_clone":         with(map[string]any{"newid": 150}),
			"proxmox_guest_config_update": with(map[string]any{"config": map[string]any{"cores": 2}}),
			"proxmox_guest_resize":        with(map[string]any{"disk": "scsi0", "size": "+1G"}),
			"proxmox_guest_snapshot":      with(map[string]any{"action": "create", "snapname": "s9"}),
			"proxmox_agent_exec":          with(map[string]any{"command": []string{"true"}}),
			"proxmox_execute_vm_command":  with(map[string]any{"command": "true"}),
			"proxmox_agent_file":          with(map[string]any{"action": "write", "file": "/tmp/x", "content": "x"}),
		}
	}
	for id, job := range owners {
		for tool, args := range calls(id) {
			msg := callErr(t, h, tool, args)
			wantContains(t, tool+" of "+strconv.Itoa(id), msg, "VM "+strconv.Itoa(id)+" belongs to delegate job "+job, "force: true", "cancel_job", "could break the job")
		}
	}
	for _, action := range []string{"rollback", "delete"} {
		msg := callErr(t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": action, "snapname": "s1"})
		wantContains(t, action, msg, "belongs to delegate job job-running1")
	}
	if tasks := h.sim.Tasks(); len(tasks) != before {
		t.Errorf("refused calls ran tasks: %+v", tasks[before:])
	}
	// Reading changes nothing: allowed.
	call[ConfigOut](t, h, "proxmox_guest_config", map[string]any{"node": "pve1", "vmid": byStore})
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "list"})
	// Free VMs, and force.
	call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": finished, "config": map[string]any{"cores": 2}})
	call[TaskOut](t, h, "proxmox_guest_resize", map[string]any{"node": "pve1", "vmid": unrelated, "disk": "scsi0", "size": "+1G"})
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": finished})
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": unrelated})
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "rollback", "snapname": "s1", "force": true})
	call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": byNewID, "config": map[string]any{"cores": 2}, "force": true})
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": byName, "force": true})
	call[TaskOut](t, h, "proxmox_guest_delete", map[string]any{"node": "pve1", "vmid": byName, "force": true})
	// An unknown VM is Proxmox's to refuse.
	msg := callErr(t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": 999})
	wantContains(t, "unknown VM", msg, "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist")
}

// TestSnapshotNamesNoLabels: the requests the snapshot tool makes are
// classed (the metrics' labels) without the snapshots' names, which any
// caller chooses: a label of each would grow without bound.
func TestSnapshotNamesNoLabels(t *testing.T) {
	var mu sync.Mutex
	classes := map[string]bool{}
	h := newHarness(t, options{elevated: true, observe: func(class string, code int) {
		mu.Lock()
		classes[class] = true
		mu.Unlock()
	}})
	call[TaskOut](t, h, "proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID, "newid": 120})
	for i := range 3 {
		name := "snap" + strconv.Itoa(i)
		vm := map[string]any{"node": "pve1", "vmid": 120, "snapname": name}
		for _, action := range []string{"create", "rollback", "delete"} {
			args := maps.Clone(vm)
			args["action"] = action
			call[SnapshotOut](t, h, "proxmox_guest_snapshot", args)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var snaps []string
	for c := range classes {
		if strings.Contains(c, "snap0") || strings.Contains(c, "snap1") || strings.Contains(c, "snap2") {
			t.Errorf("a request class holds a snapshot's name: %s", c)
		}
		if strings.Contains(c, "/snapshot") {
			snaps = append(snaps, c)
		}
	}
	slices.Sort(snaps)
	want := []string{"DELETE /nodes/{node}/qemu/{vmid}/snapshot/{snapname}", "POST /nodes/{node}/qemu/{vmid}/snapshot",
		"POST /nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback"}
	if !slices.Equal(snaps, want) {
		t.Errorf("snapshot classes %q, want %q", snaps, want)
	}
}
