package pvesim

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Storage content (pve-storage src/PVE/API2/Storage/Content.pm index,
// src/PVE/Storage.pm volume_list and check_volume_access,
// src/PVE/Storage/Plugin.pm list_volumes): the guests' disks, and the
// files an administrator put there (ISO images, container templates,
// backups: AddVolume).

// storageFile is a file volume (iso, vztmpl, backup) on a storage.
type storageFile struct {
	node    string // "" on a shared storage
	volid   string // local:iso/debian.iso
	content string // iso, vztmpl, backup
	size    int64
	ctime   int64
}

var fileVolumeRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9\-_.]*[a-zA-Z0-9]):(iso|vztmpl|backup)/([^/\s]+)$`)
})

// AddVolume puts a file on a storage, as an upload or vzdump would: volid
// is "storage:iso/name.iso", "storage:vztmpl/name.tar.zst" or
// "storage:backup/vzdump-qemu-100-....vma.zst". The storage must hold that
// content; on a local storage the file is on node only.
func (s *Server) AddVolume(node, volid string, size int64) error {
	m := fileVolumeRe().FindStringSubmatch(volid)
	if m == nil {
		return fmt.Errorf("pvesim: volume %q is not storage:iso|vztmpl|backup/name", volid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storage(m[1])
	switch {
	case st == nil:
		return fmt.Errorf("pvesim: no storage %q", m[1])
	case !st.hasContent(m[2]):
		return fmt.Errorf("pvesim: storage %s does not hold %s (content %s)", st.id, m[2], st.content)
	case s.node(node) == nil:
		return fmt.Errorf("pvesim: no node %q", node)
	}
	f := storageFile{node: node, volid: volid, content: m[2], size: size, ctime: time.Now().Unix()}
	if st.shared {
		f.node = ""
	}
	s.files = append(s.files, f)
	return nil
}

// validContent is what a dir storage may hold (pve-storage Plugin.pm
// verify_content: "dir includes all other types"), and import.
var validContent = []string{"images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import"}

// fileFormat is the format list_volumes gives a file: iso, "t"+extension
// for a template archive (tzst, tgz...), the archive's extension for a
// backup (vma.zst, tar.zst...).
func fileFormat(content, name string) string {
	switch content {
	case "iso":
		return "iso"
	case "vztmpl":
		if i := strings.LastIndex(name, ".tar."); i >= 0 {
			return "t" + name[i+len(".tar."):]
		}
		return "tgz"
	}
	for _, ext := range []string{".vma.", ".tar.", ".tgz"} {
		if i := strings.Index(name, ext); i >= 0 {
			return strings.TrimPrefix(name[i:], ".")
		}
	}
	return "raw"
}

// volumeOwner is the vmid a volume name belongs to (the last part of
// base-9000-disk-0/vm-101-disk-0 is 101's).
var volumeOwnerRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?:^|/)(?:base|vm)-(\d+)-disk-\d+(?:\.\w+)?$`) })

