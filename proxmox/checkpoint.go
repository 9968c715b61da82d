package proxmox

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Checkpoints, rollbacks and forks of kept sandboxes (issue 38), files
// only.
//
// A checkpoint is two things made one after the other:
//
//   - a Proxmox snapshot of the VM without its RAM (vmstate 0), for
//     rollbacks: qemu-server freezes the guest's file systems around it
//     itself when the VM's agent is enabled (src/PVE/QemuConfig.pm
//     __snapshot_check_freeze_needed, __snapshot_freeze), so the cut is
//     consistent on disk; the storage must have snapshots (LVM-thin, ZFS,
//     Ceph RBD, qcow2 on directory, NFS or CIFS storages; not thick LVM's
//     raw volumes: "snapshot feature is not available");
//   - an archive of /workspace on the server (Config.CheckpointDir), for
//     forks: a snapshot of a VM that is not a template clones only as a
//     full copy of its disks, far too slow to be a fork, so a fork is a
//     new VM (a warm one of the pool where the fork's shape fits) that
//     gets the workspace's files. The archive comes out of the VM once
//     (the agent reads 16 MiB a call, or HTTP where the VM has a network)
//     and goes into each fork, the forks in parallel.
//
// A checkpoint leaves the VM and its processes running (a snapshot
// without RAM); the guest's file systems are frozen for the cut only.
// A rollback is the snapshot rollback API (a qmrollback task, start=1):
// Proxmox stops the VM, brings its disks back and starts it again (its
// processes start from a clean boot: pve-guest-common
// src/PVE/AbstractConfig.pm snapshot_rollback); delegate waits for the
// agent and readies the guest again.
//
// The ids say where things are: a checkpoint "pve-<vmid>-<12 hex>" is
// snapshot "delegate-<12 hex>" of VM <vmid> and the archive
// "<vmid>-<12 hex>.tgz" in the checkpoint directory. Destroying the VM
// takes its snapshots with it and the backend removes its archives.
// Forks keep nothing of their checkpoint: their files are their own.

// checkpointMemoryMissing is why no checkpoint keeps memory here.
const checkpointMemoryMissing = "a Proxmox snapshot with RAM (vmstate) restores processes the server has already ended, " +
	"and a fork with memory would need a clone of the running VM (a full copy of its disks, not a fork): " +
	"checkpoints of Proxmox VMs keep files only; leave memory out (the VM's processes start again from a clean boot)"

var checkpointIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^pve-([1-9][0-9]{2,8})-([0-9a-f]{12})$`) })

// ckpRef is what a checkpoint id names.
type ckpRef struct {
	id   string
	vmid int
	key  string // 12 hex digits
}

func parseCheckpointID(id string) (ckpRef, error) {
	m := checkpointIDRe().FindStringSubmatch(id)
	if m == nil {
		return ckpRef{}, fmt.Errorf("proxmox: %q is not a checkpoint of the Proxmox backend (pve-<vmid>-<12 hex digits>)", id)
	}
	vmid, _ := strconv.Atoi(m[1])
	return ckpRef{id: id, vmid: vmid, key: m[2]}, nil
}

func newCheckpointRef(vmid int) ckpRef {
	var b [6]byte
	rand.Read(b[:])
	key := hex.EncodeToString(b[:])
	return ckpRef{id: fmt.Sprintf("pve-%d-%s", vmid, key), vmid: vmid, key: key}
}

// snapname is the Proxmox snapshot's name (a pve-configid).
func (r ckpRef) snapname() string { return "delegate-" + r.key }

// checkpoints is the backend's part that checkpoints kept VMs, rolls
// them back and fills forks; dir is Config.CheckpointDir.
type checkpoints struct {
	b   *Backend
	dir string
}

func (k *checkpoints) path(r ckpRef) string {
	return filepath.Join(k.dir, fmt.Sprintf("%d-%s.tgz", r.vmid, r.key))
}

// dropArchives removes the checkpoints' archives of a destroyed VM.
func (k *checkpoints) dropArchives(vmid int) {
	b := k.b
	if k.dir == "" {
		return
	}
	names, _ := filepath.Glob(filepath.Join(k.dir, strconv.Itoa(vmid)+"-*.tgz"))
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("remove a checkpoint's archive", "vmid", vmid, "file", n, "err", err)
		}
	}
}

// keptVM is a kept sandbox's VM (Spec.MultiExec), which checkpoints and
// rolls back.
type keptVM struct{ *vmSandbox }

var _ sandbox.Checkpointer = keptVM{}

// instance is the Instance of a VM: a keptVM for a kept sandbox.
func instance(s *vmSandbox) sandbox.Instance {
	if s.kept {
		return keptVM{s}
	}
	return s
}

// Checkpoint implements sandbox.Checkpointer.
func (k keptVM) Checkpoint(ctx context.Context) (sandbox.Checkpoint, error) {
	return k.b.ckpts.checkpoint(ctx, k.vmSandbox)
}

// Rollback implements sandbox.Checkpointer.
func (k keptVM) Rollback(ctx context.Context, id string) error {
	return k.b.ckpts.rollback(ctx, k.vmSandbox, id)
}

// checkpoint makes a checkpoint of s: the workspace's archive, then the
// snapshot. A paused VM is resumed for the archive (its agent answers
// nothing while paused) and paused again.
func (k *checkpoints) checkpoint(ctx context.Context, s *vmSandbox) (sandbox.Checkpoint, error) {
	b := k.b
	if k.dir == "" {
		return sandbox.Checkpoint{}, errors.New("proxmox: " + noCheckpointDir)
	}
	paused, err := vmPaused(ctx, s)
	if err != nil {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint VM %d: %w", s.vmid, err)
	}
	if paused {
		if err := s.Resume(ctx); err != nil {
			return sandbox.Checkpoint{}, fmt.Errorf("checkpoint VM %d: %w", s.vmid, err)
		}
		defer func() {
			if err := s.Pause(context.WithoutCancel(ctx)); err != nil {
				b.log.Warn("could not pause a checkpointed VM again", "vmid", s.vmid, "err", err)
			}
		}()
	}
	ref := newCheckpointRef(s.vmid)
	// The archive comes out of the guest first, as it is; then the
	// snapshot is taken while the server checks and packs the archive:
	// nothing of delegate's is in the guest's disk for the snapshot, and
	// no agent call meets the guest's file systems frozen (qemu-ga refuses
	// other commands while they are).
	raw, err := fetchArchive(ctx, s, k.path(ref))
	if err != nil {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint VM %d: %w", s.vmid, err)
	}
	defer os.Remove(raw)
	type packed struct {
		size int64
		err  error
	}
	done := make(chan packed, 1)
	go func() {
		size, err := saveArchive(ctx, raw, k.path(ref))
		done <- packed{size, err}
	}()
	var snapped bool
	err = s.onNode(ctx, func(node string) error {
		upid, err := b.c.CreateSnapshot(ctx, node, s.vmid, ref.snapname(), "delegate checkpoint "+ref.id+" of "+orLegacy(s.owner.job), false)
		if err == nil {
			snapped = true
			logTask(b.log, "snapshot", s.vmid, s.owner.job, upid)
			err = b.c.WaitTask(ctx, node, upid)
		}
		return err
	})
	pk := <-done
	if err != nil {
		os.Remove(k.path(ref))
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint VM %d: snapshot %s: %w", s.vmid, ref.snapname(), snapshotHint(err))
	}
	if pk.err != nil {
		if snapped {
			if derr := k.delete(context.WithoutCancel(ctx), ref.id); derr != nil {
				b.log.Warn("delete the snapshot of a checkpoint whose archive failed", "vmid", s.vmid, "checkpoint", ref.id, "err", derr)
			}
		}
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint VM %d: %w", s.vmid, pk.err)
	}
	size := pk.size
	b.log.Info("VM checkpointed", "vmid", s.vmid, "job", s.owner.job, "checkpoint", ref.id, "archive_bytes", size)
	return sandbox.Checkpoint{ID: ref.id, Bytes: size, Created: time.Now().UTC()}, nil
}

// fetchArchive brings the workspace's archive out of the guest as it
// is, into a temporary file beside path, and returns that file's name.
func fetchArchive(ctx context.Context, s *vmSandbox, path string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	rc, err := s.GetArchive(ctx)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".raw-*")
	if err != nil {
		rc.Close()
		return "", err
	}
	_, err = io.Copy(f, rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("bring the workspace's archive out: %w", err)
	}
	return f.Name(), nil
}

// saveArchive writes the archive in the file raw (the guest's) to path
// (through a temporary file beside it), and returns its size: checked
// and packed once (packArchive), at gzip's default level, as it goes
// into every fork (smaller than at the fastest level: fewer agent calls
// each).
func saveArchive(ctx context.Context, raw, path string) (int64, error) {
	in, err := os.Open(raw)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	f, err := os.CreateTemp(filepath.Dir(path), ".part-*")
	if err != nil {
		return 0, err
	}
	cw := &countWriter{w: f}
	_, err = packArchive(ctx, in, cw, gzip.DefaultCompression)
	n := cw.n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("save the workspace's archive: %w", err)
	}
	return n, nil
}

// vmPaused tells whether the VM is suspended.
func vmPaused(ctx context.Context, s *vmSandbox) (bool, error) {
	var st pve.VMStatus
	err := s.onNode(ctx, func(node string) (err error) {
		st, err = s.b.c.VMStatus(ctx, node, s.vmid)
		return err
	})
	return st.QMPStatus == "paused", err
}

// rollback rolls s back to checkpoint id: the snapshot rollback API
// with start=1, then the guest agent waited for and the guest readied
// again (and, behind the egress proxy, its address pinned again: DHCP
// may give it another). A paused VM is paused again. Only the VM's own
// checkpoints are reachable.
func (k *checkpoints) rollback(ctx context.Context, s *vmSandbox, id string) error {
	b := k.b
	ref, err := parseCheckpointID(id)
	if err != nil {
		return err
	}
	if ref.vmid != s.vmid {
		return fmt.Errorf("proxmox: checkpoint %s is of VM %d, not of this sandbox's VM %d: a sandbox rolls back to its own checkpoints", id, ref.vmid, s.vmid)
	}
	paused, err := vmPaused(ctx, s)
	if err != nil {
		return fmt.Errorf("roll back VM %d: %w", s.vmid, err)
	}
	err = s.onNode(ctx, func(node string) error {
		if ok, found, err := b.vms.owned(ctx, node, s.vmid, s.owner); err != nil {
			return err
		} else if !found {
			return fmt.Errorf("node %s: %w", node, errNotThere)
		} else if !ok {
			return sandbox.ErrGone
		}
		upid, err := b.c.RollbackSnapshot(ctx, node, s.vmid, ref.snapname(), true)
		if err == nil {
			logTask(b.log, "rollback", s.vmid, s.owner.job, upid)
			err = b.c.WaitTask(ctx, node, upid)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("roll back VM %d to %s: %w", s.vmid, id, snapshotHint(err))
	}
	here := *s // waitAgent and pin ask the node the VM is on now
	here.node = s.where()
	if err := b.waitAgent(ctx, &here); err != nil {
		return err
	}
	if err := s.prepare(ctx); err != nil {
		return err
	}
	if s.nic && b.cfg.Egress != nil {
		if err := b.fw.pin(ctx, &here, "pve-firewall"); err != nil {
			return err
		}
	}
	if paused {
		if err := s.Pause(ctx); err != nil {
			return err
		}
	}
	b.log.Info("VM rolled back", "vmid", s.vmid, "job", s.owner.job, "checkpoint", id)
	return nil
}

// snapshotHint explains a snapshot call Proxmox refused.
func snapshotHint(err error) error {
	var te *pve.TaskError
	if errors.As(err, &te) {
		switch {
		case strings.Contains(te.ExitStatus, "snapshot feature is not available"):
			return fmt.Errorf("the VM's disks are on a storage without snapshots (thick LVM, or raw files): "+
				"make the template's disk LVM-thin, ZFS, Ceph RBD or qcow2 (docs/PROXMOX.md, \"Checkpoints and forks\"): %w", err)
		case strings.Contains(te.ExitStatus, "is not most recent snapshot"):
			return fmt.Errorf("the VM's disk is on ZFS, which rolls back only to the newest snapshot: delete the checkpoints made after this one first, "+
				"or roll back to the newest: %w", err)
		case strings.Contains(te.ExitStatus, "does not exist"):
			return fmt.Errorf("%w: %w", sandbox.ErrGone, err)
		}
	}
	return privilegeHint(err)
}

// delete deletes a checkpoint: the archive goes, and the snapshot, if
// its VM is still this server's.
func (k *checkpoints) delete(ctx context.Context, id string) error {
	b := k.b
	ref, err := parseCheckpointID(id)
	if err != nil {
		return err
	}
	if k.dir != "" {
		if err := os.Remove(k.path(ref)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("proxmox: delete checkpoint %s: %w", id, err)
		}
	}
	r, err := b.vms.locate(ctx, ref.vmid)
	if errors.Is(err, sandbox.ErrGone) || pve.IsNotFound(err) {
		return nil // the VM went, with its snapshots
	}
	if err != nil {
		return fmt.Errorf("proxmox: delete checkpoint %s: %w", id, err)
	}
	cfg, err := b.c.VMConfig(ctx, r.Node, ref.vmid)
	if pve.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("proxmox: delete checkpoint %s: %w", id, privilegeHint(err))
	}
	if !strings.HasPrefix(cfg.Name, namePrefix(b.cfg.Instance)) {
		return nil // the vmid is another VM's now
	}
	snaps, err := b.c.Snapshots(ctx, r.Node, ref.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: delete checkpoint %s: %w", id, privilegeHint(err))
	}
	found := false
	for _, sn := range snaps {
		found = found || sn.Name == ref.snapname()
	}
	if !found {
		return nil
	}
	upid, err := b.c.DeleteSnapshot(ctx, r.Node, ref.vmid, ref.snapname())
	if err == nil {
		logTask(b.log, "delete snapshot", ref.vmid, "", upid)
		err = b.c.WaitTask(ctx, r.Node, upid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: delete checkpoint %s (snapshot %s of VM %d): %w", id, ref.snapname(), ref.vmid, privilegeHint(err))
	}
	return nil
}

// openFork opens the archive of the checkpoint a fork starts from.
func (k *checkpoints) open(from string) (*os.File, error) {
	ref, err := parseCheckpointID(from)
	if err != nil {
		return nil, err
	}
	if k.dir == "" {
		return nil, errors.New("proxmox: " + noCheckpointDir)
	}
	f, err := os.Open(k.path(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("proxmox: checkpoint %s: it was deleted, or its VM destroyed: %w", from, sandbox.ErrGone)
	}
	return f, err
}

// fill puts a fork's files into its new VM: the archive is the
// server's own (packArchive), put in as it is. A fork without network
// in a warm VM with a NIC (PoolConfig.Network) fetches it over HTTP, and
// then loses its NIC (nicOff) while the archive is unpacked.
func (k *checkpoints) fill(ctx context.Context, s *vmSandbox, spec sandbox.Spec, f *os.File) error {
	spec.Step("copying the checkpoint's files")
	err := k.put(ctx, s, spec, f)
	if err == nil && s.nic && !spec.Network {
		err = nicOff(ctx, s) // it went through the agent after all
	}
	if err != nil {
		return fmt.Errorf("proxmox: fork %s into VM %d: %w", spec.From, s.vmid, err)
	}
	return nil
}

func (k *checkpoints) put(ctx context.Context, s *vmSandbox, spec sandbox.Spec, f *os.File) error {
	x, _ := viaHTTP(s)
	if x == nil || spec.Network {
		_, err := putArchive(ctx, s, f, false)
		return err
	}
	base := xferName(".tgz")
	_, used, err := x.put(ctx, s, s.vmid, s.owner.job, f, base, false)
	if !used {
		_, err = putByAgent(ctx, s, f, base, false)
		return err
	}
	if err != nil {
		return err
	}
	// The archive is in the guest, checked: its NIC goes while it is
	// unpacked.
	off := make(chan error, 1)
	go func() { off <- nicOff(ctx, s) }()
	err = unpack(ctx, s, base)
	return errors.Join(err, <-off)
}

// nicOff takes a fork's NIC away once its files came over it (a warm
// VM's, PoolConfig.Network): Proxmox hot-unplugs it (qemu-server
// src/PVE/QemuServer.pm vmconfig_hotplug_pending, vm_deviceunplug), and
// it is checked gone from the running VM's config before the fork is
// handed over. Where the unplug fails ("still busy in guest?") the NIC
// stays, and so the fork fails. The unplug takes a second or more
// (qemu_devicedelverify looks for the device again a second after
// device_del): a qmconfig task (POST), which leaves the pvedaemon worker
// free meanwhile (update_vm_api forks the task's worker and answers its
// UPID), where PUT would hold the worker and one of the node's call slots
// (PROXMOX_NODE_CALLS) for that second, and a fork of 4 would wait for
// its unplugs two at a time.
func nicOff(ctx context.Context, s *vmSandbox) error {
	// Polled for every unplugPoll: the task takes a second or so, which
	// WaitTask's growing waits would find done up to 0.7 s late.
	upid, err := s.b.c.SetVMConfigAsync(ctx, s.node, s.vmid, pve.VMConfigUpdate{Delete: []string{"net0"}})
	if err == nil {
		logTask(s.b.log, "unplug NIC", s.vmid, s.owner.job, upid)
		err = s.b.c.WaitTaskEvery(ctx, s.node, upid, unplugPoll)
	}
	if err == nil {
		err = checkNICsGone(ctx, s.b.c, s.node, s.vmid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: take the NIC of fork VM %d away (a fork of a sandbox without network has none): %w", s.vmid, privilegeHint(err))
	}
	s.nic = false
	return nil
}

// unplugPoll is how often an unplug's task is asked whether it ended.
const unplugPoll = 200 * time.Millisecond

const noCheckpointDir = "checkpoints, rollbacks and forks need a directory on the server for the forks' archives (Config.CheckpointDir; " +
	"delegate serve sets it in its data directory)"
