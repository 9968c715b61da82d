package pvesim

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/pve"
)

// readGuest reads a file of a running VM's guest through the agent.
func readGuest(t *testing.T, s *sim, id int, path string) string {
	t.Helper()
	fc, err := s.c.AgentFileRead(ctxT(t), "pve1", id, path)
	if err != nil {
		t.Fatalf("read %s in VM %d: %v", path, id, err)
	}
	return string(fc.Data)
}

func writeGuest(t *testing.T, s *sim, id int, path, data string) {
	t.Helper()
	if err := s.c.AgentFileWrite(ctxT(t), "pve1", id, path, []byte(data)); err != nil {
		t.Fatalf("write %s in VM %d: %v", path, id, err)
	}
}

func startAndWait(t *testing.T, s *sim, id int) {
	t.Helper()
	upid, err := s.c.StartVM(ctxT(t), "pve1", id)
	mustTask(t, s, upid, err)
	waitAgent(t, s, id)
}

// TestSnapshotDisk: a VM's disk (its guest's /workspace) outlives a
// stop; a snapshot keeps it as it was, with its modes and owners; a
// rollback stops the running VM and brings the snapshot's files back at
// its next start; deleting a snapshot and destroying the VM remove what
// they kept.
func TestSnapshotDisk(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 150, nil)
	writeGuest(t, s, id, "/workspace/a.txt", "before")
	if st := run(t, s, id, "/bin/sh", "-c", "mkdir -p /workspace/d && echo x >/workspace/d/x && chmod 0751 /workspace/d/x && chown 1000:1000 /workspace/d/x && ln -s a.txt /workspace/l"); !okExit(st) {
		t.Fatalf("setup: %+v", st)
	}
	stat := func() string {
		t.Helper()
		st := run(t, s, id, "/usr/bin/stat", "-c", "%a %u:%g %N", "/workspace/d/x", "/workspace/l")
		if !okExit(st) {
			t.Fatalf("stat: %+v", st)
		}
		return string(st.Stdout)
	}
	wantStat := stat()
	upid, err := s.c.CreateSnapshot(ctx, "pve1", id, "s1", "", false)
	mustTask(t, s, upid, err)
	writeGuest(t, s, id, "/workspace/a.txt", "after")
	writeGuest(t, s, id, "/workspace/new.txt", "new")

	// A stop and a start keep the disk.
	upid, err = s.c.StopGuest(ctx, "pve1", pve.QEMU, id)
	mustTask(t, s, upid, err)
	startAndWait(t, s, id)
	if got := readGuest(t, s, id, "/workspace/a.txt"); got != "after" {
		t.Errorf("after a stop and a start a.txt is %q, want %q", got, "after")
	}
	if got := stat(); got != wantStat {
		t.Errorf("after a restart: %q, want %q", got, wantStat)
	}

	// The rollback stops the VM (a snapshot without RAM); its next
	// start has the snapshot's files.
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s1", false)
	mustTask(t, s, upid, err)
	if v, _ := s.VM(id); v.Status != "stopped" {
		t.Fatalf("a rollback to a snapshot without RAM left the VM %s", v.Status)
	}
	startAndWait(t, s, id)
	if got := readGuest(t, s, id, "/workspace/a.txt"); got != "before" {
		t.Errorf("after the rollback a.txt is %q, want %q", got, "before")
	}
	if st := run(t, s, id, "/usr/bin/test", "-e", "/workspace/new.txt"); okExit(st) {
		t.Error("a file written after the snapshot is there after the rollback")
	}
	if got := stat(); got != wantStat {
		t.Errorf("after the rollback: %q, want %q", got, wantStat)
	}
	// rollback with start boots it again, with the files.
	writeGuest(t, s, id, "/workspace/a.txt", "again")
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s1", true)
	mustTask(t, s, upid, err)
	waitAgent(t, s, id)
	if got := readGuest(t, s, id, "/workspace/a.txt"); got != "before" {
		t.Errorf("after the rollback with start a.txt is %q", got)
	}

	// A snapshot of a stopped VM keeps its saved disk.
	writeGuest(t, s, id, "/workspace/a.txt", "stopped")
	upid, err = s.c.StopGuest(ctx, "pve1", pve.QEMU, id)
	mustTask(t, s, upid, err)
	upid, err = s.c.CreateSnapshot(ctx, "pve1", id, "s2", "", false)
	mustTask(t, s, upid, err)
	upid, err = s.c.RollbackSnapshot(ctx, "pve1", id, "s2", true)
	mustTask(t, s, upid, err)
	waitAgent(t, s, id)
	if got := readGuest(t, s, id, "/workspace/a.txt"); got != "stopped" {
		t.Errorf("a snapshot of a stopped VM: a.txt is %q", got)
	}

	upid, err = s.c.DeleteSnapshot(ctx, "pve1", id, "s1")
	mustTask(t, s, upid, err)
	if _, err := os.Stat(s.disks.snap(id, "s1")); err == nil {
		t.Error("a deleted snapshot's files are still kept")
	}
	upid, err = s.c.StopGuest(ctx, "pve1", pve.QEMU, id)
	mustTask(t, s, upid, err)
	upid, err = s.c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{})
	mustTask(t, s, upid, err)
	if _, err := os.Stat(s.disks.vmDir(id)); err == nil {
		t.Error("a destroyed VM's disk is still kept")
	}
}

