package pvesim

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// StorageSpec is a storage of the cluster (an entry of storage.cfg). A
// local storage exists once per node (each node has its own local-lvm); a
// shared one is the same on every node.
type StorageSpec struct {
	ID string
	// Type is the storage plugin: dir, lvmthin, lvm, zfspool, nfs, cifs
	// or rbd.
	Type string
	// Shared marks a storage every node reaches. nfs, cifs and rbd are
	// always shared (pve-storage Plugin.pm @SHARED_STORAGE); for dir and
	// lvm it is the administrator's "shared 1" (a cluster file system, an
	// iSCSI/FC LUN).
	Shared bool
	// Content is what it may hold; default per type ("images,rootdir" for
	// the block storages, "images" for nfs/cifs/rbd, "iso,vztmpl,backup"
	// for dir).
	Content string
	// SizeBytes is its capacity (per node for a local storage); default
	// 800 GiB (100 GiB for dir).
	SizeBytes int64
}

// DefaultStorages are a default PVE install's: "local" (a directory for
// ISOs, templates and backups) and "local-lvm" (LVM-thin for VM disks),
// both local to each node.
func DefaultStorages() []StorageSpec {
	return []StorageSpec{
		{ID: "local", Type: "dir", Content: "iso,vztmpl,backup", SizeBytes: 100 << 30},
		{ID: "local-lvm", Type: "lvmthin", Content: "rootdir,images", SizeBytes: 800 << 30},
	}
}

// SharedStorage is a shared Ceph RBD storage for VM disks, as a test or
// `delegate pve-sim --shared-storage` adds it: templates on it can be
// cloned to every node.
func SharedStorage(id string) StorageSpec {
	return StorageSpec{ID: id, Type: "rbd", Shared: true, Content: "images", SizeBytes: 4 << 40}
}

type storage struct {
	id, typ, content string
	shared           bool
	size             int64
	// offline: it does not answer (an NFS server down, a lost iSCSI
	// target): PVE's activate_storage fails "storage 'x' is not online".
	offline bool
}

func newStorage(spec StorageSpec) (*storage, error) {
	if err := formats["pve-storage-id"](spec.ID); err != nil {
		return nil, fmt.Errorf("pvesim: storage %q: %s", spec.ID, strings.TrimSpace(err.Error()))
	}
	st := &storage{id: spec.ID, typ: spec.Type, content: spec.Content, shared: spec.Shared, size: spec.SizeBytes}
	switch spec.Type {
	case "nfs", "cifs", "rbd":
		st.shared = true
		if st.content == "" {
			st.content = "images"
		}
	case "dir":
		if st.content == "" {
			st.content = "iso,vztmpl,backup"
		}
	case "lvmthin", "lvm", "zfspool":
		if st.content == "" {
			st.content = "rootdir,images"
		}
	default:
		return nil, fmt.Errorf("pvesim: storage %s: type %q is not simulated (dir, lvmthin, lvm, zfspool, nfs, cifs, rbd)", spec.ID, spec.Type)
	}
	if st.size <= 0 {
		st.size = 800 << 30
		if st.typ == "dir" {
			st.size = 100 << 30
		}
	}
	return st, nil
}

func (st *storage) hasContent(c string) bool {
	for _, x := range splitList(st.content) {
		if x == c {
			return true
		}
	}
	return false
}

// fileBased storages keep images as files in <vmid>/ directories.
func (st *storage) fileBased() bool {
	return st.typ == "dir" || st.typ == "nfs" || st.typ == "cifs"
}

// canTemplate: the plugin has the "template" feature (LVMPlugin has not:
// "qm template" refuses a VM with a disk there).
func (st *storage) canTemplate() bool { return st.typ != "lvm" }

// canLinkClone is volume_has_feature($cfg, 'clone', $volid): only base
// volumes (of templates) can be linked-cloned, and never on thick LVM
// (pve-storage src/PVE/Storage/{Plugin,LvmThinPlugin,LVMPlugin,
// RBDPlugin,ZFSPoolPlugin}.pm).
func (st *storage) canLinkClone(vol volume) bool {
	return vol.isBase && !vol.linked && st.typ != "lvm"
}

// volume is a parsed volume name (the part of a volume id after
// "storage:").
type volume struct {
	isBase bool   // base-<vmid>-disk-N: a template's disk
	linked bool   // a linked clone's disk, made from base
	base   string // the base volume's name, for a linked clone
}

var (
	blockVolRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^((?:base|vm)-\d+-disk-\d+)(?:/((?:base|vm)-\d+-disk-\d+))?$`)
	})
	fileVolRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(\d+/(?:base|vm)-\d+-disk-\d+\.(?:raw|qcow2|vmdk))(?:/(\d+/(?:base|vm)-\d+-disk-\d+\.(?:raw|qcow2|vmdk)))?$`)
	})
)

// parseVolname is the plugins' parse_volname, for the names the simulator
// makes.
func parseVolname(name string) volume {
	for _, re := range []*regexp.Regexp{blockVolRe(), fileVolRe()} {
		if m := re.FindStringSubmatch(name); m != nil {
			if m[2] != "" {
				return volume{linked: true, base: m[1]}
			}
			last := m[1][strings.LastIndexByte(m[1], '/')+1:]
			return volume{isBase: strings.HasPrefix(last, "base-")}
		}
	}
	return volume{}
}

