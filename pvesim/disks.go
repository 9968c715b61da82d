package pvesim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DELETE .../{vmid}: refused at once while running or protected; a
// qmdestroy task otherwise.
func hDelete(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVMToChange()
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	if v.conf["protection"] == "1" {
		return nil, dieErr("can't remove VM %d - protection mode enabled", vmid)
	}
	if v.status == "running" {
		return nil, dieErr("VM %d is running - destroy failed", vmid)
	}
	return s.runTask(c, taskSpec{node: node, typ: "qmdestroy", id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node {
				return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
			}
			if err := v.checkLock(); err != nil {
				return err
			}
			if v.status == "running" {
				return fmt.Errorf("VM %d is running - destroy failed", vmid)
			}
			for _, k := range v.disks() {
				vol := volumeID(v.conf[k])
				for _, other := range s.vms {
					for _, ok := range other.disks() {
						if base, linked := baseVolume(volumeID(other.conf[ok])); linked && base == vol {
							return fmt.Errorf("base volume '%s' is still in use by linked cloned", vol)
						}
					}
				}
			}
			if c.boolOr("destroy-unreferenced-disks", false) {
				// destroy_vm frees the VM's own disks first, then lists
				// every storage for disks of its vmid (pve-storage
				// vdisk_list activates each): one that is offline fails the
				// task, and so will every retry (qemu-server
				// src/PVE/QemuServer.pm destroy_vm).
				for _, st := range s.storages {
					if st.offline && (st.hasContent("images") || st.hasContent("rootdir")) {
						return fmt.Errorf("storage '%s' is not online", st.id)
					}
				}
			}
			for _, k := range v.disks() {
				sid, name, _ := strings.Cut(volumeID(v.conf[k]), ":")
				if st := s.storage(sid); st == nil || (st.typ != "lvm" && st.typ != "lvmthin") {
					continue
				}
				if i := strings.LastIndexByte(name, '/'); i >= 0 {
					name = name[i+1:]
				}
				t.logf("  Logical volume \"%s\" successfully removed.", name)
			}
			delete(s.vms, vmid)
			s.dropDisks(vmid)
			s.access.dropVM(vmid)
			return nil
		}}), nil
}

// PUT .../resize: a resize task; disks grow, never shrink.
func hResize(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVMToChange()
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	disk, size, digest := c.str("disk"), c.str("size"), c.str("digest")
	return s.runTask(c, taskSpec{node: node, typ: "resize", id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node {
				return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
			}
			if digest != "" && digest != v.digest() {
				return errors.New("checksum mismatch (file change by other user?)")
			}
			if err := v.checkLock(); err != nil {
				return err
			}
			drive, ok := v.conf[disk]
			if !ok {
				return fmt.Errorf("disk '%s' does not exist", disk)
			}
			if isCDROM(drive) {
				return errors.New("you can't resize a cdrom")
			}
			// qemu-server resize_vm: growing a disk allocates on its storage.
			if err := c.s.access.check(c.authid, "/storage/"+storageOf(volumeID(drive)), "Datastore.AllocateSpace"); err != nil {
				return err
			}
			old := diskSize(drive)
			grow := strings.HasPrefix(size, "+")
			n, _ := parseSize(strings.TrimPrefix(size, "+"))
			newSize := n
			if grow {
				newSize = old + n
			}
			if newSize < old {
				return errors.New("shrinking disks is not supported")
			}
			t.logf("  Size of logical volume changed from %s to %s.", formatSize(old), formatSize(newSize))
			v.conf[disk] = withSize(drive, newSize)
			return nil
		}}), nil
}
