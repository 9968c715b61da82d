package proxmox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
)

// vmidOf is the vmid of a sandbox's VM (its instance "vm-<vmid>-...").
func vmidOf(t *testing.T, sb *delegate.Sandbox) int {
	t.Helper()
	v, _, _ := strings.Cut(strings.TrimPrefix(sb.Instance, "vm-"), "-")
	return atoiT(t, v)
}

// TestProxmoxCheckpointFork: on the simulator, through the engine: a
// checkpoint is a snapshot without RAM (and an archive on the server);
// a command running at a checkpoint goes on, and ends cancelled at the
// rollback; a
// rollback after rm -rf brings every file back with its mode, through
// the rollback API; a fork of 3 takes 3 warm VMs of the pool, each with
// the files and writes of its own; memory is refused, naming why; a
// rollback to another sandbox's checkpoint is refused; deleting a
// checkpoint deletes its snapshot and archive, and releasing the sandbox
// its VM's archives.
func TestProxmoxCheckpointFork(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	dir := t.TempDir()
	s := newServer(t, c, proxmox.Config{Instance: "ckpt1", CheckpointDir: dir}, engine.Config{MaxForks: 3})
	ctx := context.Background()
	src, err := s.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	keepPool(t, s, poolCfg(3))
	waitReady(t, s.backend, 3)
	submit := func(id, task string) *delegate.Job {
		t.Helper()
		j, err := s.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: task, Sandbox: id}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	run := func(id, task string) string {
		t.Helper()
		j := s.wait(t, submit(id, task).ID)
		if j.Status != delegate.StatusSuccess {
			t.Fatalf("%q in %s: %s %s", task, id, j.Status, j.Error)
		}
		return s.output(t, j.ID)
	}
	running := func(id string) *delegate.Job {
		t.Helper()
		j := submit(id, "sleep 300")
		testkit.Eventually(t, 60*time.Second, "the command running", func() bool {
			got, err := s.eng.Get(ctx, j.ID)
			return err == nil && got.Status == delegate.StatusRunning
		})
		return j
	}
	const tree = "mkdir -p sub/deep && printf base > a.txt && head -c 100000 /dev/urandom > sub/deep/r.bin && chmod 0750 sub/deep/r.bin && chmod 0710 sub && ln -s a.txt link"
	const list = "find . -path ./.qga -prune -o -printf '%p %m %y\\n' | sort && sha256sum sub/deep/r.bin"
	run(src.ID, tree)
	want := run(src.ID, list)

	job := running(src.ID)
	cp, err := s.eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	// The VM runs on through a snapshot without RAM: so does the command.
	if j, err := s.eng.Get(ctx, job.ID); err != nil || j.Status != delegate.StatusRunning {
		t.Errorf("a command running at the checkpoint: %+v %v", j, err)
	}
	vmid := vmidOf(t, src)
	snaps, err := c.Snapshots(ctx, "pve1", vmid)
	if err != nil || len(snaps) != 2 || !strings.HasPrefix(snaps[0].Name, "delegate-") || bool(snaps[0].VMState) {
		t.Fatalf("the VM's snapshots after a checkpoint: %+v %v", snaps, err)
	}
	if cp.Bytes <= 0 {
		t.Errorf("checkpoint %+v: no bytes", cp)
	}

	// rm -rf, a command running, a rollback: every file is back.
	run(src.ID, "rm -rf ./* && echo gone > after.txt")
	if _, err := s.eng.RollbackSandbox(ctx, src.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	if j := s.wait(t, job.ID); j.Status != delegate.StatusCancelled || !strings.Contains(j.Error, "rolled back") {
		t.Errorf("a command running at the rollback: %s %q", j.Status, j.Error)
	}
	if got := run(src.ID, list); got != want {
		t.Errorf("after the rollback:\n%s\nwant\n%s", got, want)
	}
	if got := run(src.ID, "test -e after.txt && echo there || echo absent"); got != "absent\n" {
		t.Errorf("a file written after the checkpoint: %q", got)
	}
	if !slices.ContainsFunc(sim.Requests(), func(r pvesim.Request) bool {
		return r.Method == "POST" && strings.HasSuffix(r.Path, "/snapshot/"+snaps[0].Name+"/rollback")
	}) {
		t.Error("no rollback through the snapshot rollback API")
	}

	// A fork of 3 into the 3 warm VMs.
	pooled := map[int]bool{}
	for _, v := range poolVMs(sim) {
		pooled[v.VMID] = true
	}
	forks, err := s.eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range forks {
		fk := &forks[i]
		if !pooled[vmidOf(t, fk)] {
			t.Errorf("fork %s is VM %d, not one of the warm pool's %v", fk.ID, vmidOf(t, fk), pooled)
		}
		if got := run(fk.ID, list); got != want {
			t.Errorf("fork %s:\n%s\nwant\n%s", fk.ID, got, want)
		}
	}
	run(forks[0].ID, "echo fork0 > a.txt")
	for _, id := range []string{src.ID, forks[1].ID, forks[2].ID} {
		if got := run(id, "cat a.txt"); got != "base" {
			t.Errorf("%s reads %q after fork 0 wrote", id, got)
		}
	}

	// Refusals.
	var fe *delegate.FieldError
	if _, err := s.eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Memory: true}); !errors.As(err, &fe) || fe.Field != "memory" || !strings.Contains(err.Error(), "vmstate") {
		t.Errorf("memory: true: %v", err)
	}
	mine, err := s.eng.CheckpointSandbox(ctx, forks[1].ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.eng.RollbackSandbox(ctx, src.ID, mine.ID); !errors.As(err, &fe) || fe.Field != "checkpoint" {
		t.Errorf("a rollback to another sandbox's checkpoint: %v", err)
	}

	// Deleting a checkpoint deletes its snapshot and archive; releasing
	// a sandbox its archives.
	if err := s.eng.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	deleted := snaps[0].Name
	snaps, err = c.Snapshots(ctx, "pve1", vmid)
	if err != nil || slices.ContainsFunc(snaps, func(sn pve.Snapshot) bool { return sn.Name == deleted }) {
		t.Errorf("snapshots after deleting %s: %+v %v", deleted, snaps, err)
	}
	archives := func(vmid int) []string {
		m, _ := filepath.Glob(filepath.Join(dir, strconv.Itoa(vmid)+"-*.tgz"))
		return m
	}
	if n := len(archives(vmid)); n != 1 { // the fork's own checkpoint stays
		t.Errorf("archives of VM %d after deleting one of its 2 checkpoints: %d", vmid, n)
	}
	fvmid := vmidOf(t, &forks[1])
	if _, _, err := s.eng.ReleaseSandbox(ctx, forks[1].ID); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the released fork's archives removed", func() bool { return len(archives(fvmid)) == 0 })
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

// TestProxmoxCheckpointBackend: the backend's own rules: without a
// checkpoint directory it says what is missing; a fork from a checkpoint id that is not the
// backend's, or is gone, is refused; a paused VM stays paused through a
// checkpoint.
func TestProxmoxCheckpointBackend(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	b, err := proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if caps := b.Capabilities(); caps.Checkpoint || !strings.Contains(caps.CheckpointMissing, "CheckpointDir") {
		t.Errorf("without a directory: %+v", caps)
	}
	dir := t.TempDir()
	b, err = proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond, CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spec := sandbox.Spec{JobID: "sbx-ck1", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, MultiExec: true}
	inst, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Destroy(context.Background()) })
	if err := inst.WriteFile(ctx, "/workspace/a.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := inst.(sandbox.Pauser).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	cp, err := inst.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vmid := atoiT(t, strings.Split(inst.ID(), "-")[1])
	if st, err := c.VMStatus(ctx, "pve1", vmid); err != nil || st.QMPStatus != "paused" {
		t.Errorf("a paused VM is %+v after a checkpoint (%v)", st, err)
	}
	if err := inst.(sandbox.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{"cp-0123456789ab", "pve-1-0123456789ab"} {
		spec.JobID, spec.From = "sbx-ck2", from
		if _, err := b.Create(ctx, spec); err == nil || !strings.Contains(err.Error(), "not a checkpoint of the Proxmox backend") {
			t.Errorf("a fork from %q: %v", from, err)
		}
	}
	if err := b.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	spec.From = cp.ID
	if _, err := b.Create(ctx, spec); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("a fork from a deleted checkpoint: %v, want ErrGone", err)
	}
	if err := b.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Errorf("deleting it again: %v", err)
	}

}

