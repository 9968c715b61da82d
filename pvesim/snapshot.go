package pvesim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Snapshots of VMs, as pve-guest-common src/PVE/AbstractConfig.pm
// (snapshot_create, snapshot_rollback, snapshot_delete) and qemu-server
// src/PVE/API2/Qemu.pm (snapshot, rollback, delsnapshot, snapshot_list)
// and src/PVE/QemuConfig.pm make them. A snapshot is a copy of the
// config, kept in the VM's config file, and of its disk (the guest's
// /workspace: vmdisk.go); a rollback makes both the VM's again.

// snapshot is a [snapname] section of a VM's config file.
type snapshot struct {
	conf        map[string]string
	snaptime    int64
	seq         int // creation order (snaptime has a one-second grain)
	description string
	vmstate     bool   // taken with the RAM of a running VM
	snapstate   string // prepare, delete; "" once complete
}

// snapshotNames lists a VM's snapshots, oldest first.
func (v *vm) snapshotNames() []string {
	names := slices.Collect(maps.Keys(v.snapshots))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(v.snapshots[a].seq, v.snapshots[b].seq) })
	return names
}

// snapshotCopySkip are the keys __snapshot_copy_config leaves out.
var snapshotCopySkip = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(?:snapshots|snapstate|snaptime|vmstate|lock|digest|description|unused\d+)$`)
})

// copyConfig is __snapshot_copy_config: the config without the keys a
// snapshot does not carry (parent stays: a snapshot knows its parent).
func copyConfig(src map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range src {
		if !snapshotCopySkip().MatchString(k) {
			out[k] = v
		}
	}
	return out
}

// canSnapshot is has_feature('snapshot', $conf): every disk (not CD-ROMs)
// is on a storage whose plugin snapshots a current volume (pve-storage
// src/PVE/Storage/*Plugin.pm volume_has_feature): LVM-thin, ZFS and RBD
// always; directory, NFS and CIFS storages only qcow2 files (a raw or
// vmdk file has no snapshots); thick LVM only qcow2 volumes (PVE 9's
// snapshots as volume chains), and its volumes here are raw. Call with
// s.mu held.
func (s *Server) canSnapshot(v *vm) bool {
	for _, k := range v.disks() {
		vol := volumeID(v.conf[k])
		st := s.storage(storageOf(vol))
		switch {
		case st == nil || st.typ == "lvm":
			return false
		case st.fileBased() && !strings.HasSuffix(vol, ".qcow2"):
			return false
		}
	}
	return true
}

// withConfigLock runs fn holding the VM's config lock (waiting up to
// 10 s, as lock_config does) and s.mu.
func (s *Server) withConfigLock(ctx context.Context, node string, vmid int, fn func() error) error {
	release, err := s.lockConfig(ctx, node, vmid, false, configLockTimeout)
	if err != nil {
		return err
	}
	defer release()
	s.mu.Lock()
	defer s.mu.Unlock()
	return fn()
}

// pause is a part of a task's time, cut short when the simulator closes.
func (s *Server) pause(d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-s.ctx.Done():
		return errors.New("interrupted by signal")
	}
}

// snapshotVM finds the VM of a snapshot task again. Call with s.mu held.
func (s *Server) snapshotVM(node string, vmid int) (*vm, error) {
	v, ok := s.vms[vmid]
	if !ok || v.node != node || v.ct {
		return nil, fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
	}
	return v, nil
}

// GET .../snapshot: the snapshots, then "current" (the VM as it is).
func hSnapshotList(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, name := range v.snapshotNames() {
		sn := v.snapshots[name]
		item := map[string]any{"name": name, "snaptime": sn.snaptime, "vmstate": b2i(sn.vmstate), "description": sn.description}
		if p := sn.conf["parent"]; p != "" {
			item["parent"] = p
		}
		if sn.snapstate != "" {
			item["snapstate"] = sn.snapstate
		}
		out = append(out, item)
	}
	current := map[string]any{"name": "current", "digest": v.digest(), "running": b2i(v.status == "running"),
		"description": "You are here!"}
	if p := v.conf["parent"]; p != "" {
		current["parent"] = p
	}
	return append(out, current), nil
}

// POST .../snapshot: a qmsnapshot task. It prepares under the config
// lock (the VM is locked "snapshot" and the snapshot is in state
// prepare), snapshots the disks, and commits under the lock again (the
// VM's parent is now the new snapshot).
func hSnapshotCreate(c *call) (any, error) {
	s := c.s
	name := c.str("snapname")
	if name == "current" {
		return nil, dieErr("unable to use snapshot name 'current' (reserved name)")
	}
	if strings.ToLower(name) == "pending" {
		return nil, dieErr("unable to use snapshot name 'pending' (reserved name)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	withRAM, desc := c.boolOr("vmstate", false), c.str("description")
	zero := time.Duration(0)
	return s.runTask(c, taskSpec{node: node, typ: "qmsnapshot", id: strconv.Itoa(vmid), delay: &zero,
		work: func(t *task) error {
			var volumes []string
			var g *guest
			freeze, paused := false, false
			err := s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.isTemplate() {
					return errors.New("you can't take a snapshot if it's a template")
				}
				if err := v.checkLock(); err != nil {
					return err
				}
				if _, used := v.snapshots[name]; used {
					return fmt.Errorf("snapshot name '%s' already used", name)
				}
				if !s.canSnapshot(v) {
					return errors.New("snapshot feature is not available")
				}
				for _, sn := range v.snapshots {
					if sn.conf["parent"] == name {
						delete(sn.conf, "parent")
					}
				}
				if v.snapshots == nil {
					v.snapshots = map[string]*snapshot{}
				}
				s.snapSeq++
				v.snapshots[name] = &snapshot{conf: copyConfig(v.conf), snaptime: time.Now().Unix(), seq: s.snapSeq,
					description: desc, vmstate: withRAM && v.status == "running", snapstate: "prepare"}
				v.conf["lock"] = "snapshot"
				for _, k := range v.disks() {
					volumes = append(volumes, volumeID(v.conf[k]))
				}
				if v.status == "running" {
					g, paused = v.guest, v.paused
					freeze = !withRAM && v.fsFreeze()
				}
				return nil
			})
			if err != nil {
				return err
			}
			if err := s.pause(s.taskDelay("qmsnapshot")); err != nil {
				return err
			}
			if err := s.snapshotDisk(t, vmid, name, g, freeze, paused); err != nil {
				return err
			}
			return s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.conf["lock"] != "snapshot" {
					return errors.New("missing snapshot lock")
				}
				sn := v.snapshots[name]
				if sn == nil {
					return fmt.Errorf("snapshot '%s' does not exist", name)
				}
				if sn.snapstate != "prepare" {
					return errors.New("wrong snapshot state")
				}
				for _, vol := range volumes {
					sid, vname, _ := strings.Cut(vol, ":")
					if st := s.storage(sid); st != nil && st.typ == "lvmthin" {
						if i := strings.LastIndexByte(vname, '/'); i >= 0 {
							vname = vname[i+1:]
						}
						t.logf("  Logical volume \"snap_%s_%s\" created.", vname, name)
					}
				}
				sn.snapstate = ""
				delete(v.conf, "lock")
				v.conf["parent"] = name
				return nil
			})
		}}), nil
}

// POST .../snapshot/{snapname}/rollback: a qmrollback task. Under the
// config lock it checks the snapshot (complete, and on ZFS the most
// recent: pve-storage ZFSPoolPlugin volume_rollback_is_possible), stops
// the VM and locks it "rollback"; then it rolls the disks back and, under
// the lock again, makes the snapshot's config the VM's (description and
// unused disks stay; a vmgenid is new: QemuConfig __snapshot_rollback_hook),
// with the snapshot as parent, and its disk the snapshot's (vmdisk.go). A
// snapshot with RAM, or start, boots the VM: pve-guest-common
// src/PVE/AbstractConfig.pm snapshot_rollback stops a running VM
// (__snapshot_rollback_vm_stop) and starts it again only for a snapshot
// with vmstate; qemu-server src/PVE/API2/Qemu.pm rollback starts it for
// start=1.
func hSnapshotRollback(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	vmid, node, name := v.vmid, v.node, c.str("snapname")
	start := c.boolOr("start", false)
	if start {
		// vm_start runs inside the worker, past its own permission check.
		if err := s.access.check(c.authid, "/vms/"+strconv.Itoa(vmid), "VM.PowerMgmt"); err != nil {
			return nil, err
		}
	}
	zero := time.Duration(0)
	return s.runTask(c, taskSpec{node: node, typ: "qmrollback", id: strconv.Itoa(vmid), delay: &zero,
		work: func(t *task) error {
			var sn *snapshot
			var g *guest
			err := s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.isTemplate() {
					return errors.New("you can't rollback if vm is a template")
				}
				if sn = v.snapshots[name]; sn == nil {
					return fmt.Errorf("snapshot '%s' does not exist", name)
				}
				if err := s.rollbackPossible(v, name); err != nil {
					return err
				}
				if sn.snapstate != "" {
					return fmt.Errorf("unable to rollback to incomplete snapshot (snapstate = %s)", sn.snapstate)
				}
				if err := v.checkLock(); err != nil {
					return err
				}
				if v.status == "running" {
					g = s.halt(v)
				}
				v.conf["lock"] = "rollback"
				return nil
			})
			s.destroyGuest(g)
			if err != nil {
				return err
			}
			if err := s.pause(s.taskDelay("qmrollback")); err != nil {
				return err
			}
			if err := s.rollbackDisk(vmid, name); err != nil {
				return err
			}
			boot := false
			err = s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.conf["lock"] != "rollback" {
					return errors.New("got wrong lock")
				}
				if sn = v.snapshots[name]; sn == nil {
					return fmt.Errorf("snapshot '%s' does not exist", name)
				}
				v.conf = rolledBack(v.conf, sn.conf)
				v.conf["parent"] = name
				// The new config is made afresh: pending changes are gone.
				v.pending, v.pendingDelete = nil, nil
				boot = sn.vmstate || start
				return nil
			})
			if err != nil || !boot {
				return err
			}
			return s.startVM(t, vmid, node)
		}}), nil
}

// rolledBack is __snapshot_apply_config plus what a rollback adds: the
// current description and unused disks stay, the snapshot's config comes
// back, volumes the snapshot does not use become unused disks
// (__snapshot_rollback_get_unused), and a vmgenid is made anew.
func rolledBack(cur, snap map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range cur {
		if k == "description" || strings.HasPrefix(k, "unused") {
			out[k] = v
		}
	}
	maps.Copy(out, copyConfig(snap))
	inSnap := map[string]bool{}
	for k, drive := range snap {
		if diskKeyRe().MatchString(k) && !isCDROM(drive) {
			inSnap[volumeID(drive)] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(cur)) {
		if !diskKeyRe().MatchString(k) || isCDROM(cur[k]) || inSnap[volumeID(cur[k])] {
			continue
		}
		for i := 0; ; i++ {
			if _, taken := out["unused"+strconv.Itoa(i)]; !taken {
				out["unused"+strconv.Itoa(i)] = volumeID(cur[k])
				break
			}
		}
	}
	if _, ok := out["vmgenid"]; ok {
		out["vmgenid"] = uuid()
	}
	return out
}

// rollbackPossible is volume_rollback_is_possible for each disk: ZFS
// rolls back only to the most recent snapshot of a volume. Call with
// s.mu held.
func (s *Server) rollbackPossible(v *vm, name string) error {
	sn := v.snapshots[name]
	for _, k := range slices.Sorted(maps.Keys(sn.conf)) {
		drive := sn.conf[k]
		if !diskKeyRe().MatchString(k) || isCDROM(drive) {
			continue
		}
		vol := volumeID(drive)
		st := s.storage(storageOf(vol))
		if st == nil || st.typ != "zfspool" {
			continue
		}
		for other, o := range v.snapshots {
			if other != name && o.seq > sn.seq && volumeID(o.conf[k]) == vol {
				return fmt.Errorf("can't rollback, '%s' is not most recent snapshot on '%s'", name, vol)
			}
		}
	}
	return nil
}

// DELETE .../snapshot/{snapname}: a qmdelsnapshot task; even an unknown
// VM or snapshot fails in the task, not the request (qemu-server forks
// before it loads anything). The VM is locked "snapshot-delete" while the
// disks' snapshots go; then the snapshot leaves the config and its
// children (and the VM, if it was its parent) get its parent.
func hSnapshotDelete(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	vmid, node, name := c.int("vmid"), c.str("node"), c.str("snapname")
	zero := time.Duration(0)
	return s.runTask(c, taskSpec{node: node, typ: "qmdelsnapshot", id: strconv.Itoa(vmid), delay: &zero,
		work: func(t *task) error {
			// set_lock: under the config lock, check and lock.
			err := s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.snapshots[name] == nil {
					return fmt.Errorf("snapshot '%s' does not exist", name)
				}
				if err := v.checkLock(); err != nil {
					return err
				}
				if v.isTemplate() {
					return errors.New("you can't delete a snapshot if vm is a template")
				}
				v.conf["lock"] = "snapshot-delete"
				v.snapshots[name].snapstate = "delete"
				return nil
			})
			if err != nil {
				return err
			}
			if err := s.pause(s.taskDelay("qmdelsnapshot")); err != nil {
				return err
			}
			return s.withConfigLock(s.ctx, node, vmid, func() error {
				v, err := s.snapshotVM(node, vmid)
				if err != nil {
					return err
				}
				if v.conf["lock"] != "snapshot-delete" {
					return errors.New("encountered invalid lock, expected 'snapshot-delete'")
				}
				sn := v.snapshots[name]
				if sn == nil {
					return fmt.Errorf("snapshot '%s' does not exist", name)
				}
				relink := func(conf map[string]string) {
					if conf["parent"] != name {
						return
					}
					if p := sn.conf["parent"]; p != "" {
						conf["parent"] = p
					} else {
						delete(conf, "parent")
					}
				}
				relink(v.conf)
				for other, o := range v.snapshots {
					if other != name {
						relink(o.conf)
					}
				}
				delete(v.snapshots, name)
				delete(v.conf, "lock")
				s.dropSnapshotDisk(vmid, name)
				return nil
			})
		}}), nil
}