// volName names a new volume of a VM on a storage: a template's base
// volume, a full copy, or a linked clone of base.
func (st *storage) volName(kind string, vmid, disk int, base string) string {
	if st.fileBased() {
		switch kind {
		case "base":
			return fmt.Sprintf("%d/base-%d-disk-%d.qcow2", vmid, vmid, disk)
		case "linked":
			return fmt.Sprintf("%s/%d/vm-%d-disk-%d.qcow2", base, vmid, vmid, disk)
		}
		return fmt.Sprintf("%d/vm-%d-disk-%d.qcow2", vmid, vmid, disk)
	}
	switch kind {
	case "base":
		return fmt.Sprintf("base-%d-disk-%d", vmid, disk)
	case "linked":
		return fmt.Sprintf("%s/vm-%d-disk-%d", base, vmid, disk)
	}
	return fmt.Sprintf("vm-%d-disk-%d", vmid, disk)
}

// storage finds a storage by id. Call with s.mu held, or after New.
func (s *Server) storage(id string) *storage {
	for _, st := range s.storages {
		if st.id == id {
			return st
		}
	}
	return nil
}

// storageUsed is what the volumes on a storage take (on node, for a local
// one): base and full volumes at their size, linked clones nothing (they
// share their base's blocks). Call with s.mu held.
func (s *Server) storageUsed(st *storage, node string) int64 {
	var used int64
	for _, v := range s.vms {
		if !st.shared && v.node != node {
			continue
		}
		for _, k := range v.disks() {
			sid, name, _ := strings.Cut(volumeID(v.conf[k]), ":")
			if sid == st.id && !parseVolname(name).linked {
				used += diskSize(v.conf[k])
			}
		}
	}
	return used
}

// storageConfig is an entry of GET /storage (pve-storage
// src/PVE/API2/Storage/Config.pm $api_storage_config).
func (s *Server) storageConfig(st *storage) map[string]any {
	e := map[string]any{"storage": st.id, "type": st.typ, "content": st.content, "digest": s.storageDigest}
	if st.shared {
		e["shared"] = 1
	}
	switch st.typ {
	case "dir":
		e["path"] = "/var/lib/vz"
		if st.id != "local" {
			e["path"] = "/mnt/" + st.id
		}
	case "lvmthin":
		e["thinpool"], e["vgname"] = "data", "pve"
	case "lvm":
		e["vgname"] = st.id
	case "zfspool":
		e["pool"] = "rpool/data"
	case "nfs", "cifs":
		e["path"], e["server"] = "/mnt/pve/"+st.id, "10.0.0.10"
		if st.typ == "nfs" {
			e["export"] = "/export/" + st.id
		} else {
			e["share"] = st.id
		}
	case "rbd":
		e["pool"], e["krbd"] = st.id, 0
	}
	return e
}

// canSeeStorage: GET /storage and GET /nodes/{node}/storage list the
// storages the caller has Datastore.Audit or Datastore.AllocateSpace on.
// Call with s.mu held.
func (c *call) canSeeStorage(st *storage) bool {
	return c.s.access.checkAny(c.authid, "/storage/"+st.id, "Datastore.Audit", "Datastore.AllocateSpace") == nil
}

// GET /storage
func hStorageIndex(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, st := range s.storages {
		if c.canSeeStorage(st) && (!c.has("type") || c.str("type") == st.typ) {
			out = append(out, s.storageConfig(st))
		}
	}
	return out, nil
}

// GET /nodes/{node}/storage: each storage's status on the node
// (pve-storage src/PVE/API2/Storage/Status.pm index).
func hNodeStorage(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	node := c.str("node")
	out := []map[string]any{}
	for _, st := range s.storages {
		if !c.canSeeStorage(st) || (c.has("storage") && c.str("storage") != st.id) {
			continue
		}
		if c.has("content") {
			ok := true
			for _, want := range splitList(c.str("content")) {
				ok = ok && st.hasContent(want)
			}
			if !ok {
				continue
			}
		}
		used := s.storageUsed(st, node)
		out = append(out, map[string]any{
			"storage": st.id, "type": st.typ, "content": st.content, "shared": b2i(st.shared),
			"active": 1, "enabled": 1, "total": st.size, "used": used, "avail": st.size - used,
			"used_fraction": float64(used) / float64(st.size),
		})
	}
	return out, nil
}

// storageEntry is a storage in /cluster/resources (pve-manager
// PVE/API2Tools.pm extract_storage_stats). Call with s.mu held.
func (s *Server) storageEntry(st *storage, node string) map[string]any {
	e := map[string]any{"id": "storage/" + node + "/" + st.id, "type": "storage", "storage": st.id,
		"node": node, "plugintype": st.typ, "content": st.content, "shared": b2i(st.shared), "status": "unknown"}
	if !s.faults.offline(node) && !st.offline {
		e["status"], e["disk"], e["maxdisk"] = "available", s.storageUsed(st, node), st.size
	}
	return e
}

// SetStorageOnline takes a storage offline (or back): its status is
// unknown, and what needs it active fails "storage 'x' is not online"
// (pve-storage src/PVE/Storage.pm activate_storage).
func (s *Server) SetStorageOnline(id string, online bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storage(id)
	if st == nil {
		return fmt.Errorf("pvesim: no storage %q", id)
	}
	st.offline = !online
	return nil
}