// TestProxmoxCheckpointZFS: on ZFS a VM rolls back only to its newest
// snapshot (pve-storage ZFSPoolPlugin volume_rollback_is_possible); a
// rollback to an older checkpoint fails saying what to do, and works
// once the newer one is deleted.
func TestProxmoxCheckpointZFS(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.StorageSpec{ID: "tank", Type: "zfspool"})
	})
	if err := sim.AddTemplate("pve1", 9100, "zfs-job", pvesim.TemplateSpec{Storage: "tank"}); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	b, err := proxmox.New(c, proxmox.Config{Template: "zfs-job", PollInterval: 50 * time.Millisecond, CheckpointDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inst, err := b.Create(ctx, sandbox.Spec{JobID: "sbx-zfs1", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, MultiExec: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Destroy(context.Background()) })
	ck := inst.(sandbox.Checkpointer)
	first, err := ck.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ck.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ck.Rollback(ctx, first.ID); err == nil || !strings.Contains(err.Error(), "rolls back only to the newest snapshot") {
		t.Errorf("a rollback past a newer snapshot on ZFS: %v", err)
	}
	if err := b.DeleteCheckpoint(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if err := ck.Rollback(ctx, first.ID); err != nil {
		t.Errorf("a rollback to the newest: %v", err)
	}
}

// TestProxmoxDiskQuota (issue 36): on Proxmox the disk quota counts a
// principal's checkpoints by their archives on the server (caches are
// not kept there): one past DELEGATE_QUOTA_DISK is refused naming it,
// and its snapshot and archive are deleted; the operator is not held.
func TestProxmoxDiskQuota(t *testing.T) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	dir := t.TempDir()
	s := newServer(t, c, proxmox.Config{Instance: "quota1", CheckpointDir: dir}, engine.Config{Quotas: engine.Quotas{DiskBytes: 160 << 10}})
	alice := delegate.WithPrincipal(context.Background(), &delegate.Principal{Name: "alice",
		Scopes: []delegate.Scope{delegate.ScopeJobs, delegate.ScopeSandboxes}})
	sb, err := s.eng.OpenSandbox(alice, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 100_000)
	rand.Read(data) // an archive as large as the file: 100 KB of 160 KiB
	if err := s.eng.WriteSandboxFile(alice, sb.ID, "r.bin", data, 0o644); err != nil {
		t.Fatal(err)
	}
	first, err := s.eng.CheckpointSandbox(alice, sb.ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatalf("a checkpoint of 100 KB within 160 KiB: %v", err)
	}
	_, err = s.eng.CheckpointSandbox(alice, sb.ID, delegate.CheckpointOptions{})
	var qe *delegate.QuotaError
	if !errors.As(err, &qe) || qe.Setting != "DELEGATE_QUOTA_DISK" || !strings.Contains(err.Error(), "disk of checkpoints and caches: 9") {
		t.Fatalf("a second checkpoint past the quota: %v (first %d bytes)", err, first.Bytes)
	}
	t.Logf("refused: %v", err)
	vmid := vmidOf(t, sb)
	snaps, err := c.Snapshots(context.Background(), "pve1", vmid)
	if err != nil || len(snaps) != 2 { // the first checkpoint's, and "current"
		t.Errorf("the VM's snapshots after a refused checkpoint: %+v %v; want the first's only", snaps, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, strconv.Itoa(vmid)+"-*.tgz")); len(m) != 1 {
		t.Errorf("archives after a refused checkpoint: %v; want the first's only", m)
	}
	if _, err := s.eng.CheckpointSandbox(context.Background(), sb.ID, delegate.CheckpointOptions{}); err != nil {
		t.Errorf("the operator is held by alice's disk quota: %v", err)
	}
	if _, _, err := s.eng.ReleaseSandbox(alice, sb.ID); err != nil {
		t.Fatal(err)
	}
}