// TestSnapshotFreeze: a snapshot without RAM of a running VM whose agent
// is enabled but does not answer says qemu-server's "skipping guest
// filesystem freeze" and is taken all the same; with RAM, or freeze-fs=0,
// nothing is said.
func TestSnapshotFreeze(t *testing.T) {
	s := newSim(t, Options{AgentPingTimeout: 50e6})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 151, nil)
	s.SetFaults(Faults{AgentDown: true})
	const skip = "skipping guest filesystem freeze - agent configured but not running?"
	for _, c := range []struct {
		name, agent string
		vmstate     bool
		want        bool
	}{{"s1", "", false, true}, {"s2", "", true, false}, {"s3", "enabled=1,freeze-fs=0", false, false}} {
		if c.agent != "" {
			if err := s.c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Options: map[string]string{"agent": c.agent}}); err != nil {
				t.Fatal(err)
			}
		}
		upid, err := s.c.CreateSnapshot(ctx, "pve1", id, c.name, "", c.vmstate)
		mustTask(t, s, upid, err)
		lines, _, err := s.c.TaskLog(ctx, "pve1", upid, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		said := false
		for _, l := range lines {
			said = said || l.T == skip
		}
		if said != c.want {
			t.Errorf("%s (agent %q, vmstate %v): the log says the skip %v, want %v: %+v", c.name, c.agent, c.vmstate, said, c.want, lines)
		}
	}
}

