package pvetools

import (
	"context"
	"maps"
	"slices"
	"strconv"
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

// TestJobVMsProtected: a VM a running job holds is not stopped, shut
// down, rebooted, deleted or rolled back without force, whether the job
// store already records its sandbox (vm-<vmid>, or vm-<vmid>-<job> since
// ownership is explicit) or the job is still provisioning it (its name or
// tag says whose it is); a finished job's VM and other VMs are free.
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
	call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": byTag,
		"config": map[string]any{"tags": "delegate;job-prov4"}})
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "create", "snapname": "s1"})

	owners := map[int]string{byStore: "job-running1", byNewID: "job-running2", byName: "job-prov3", byTag: "job-prov4"}
	for id, job := range owners {
		vm := map[string]any{"node": "pve1", "vmid": id}
		for _, tool := range []string{"proxmox_guest_stop", "proxmox_guest_shutdown", "proxmox_guest_reboot", "proxmox_guest_delete"} {
			msg := callErr(t, h, tool, vm)
			wantContains(t, tool+" of "+strconv.Itoa(id), msg, "VM "+strconv.Itoa(id)+" belongs to delegate job "+job, "force: true", "cancel_job")
		}
	}
	msg := callErr(t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "rollback", "snapname": "s1"})
	wantContains(t, "rollback", msg, "belongs to delegate job job-running1", "to roll back it")
	// Starting, snapshots and commands do not break a job: allowed.
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "create", "snapname": "s2"})
	for _, task := range h.sim.Tasks() {
		if task.Type != "qmclone" && task.Type != "qmconfig" && task.Type != "qmsnapshot" {
			t.Errorf("a refused call ran a task: %+v", task)
		}
	}
	// Free VMs, and force.
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": finished})
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": unrelated})
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": byStore, "action": "rollback", "snapname": "s1", "force": true})
	call[TaskOut](t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": byName, "force": true})
	call[TaskOut](t, h, "proxmox_guest_delete", map[string]any{"node": "pve1", "vmid": byName, "force": true})
	// An unknown VM is Proxmox's to refuse.
	msg = callErr(t, h, "proxmox_guest_stop", map[string]any{"node": "pve1", "vmid": 999})
	wantContains(t, "unknown VM", msg, "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist")
}