// GET /nodes/{node}/storage/{storage}/content: the volumes the caller may
// see, sorted by volid: Datastore.Allocate sees all; ISO images and
// templates need Datastore.AllocateSpace or Datastore.Audit; a guest's
// disk Datastore.Audit and VM.Config.Disk on the guest; a backup
// Datastore.AllocateSpace and VM.Backup (check_volume_access).
func hStorageContent(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	node, sid := c.str("node"), c.str("storage")
	st := s.storage(sid)
	if st == nil {
		return nil, dieErr("storage '%s' does not exist", sid)
	}
	types := validContent
	if c.has("content") {
		types = []string{c.str("content")}
	}
	uc := s.access
	allowed := func(content string, owner int) bool {
		if uc.check(c.authid, "/storage/"+sid, "Datastore.Allocate") == nil {
			return true
		}
		switch {
		case content == "iso" || content == "vztmpl":
			return uc.checkAny(c.authid, "/storage/"+sid, "Datastore.AllocateSpace", "Datastore.Audit") == nil
		case content == "backup" && owner > 0:
			return uc.check(c.authid, "/storage/"+sid, "Datastore.AllocateSpace") == nil &&
				uc.check(c.authid, "/vms/"+strconv.Itoa(owner), "VM.Backup") == nil
		case (content == "images" || content == "rootdir") && owner > 0:
			return uc.check(c.authid, "/storage/"+sid, "Datastore.Audit") == nil &&
				uc.check(c.authid, "/vms/"+strconv.Itoa(owner), "VM.Config.Disk") == nil
		}
		return false
	}
	vmidFilter := 0
	if c.has("vmid") {
		vmidFilter = c.int("vmid")
	}
	out := []map[string]any{}
	for _, content := range types {
		if !st.hasContent(content) {
			continue
		}
		switch content {
		case "images", "rootdir":
			for _, v := range s.vms {
				if (!st.shared && v.node != node) || (content == "rootdir") != v.ct {
					continue
				}
				for _, k := range slices.Sorted(maps.Keys(v.conf)) {
					if !(diskKeyRe().MatchString(k) || ctVolumeKeyRe().MatchString(k) || strings.HasPrefix(k, "unused")) || isCDROM(v.conf[k]) {
						continue
					}
					vol := volumeID(v.conf[k])
					vsid, name, _ := strings.Cut(vol, ":")
					m := volumeOwnerRe().FindStringSubmatch(name)
					if vsid != sid || m == nil {
						continue
					}
					owner, _ := strconv.Atoi(m[1])
					if (vmidFilter != 0 && owner != vmidFilter) || !allowed(content, owner) {
						continue
					}
					format := "raw"
					if st.fileBased() {
						format = "qcow2"
					}
					size := diskSize(v.conf[k])
					e := map[string]any{"volid": vol, "format": format, "size": size, "vmid": owner, "content": content}
					if st.typ != "lvm" {
						e["used"] = size / 10 // thin: what the guest wrote so far
					}
					out = append(out, e)
				}
			}
		default:
			for _, f := range s.files {
				if f.content != content || storageOf(f.volid) != sid || (f.node != "" && f.node != node) {
					continue
				}
				owner := 0
				if m := backupOwnerRe().FindStringSubmatch(f.volid); m != nil {
					owner, _ = strconv.Atoi(m[1])
				}
				if (vmidFilter != 0 && owner != vmidFilter) || !allowed(content, owner) {
					continue
				}
				_, name, _ := strings.Cut(f.volid, "/")
				e := map[string]any{"volid": f.volid, "format": fileFormat(content, name), "size": f.size,
					"ctime": f.ctime, "content": content}
				if owner > 0 {
					e["vmid"] = owner
				}
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b map[string]any) int {
		return strings.Compare(strings.ToLower(a["volid"].(string)), strings.ToLower(b["volid"].(string)))
	})
	return out, nil
}

var backupOwnerRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`/vzdump-(?:qemu|lxc|openvz)-(\d+)-`) })

// GET /cluster/status (pve-manager PVE/API2/Cluster.pm get_status): with
// more than one node, the cluster (its name, node count, config version,
// quorum: more than half the votes online) and each node (id, whether
// it is the one answering, online, subscription level); a lone node is
// one entry with nodeid 0.
func hClusterStatus(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	nodeIP := func(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }
	if len(s.nodes) == 1 {
		n := s.nodes[0]
		return []map[string]any{{"type": "node", "id": "node/" + n.name, "name": n.name, "ip": nodeIP(0),
			"local": 1, "nodeid": 0, "online": 1, "level": ""}}, nil
	}
	online := 0
	var nodes []map[string]any
	for i, n := range s.nodes {
		up := !s.faults.offline(n.name)
		if up {
			online++
		}
		nodes = append(nodes, map[string]any{"type": "node", "id": "node/" + n.name, "name": n.name, "ip": nodeIP(i),
			"nodeid": i + 1, "local": b2i(i == 0), "online": b2i(up), "level": ""})
	}
	out := []map[string]any{{"type": "cluster", "id": "cluster", "name": s.opts.ClusterName, "nodes": len(s.nodes),
		"version": len(s.nodes), "quorate": b2i(online*2 > len(s.nodes))}}
	return append(out, nodes...), nil
}