// TestSnapshotRefusals: what qemu-server refuses, the simulator refuses:
// a name the schema does not allow, a reserved one, one in use, a
// locked VM (create, rollback, delete), a disk whose storage has no
// snapshots (a raw file on a directory storage, thick LVM), a template,
// and a rollback or delete of a snapshot that does not exist.
func TestSnapshotRefusals(t *testing.T) {
	s := newSim(t, Options{Storages: append(DefaultStorages(), StorageSpec{ID: "thick", Type: "lvm"}, StorageSpec{ID: "files", Type: "dir", Content: "images"}),
		TaskDelays: map[string]time.Duration{"qmsnapshot": 700 * time.Millisecond}})
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 152, nil)
	for _, name := range []string{"1abc", "a", "with space", "x.y", strings.Repeat("a", 41)} {
		_, err := s.c.CreateSnapshot(ctx, "pve1", id, name, "", false)
		var api *pve.APIError
		if !errors.As(err, &api) || api.StatusCode != 400 || api.Errors["snapname"] == "" {
			t.Errorf("snapshot name %q: %v, want a 400 naming snapname", name, err)
		}
	}
	for _, name := range []string{"current", "pending", "PENDING"} {
		if _, err := s.c.CreateSnapshot(ctx, "pve1", id, name, "", false); !strings.Contains(reasonOf(err), "reserved name") {
			t.Errorf("snapshot name %q: %v", name, err)
		}
	}
	upid, err := s.c.CreateSnapshot(ctx, "pve1", id, "ok_1-x", "", false)
	mustTask(t, s, upid, err)
	upid, _ = s.c.CreateSnapshot(ctx, "pve1", id, "ok_1-x", "", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "snapshot name 'ok_1-x' already used" {
		t.Errorf("a name in use: %q", te.ExitStatus)
	}

	if err := s.SetVMLock(id, "backup"); err != nil {
		t.Fatal(err)
	}
	for what, call := range map[string]func() (string, error){
		"create":   func() (string, error) { return s.c.CreateSnapshot(ctx, "pve1", id, "s9", "", false) },
		"rollback": func() (string, error) { return s.c.RollbackSnapshot(ctx, "pve1", id, "ok_1-x", false) },
		"delete":   func() (string, error) { return s.c.DeleteSnapshot(ctx, "pve1", id, "ok_1-x") },
	} {
		upid, err := call()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if te := taskErr(t, s, upid); te.ExitStatus != "VM is locked (backup)" {
			t.Errorf("%s of a locked VM: %q", what, te.ExitStatus)
		}
	}
	if v, _ := s.VM(id); v.Status != "running" {
		t.Errorf("a refused rollback left the VM %s", v.Status)
	}
	if err := s.SetVMLock(id, ""); err != nil {
		t.Fatal(err)
	}
	// The task holds the snapshot lock while it runs: a second one is
	// refused meanwhile.
	first, err := s.c.CreateSnapshot(ctx, "pve1", id, "slow", "", false)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the VM is locked snapshot during the task", func() bool {
		cfg, err := s.c.VMConfig(ctx, "pve1", id)
		return err == nil && cfg.Lock == "snapshot"
	})
	upid, _ = s.c.CreateSnapshot(ctx, "pve1", id, "other", "", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "VM is locked (snapshot)" {
		t.Errorf("a snapshot during a snapshot: %q", te.ExitStatus)
	}
	mustTask(t, s, first, nil)

	for _, c := range []struct {
		id   int
		opts pve.CloneOptions
	}{{153, pve.CloneOptions{Full: ptr(true), Storage: "files", Format: "raw"}}, {154, pve.CloneOptions{Full: ptr(true), Storage: "thick"}}} {
		c.opts.NewID = c.id
		upid, err := s.c.CloneVM(ctx, "pve1", tplID, c.opts)
		mustTask(t, s, upid, err)
		upid, err = s.c.CreateSnapshot(ctx, "pve1", c.id, "sn", "", false)
		if err != nil {
			t.Fatal(err)
		}
		if te := taskErr(t, s, upid); te.ExitStatus != "snapshot feature is not available" {
			t.Errorf("VM %d (%+v): %q", c.id, c.opts, te.ExitStatus)
		}
	}
	// A full copy in qcow2 on the directory storage, and a linked clone
	// (on local-lvm, LVM-thin), take snapshots.
	for _, c := range []struct {
		id   int
		opts pve.CloneOptions
	}{{155, pve.CloneOptions{Full: ptr(true), Storage: "files", Format: "qcow2"}}, {156, pve.CloneOptions{}}} {
		c.opts.NewID = c.id
		upid, err := s.c.CloneVM(ctx, "pve1", tplID, c.opts)
		mustTask(t, s, upid, err)
		upid, err = s.c.CreateSnapshot(ctx, "pve1", c.id, "sn", "", false)
		mustTask(t, s, upid, err)
	}
	upid, _ = s.c.CreateSnapshot(ctx, "pve1", tplID, "sn", "", false)
	if te := taskErr(t, s, upid); te.ExitStatus != "you can't take a snapshot if it's a template" {
		t.Errorf("template: %q", te.ExitStatus)
	}
}

func okExit(st pve.ExecStatus) bool { return st.ExitCode != nil && *st.ExitCode == 0 }
