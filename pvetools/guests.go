package pvetools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// NoArgs is the input of a tool that takes none.
type NoArgs struct{}

// NodeOut is a cluster node.
type NodeOut struct {
	Node   string  `json:"node"`
	Status string  `json:"status"`
	CPU    float64 `json:"cpu"`
	MaxCPU int     `json:"maxcpu"`
	Mem    int64   `json:"mem"`
	MaxMem int64   `json:"maxmem"`
	Uptime int64   `json:"uptime"`
}

// NodesOut lists the nodes.
type NodesOut struct {
	Nodes []NodeOut `json:"nodes"`
}

func (t *tools) getNodes(ctx context.Context, _ *NoArgs) (NodesOut, error) {
	nodes, err := t.c.Nodes(ctx)
	if err != nil {
		return NodesOut{}, proxmoxError(err)
	}
	out := NodesOut{Nodes: []NodeOut{}}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, NodeOut{Node: n.Node, Status: n.Status, CPU: float64(n.CPU), MaxCPU: int(n.MaxCPU),
			Mem: int64(n.Mem), MaxMem: int64(n.MaxMem), Uptime: int64(n.Uptime)})
	}
	slices.SortFunc(out.Nodes, func(a, b NodeOut) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

// ListIn selects guests.
type ListIn struct {
	Node string `json:"node,omitempty" jsonschema:"default: every node"`
	Type string `json:"type,omitempty" jsonschema:"default both"`
}

// GuestOut is a guest in a list.
type GuestOut struct {
	VMID     int     `json:"vmid"`
	Name     string  `json:"name,omitempty"`
	Node     string  `json:"node"`
	Type     string  `json:"type"`
	Status   string  `json:"status"`
	Template bool    `json:"template,omitempty"`
	Lock     string  `json:"lock,omitempty"`
	Tags     string  `json:"tags,omitempty"`
	CPUs     float64 `json:"cpus"`
	Mem      int64   `json:"mem"`
	MaxMem   int64   `json:"maxmem"`
	MaxDisk  int64   `json:"maxdisk"`
	Uptime   int64   `json:"uptime"`
}

// GuestsOut lists guests.
type GuestsOut struct {
	Guests []GuestOut `json:"guests"`
}

// listGuests asks the node itself when one is named (its answer is live),
// else the cluster's resource list (pvestatd's figures, up to 10 s old).
func (t *tools) listGuests(ctx context.Context, in *ListIn) (GuestsOut, error) {
	if err := checkNode(in.Node, true); err != nil {
		return GuestsOut{}, err
	}
	types := []pve.GuestType{pve.QEMU, pve.LXC}
	if in.Type != "" {
		typ, err := guestType(in.Type)
		if err != nil {
			return GuestsOut{}, err
		}
		types = []pve.GuestType{typ}
	}
	out := GuestsOut{Guests: []GuestOut{}}
	if in.Node != "" {
		for _, typ := range types {
			guests, err := t.c.Guests(ctx, in.Node, typ)
			if err != nil {
				return GuestsOut{}, proxmoxError(err)
			}
			for _, g := range guests {
				out.Guests = append(out.Guests, GuestOut{VMID: int(g.VMID), Name: g.Name, Node: in.Node, Type: string(typ),
					Status: g.Status, Template: bool(g.Template), Lock: g.Lock, Tags: g.Tags, CPUs: float64(g.CPUs),
					Mem: int64(g.Mem), MaxMem: int64(g.MaxMem), MaxDisk: int64(g.MaxDisk), Uptime: int64(g.Uptime)})
			}
		}
	} else {
		res, err := t.c.ClusterResources(ctx, pve.ResourceVM)
		if err != nil {
			return GuestsOut{}, proxmoxError(err)
		}
		for _, r := range res {
			if !slices.Contains(types, pve.GuestType(r.Type)) {
				continue
			}
			out.Guests = append(out.Guests, GuestOut{VMID: int(r.VMID), Name: r.Name, Node: r.Node, Type: r.Type,
				Status: r.Status, Template: bool(r.Template), Lock: r.Lock, Tags: r.Tags, CPUs: float64(r.MaxCPU),
				Mem: int64(r.Mem), MaxMem: int64(r.MaxMem), MaxDisk: int64(r.MaxDisk), Uptime: int64(r.Uptime)})
		}
	}
	slices.SortFunc(out.Guests, func(a, b GuestOut) int { return cmp.Compare(a.VMID, b.VMID) })
	return out, nil
}

// StatusOut is a guest's current state.
type StatusOut struct {
	VMID     int     `json:"vmid"`
	Node     string  `json:"node"`
	Type     string  `json:"type"`
	Name     string  `json:"name,omitempty"`
	Status   string  `json:"status"`
	QMP      string  `json:"qmpstatus,omitempty"`
	Lock     string  `json:"lock,omitempty"`
	Tags     string  `json:"tags,omitempty"`
	Template bool    `json:"template,omitempty"`
	Agent    bool    `json:"agent,omitempty"`
	CPUs     float64 `json:"cpus"`
	CPU      float64 `json:"cpu"`
	Mem      int64   `json:"mem"`
	MaxMem   int64   `json:"maxmem"`
	MaxDisk  int64   `json:"maxdisk"`
	Uptime   int64   `json:"uptime"`
	PID      int     `json:"pid,omitempty"`
}

func (t *tools) guestStatus(ctx context.Context, in *Guest) (StatusOut, error) {
	typ, err := in.check()
	if err != nil {
		return StatusOut{}, err
	}
	st, err := t.c.GuestStatus(ctx, in.Node, typ, in.VMID)
	if err != nil {
		return StatusOut{}, proxmoxError(err)
	}
	return StatusOut{VMID: in.VMID, Node: in.Node, Type: string(typ), Name: st.Name, Status: st.Status, QMP: st.QMPStatus,
		Lock: st.Lock, Tags: st.Tags, Template: bool(st.Template), Agent: bool(st.Agent), CPUs: float64(st.CPUs),
		Mem: int64(st.Mem), MaxMem: int64(st.MaxMem), MaxDisk: int64(st.MaxDisk), Uptime: int64(st.Uptime), PID: int(st.PID)}, nil
}

// ConfigOut is a guest's configuration.
type ConfigOut struct {
	VMID   int               `json:"vmid"`
	Node   string            `json:"node"`
	Type   string            `json:"type"`
	Digest string            `json:"digest"`
	Config map[string]string `json:"config"`
}

func (t *tools) guestConfig(ctx context.Context, in *Guest) (ConfigOut, error) {
	typ, err := in.check()
	if err != nil {
		return ConfigOut{}, err
	}
	conf, err := t.c.GuestConfig(ctx, in.Node, typ, in.VMID)
	if err != nil {
		return ConfigOut{}, proxmoxError(err)
	}
	digest := conf["digest"]
	delete(conf, "digest")
	return ConfigOut{VMID: in.VMID, Node: in.Node, Type: string(typ), Digest: digest, Config: conf}, nil
}

// VMIn names a VM (only VMs have pending changes).
type VMIn struct {
	Node string `json:"node"`
	VMID int    `json:"vmid"`
}

// PendingOut is what of a VM's config changes at its next start.
type PendingOut struct {
	VMID int    `json:"vmid"`
	Node string `json:"node"`
	// Changes are the options that change: their value now (running), the
	// one at the next start, or their removal then.
	Changes []PendingChange `json:"changes"`
}

// PendingChange is one option that changes at the next start.
type PendingChange struct {
	Option  string `json:"option"`
	Current string `json:"current,omitempty"`
	Next    string `json:"next,omitempty"`
	Removed bool   `json:"removed,omitempty"`
}

// guestPending reads GET .../pending: proxmox_guest_config shows the
// config with its pending changes applied (as Proxmox's GET config does),
// which is not what a running VM runs with.
func (t *tools) guestPending(ctx context.Context, in *VMIn) (PendingOut, error) {
	if err := checkNode(in.Node, false); err != nil {
		return PendingOut{}, err
	}
	if err := checkVMID("vmid", in.VMID); err != nil {
		return PendingOut{}, err
	}
	opts, err := t.c.Pending(ctx, in.Node, in.VMID)
	if err != nil {
		return PendingOut{}, proxmoxError(err)
	}
	out := PendingOut{VMID: in.VMID, Node: in.Node, Changes: []PendingChange{}}
	for _, o := range opts {
		if o.Changed() {
			out.Changes = append(out.Changes, PendingChange{Option: o.Key, Current: string(o.Value), Next: string(o.Pending), Removed: o.Delete > 0})
		}
	}
	return out, nil
}

// PowerIn names a guest to stop, reboot or delete.
type PowerIn struct {
	Node  string `json:"node"`
	VMID  int    `json:"vmid"`
	Type  string `json:"type,omitempty" jsonschema:"default qemu"`
	Force bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

func (in *PowerIn) guest() *Guest { return &Guest{Node: in.Node, VMID: in.VMID, Type: in.Type} }

// prepare checks a change of a guest: the setting, the arguments, and
// that no running job owns it unless force. Every tool that changes a
// guest, or runs anything in it, calls it: a job's VM is the job's.
func (t *tools) prepare(ctx context.Context, g *Guest, force bool, action string) (pve.GuestType, error) {
	if err := t.elevated(); err != nil {
		return "", err
	}
	typ, err := g.check()
	if err != nil {
		return "", err
	}
	if !force {
		if err := t.refuseJobVM(ctx, g.Node, typ, g.VMID, action); err != nil {
			return "", err
		}
	}
	return typ, nil
}

func (t *tools) start(ctx context.Context, in *PowerIn) (TaskOut, error) {
	deadline := t.deadline()
	typ, err := t.prepare(ctx, in.guest(), in.Force, "starting it")
	if err != nil {
		return TaskOut{}, err
	}
	upid, err := t.c.StartGuest(ctx, in.Node, typ, in.VMID)
	return t.started(ctx, in.Node, upid, err, deadline)
}

func (t *tools) stop(ctx context.Context, in *PowerIn) (TaskOut, error) {
	deadline := t.deadline()
	typ, err := t.prepare(ctx, in.guest(), in.Force, "stopping it")
	if err != nil {
		return TaskOut{}, err
	}
	upid, err := t.c.StopGuest(ctx, in.Node, typ, in.VMID)
	return t.started(ctx, in.Node, upid, err, deadline)
}

// ShutdownIn names a guest to shut down.
type ShutdownIn struct {
	Node      string `json:"node"`
	VMID      int    `json:"vmid"`
	Type      string `json:"type,omitempty" jsonschema:"default qemu"`
	Force     bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
	Timeout   int    `json:"timeout,omitempty" jsonschema:"seconds to wait for the guest"`
	ForceStop bool   `json:"forceStop,omitempty" jsonschema:"stop it if it does not shut down in time"`
}

func (t *tools) shutdown(ctx context.Context, in *ShutdownIn) (TaskOut, error) {
	deadline := t.deadline()
	typ, err := t.prepare(ctx, in.guest(), in.Force, "shutting it down")
	if err != nil {
		return TaskOut{}, err
	}
	if in.Timeout < 0 {
		return TaskOut{}, argErr("timeout", "must not be negative (got %d)", in.Timeout)
	}
	upid, err := t.c.ShutdownGuest(ctx, in.Node, typ, in.VMID,
		pve.ShutdownOptions{Timeout: time.Duration(in.Timeout) * time.Second, ForceStop: in.ForceStop})
	return t.started(ctx, in.Node, upid, err, deadline)
}

func (t *tools) reboot(ctx context.Context, in *PowerIn) (TaskOut, error) {
	deadline := t.deadline()
	typ, err := t.prepare(ctx, in.guest(), in.Force, "rebooting it")
	if err != nil {
		return TaskOut{}, err
	}
	upid, err := t.c.RebootGuest(ctx, in.Node, typ, in.VMID)
	return t.started(ctx, in.Node, upid, err, deadline)
}

func (in *ShutdownIn) guest() *Guest { return &Guest{Node: in.Node, VMID: in.VMID, Type: in.Type} }

// DeleteIn names a guest to destroy.
type DeleteIn struct {
	Node  string `json:"node"`
	VMID  int    `json:"vmid"`
	Type  string `json:"type,omitempty" jsonschema:"default qemu"`
	Force bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
	Purge bool   `json:"purge,omitempty" jsonschema:"also from backup, replication, HA jobs"`
}

func (in *DeleteIn) guest() *Guest { return &Guest{Node: in.Node, VMID: in.VMID, Type: in.Type} }

func (t *tools) delete(ctx context.Context, in *DeleteIn) (TaskOut, error) {
	deadline := t.deadline()
	typ, err := t.prepare(ctx, in.guest(), in.Force, "deleting it")
	if err != nil {
		return TaskOut{}, err
	}
	upid, err := t.c.DeleteGuest(ctx, in.Node, typ, in.VMID, pve.DeleteOptions{Purge: in.Purge})
	return t.started(ctx, in.Node, upid, err, deadline)
}

// CloneIn is a clone: Proxmox's parameters.
type CloneIn struct {
	Node   string `json:"node"`
	VMID   int    `json:"vmid" jsonschema:"the VM or template to clone"`
	NewID  int    `json:"newid,omitempty" jsonschema:"default: the next free id"`
	Name   string `json:"name,omitempty"`
	Full   *bool  `json:"full,omitempty" jsonschema:"full copy (default: linked for a template, full otherwise)"`
	Target string `json:"target,omitempty" jsonschema:"another node (needs shared storage)"`
	Force  bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns the VM"`
}

// cloneAttempts bounds the tries with ids chosen here: nextid reserves
// nothing, so a parallel clone can take the id first.
const cloneAttempts = 3

func (t *tools) clone(ctx context.Context, in *CloneIn) (TaskOut, error) {
	deadline := t.deadline()
	if err := t.elevated(); err != nil {
		return TaskOut{}, err
	}
	if err := checkNode(in.Node, false); err != nil {
		return TaskOut{}, err
	}
	if err := checkVMID("vmid", in.VMID); err != nil {
		return TaskOut{}, err
	}
	// A clone locks its source for as long as it copies: the job's own
	// calls on its VM would wait, or fail, meanwhile.
	if !in.Force {
		if err := t.refuseJobVM(ctx, in.Node, pve.QEMU, in.VMID, "cloning it"); err != nil {
			return TaskOut{}, err
		}
	}
	if in.NewID != 0 {
		if err := checkVMID("newid", in.NewID); err != nil {
			return TaskOut{}, err
		}
	}
	if in.Target != "" {
		if err := checkNode(in.Target, false); err != nil {
			return TaskOut{}, argErr("target", "must be a node name like pve2 (got %q)", in.Target)
		}
	}
	for attempt := 1; ; attempt++ {
		newid := in.NewID
		if newid == 0 {
			id, err := t.c.NextID(ctx)
			if err != nil {
				return TaskOut{}, proxmoxError(err)
			}
			newid = id
		}
		upid, err := t.c.CloneVM(ctx, in.Node, in.VMID, pve.CloneOptions{NewID: newid, Name: in.Name, Full: in.Full, Target: in.Target})
		var out TaskOut
		if err == nil {
			out, err = t.wait(ctx, in.Node, upid, deadline)
		} else {
			err = proxmoxError(err)
		}
		if err != nil && in.NewID == 0 && attempt < cloneAttempts && idTaken(err) && time.Now().Before(deadline) {
			t.log.Info("clone: the next id was taken meanwhile, trying another", "newid", newid, "err", err)
			continue
		}
		if err != nil {
			return TaskOut{}, err
		}
		out.VMID = newid
		return out, nil
	}
}

// idTaken: a clone lost its new id to another one (Proxmox's words for it:
// the config exists, its lock timed out, or pmxcfs refused the file).
func idTaken(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "config file already exists") || strings.Contains(msg, "lock-") && strings.Contains(msg, "got timeout") ||
		strings.Contains(msg, "failed: File exists")
}

// ConfigUpdateIn sets VM options.
type ConfigUpdateIn struct {
	Node   string                     `json:"node"`
	VMID   int                        `json:"vmid"`
	Config map[string]json.RawMessage `json:"config" jsonschema:"options by Proxmox name; delete and digest too"`
	Force  bool                       `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

// reservedOptions are parameters of the config call a tool sets itself
// or that a token may not use.
var reservedOptions = []string{"node", "vmid", "skiplock", "background_delay"}

func (t *tools) configUpdate(ctx context.Context, in *ConfigUpdateIn) (TaskOut, error) {
	deadline := t.deadline()
	if _, err := t.prepare(ctx, &Guest{Node: in.Node, VMID: in.VMID}, in.Force, "changing its configuration"); err != nil {
		return TaskOut{}, err
	}
	if len(in.Config) == 0 {
		return TaskOut{}, argErr("config", "must name at least one option, e.g. {\"cores\": 2}")
	}
	opts := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(in.Config)) {
		if k == "" || slices.Contains(reservedOptions, k) {
			return TaskOut{}, argErr("config."+k, "is not an option this tool sets (node and vmid are arguments of their own)")
		}
		v, err := optionText(in.Config[k])
		if err != nil {
			return TaskOut{}, argErr("config."+k, "%s", err)
		}
		opts[k] = v
	}
	upid, err := t.c.SetVMConfigAsync(ctx, in.Node, in.VMID, pve.VMConfigUpdate{Options: opts})
	return t.started(ctx, in.Node, upid, err, deadline)
}

// optionText turns a JSON value into the text Proxmox reads: strings as
// they are, numbers as written, booleans 1 or 0.
func optionText(raw json.RawMessage) (string, error) {
	var v any
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case bool:
		if x {
			return "1", nil
		}
		return "0", nil
	}
	return "", errors.New("must be a string, a number or true/false")
}

// ResizeIn grows a disk.
type ResizeIn struct {
	Node  string `json:"node"`
	VMID  int    `json:"vmid"`
	Disk  string `json:"disk" jsonschema:"e.g. scsi0"`
	Size  string `json:"size" jsonschema:"new size (20G) or growth (+4G)"`
	Force bool   `json:"force,omitempty" jsonschema:"even if a running delegate job owns it"`
}

func (t *tools) resize(ctx context.Context, in *ResizeIn) (TaskOut, error) {
	deadline := t.deadline()
	if _, err := t.prepare(ctx, &Guest{Node: in.Node, VMID: in.VMID}, in.Force, "resizing its disk"); err != nil {
		return TaskOut{}, err
	}
	if in.Disk == "" {
		return TaskOut{}, argErr("disk", "required: a disk of the VM, e.g. scsi0")
	}
	if in.Size == "" {
		return TaskOut{}, argErr("size", "required: like 20G or +4G")
	}
	upid, err := t.c.ResizeDisk(ctx, in.Node, in.VMID, in.Disk, in.Size)
	return t.started(ctx, in.Node, upid, err, deadline)
}

// NextIDOut is a free id.
type NextIDOut struct {
	VMID int `json:"vmid"`
}

func (t *tools) nextID(ctx context.Context, _ *NoArgs) (NextIDOut, error) {
	id, err := t.c.NextID(ctx)
	if err != nil {
		return NextIDOut{}, proxmoxError(err)
	}
	return NextIDOut{VMID: id}, nil
}

// StorageIn selects storages.
type StorageIn struct {
	Node string `json:"node,omitempty" jsonschema:"default: every online node"`
}

// StorageOut is a storage on a node.
type StorageOut struct {
	Storage string `json:"storage"`
	Node    string `json:"node"`
	Type    string `json:"type"`
	Content string `json:"content"`
	Shared  bool   `json:"shared"`
	Active  bool   `json:"active"`
	Total   int64  `json:"total"`
	Used    int64  `json:"used"`
	Avail   int64  `json:"avail"`
}

// StoragesOut lists storages.
type StoragesOut struct {
	Storages []StorageOut `json:"storages"`
}

func (t *tools) getStorage(ctx context.Context, in *StorageIn) (StoragesOut, error) {
	if err := checkNode(in.Node, true); err != nil {
		return StoragesOut{}, err
	}
	nodes := []string{in.Node}
	if in.Node == "" {
		all, err := t.c.Nodes(ctx)
		if err != nil {
			return StoragesOut{}, proxmoxError(err)
		}
		nodes = nodes[:0]
		for _, n := range all {
			if n.Status == "online" {
				nodes = append(nodes, n.Node)
			}
		}
		slices.Sort(nodes)
	}
	out := StoragesOut{Storages: []StorageOut{}}
	for _, node := range nodes {
		list, err := t.c.NodeStorage(ctx, node)
		if err != nil {
			return StoragesOut{}, proxmoxError(err)
		}
		for _, s := range list {
			out.Storages = append(out.Storages, StorageOut{Storage: s.Storage, Node: node, Type: s.Type, Content: s.Content,
				Shared: bool(s.Shared), Active: bool(s.Active), Total: int64(s.Total), Used: int64(s.Used), Avail: int64(s.Avail)})
		}
	}
	return out, nil
}

// ContentIn selects volumes.
type ContentIn struct {
	Node    string `json:"node"`
	Storage string `json:"storage"`
	Content string `json:"content,omitempty" jsonschema:"images, rootdir, iso, vztmpl, backup..."`
	VMID    int    `json:"vmid,omitempty" jsonschema:"only this guest's"`
}

// VolumeOut is a volume.
type VolumeOut struct {
	VolID   string `json:"volid"`
	Content string `json:"content"`
	Format  string `json:"format"`
	Size    int64  `json:"size"`
	VMID    int    `json:"vmid,omitempty"`
}

// ContentOut lists volumes.
type ContentOut struct {
	Volumes []VolumeOut `json:"volumes"`
}

func (t *tools) storageContent(ctx context.Context, in *ContentIn) (ContentOut, error) {
	if err := checkNode(in.Node, false); err != nil {
		return ContentOut{}, err
	}
	if in.Storage == "" {
		return ContentOut{}, argErr("storage", "required: a storage id, e.g. local-lvm (proxmox_get_storage lists them)")
	}
	if in.VMID != 0 {
		if err := checkVMID("vmid", in.VMID); err != nil {
			return ContentOut{}, err
		}
	}
	vols, err := t.c.StorageContent(ctx, in.Node, in.Storage, in.Content, in.VMID)
	if err != nil {
		return ContentOut{}, proxmoxError(err)
	}
	out := ContentOut{Volumes: []VolumeOut{}}
	for _, v := range vols {
		out.Volumes = append(out.Volumes, VolumeOut{VolID: v.VolID, Content: v.Content, Format: v.Format, Size: int64(v.Size), VMID: int(v.VMID)})
	}
	return out, nil
}

// ClusterOut is the cluster's membership.
type ClusterOut struct {
	// Cluster is absent for a lone node.
	Cluster *ClusterInfo    `json:"cluster,omitempty"`
	Nodes   []ClusterMember `json:"nodes"`
}

// ClusterInfo is the cluster itself.
type ClusterInfo struct {
	Name    string `json:"name"`
	Nodes   int    `json:"nodes"`
	Quorate bool   `json:"quorate"`
	Version int    `json:"version"`
}

// ClusterMember is a node of the cluster.
type ClusterMember struct {
	Name   string `json:"name"`
	NodeID int    `json:"nodeid"`
	Online bool   `json:"online"`
	Local  bool   `json:"local"`
	IP     string `json:"ip,omitempty"`
}

func (t *tools) clusterStatus(ctx context.Context, _ *NoArgs) (ClusterOut, error) {
	members, err := t.c.ClusterStatus(ctx)
	if err != nil {
		return ClusterOut{}, proxmoxError(err)
	}
	out := ClusterOut{Nodes: []ClusterMember{}}
	for _, m := range members {
		switch m.Type {
		case "cluster":
			out.Cluster = &ClusterInfo{Name: m.Name, Nodes: int(m.Nodes), Quorate: bool(m.Quorate), Version: int(m.Version)}
		case "node":
			out.Nodes = append(out.Nodes, ClusterMember{Name: m.Name, NodeID: int(m.NodeID), Online: bool(m.Online),
				Local: bool(m.Local), IP: m.IP})
		}
	}
	slices.SortFunc(out.Nodes, func(a, b ClusterMember) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
