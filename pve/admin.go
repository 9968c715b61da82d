package pve

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// The calls an administrator's tools make besides the backend's: both
// kinds of guest (QEMU VMs and LXC containers), snapshots, node tasks,
// storage contents and the cluster's status. Like every call of the
// client, GETs are retried after transient failures and the rest only
// when they were never sent; all go through the rate limit.

// GuestType is the kind of guest, as API paths name it.
type GuestType string

// The guest types.
const (
	QEMU GuestType = "qemu"
	LXC  GuestType = "lxc"
)

// Valid reports whether t is qemu or lxc.
func (t GuestType) Valid() bool { return t == QEMU || t == LXC }

// guestPath is /nodes/{node}/{qemu|lxc}/{vmid}.
func guestPath(node string, typ GuestType, vmid int) string {
	return "/nodes/" + url.PathEscape(node) + "/" + string(typ) + "/" + strconv.Itoa(vmid)
}

// Guest is an entry of GET /nodes/{node}/qemu or /nodes/{node}/lxc.
type Guest struct {
	VMID     Int    `json:"vmid"`
	Name     string `json:"name"`
	Status   string `json:"status"` // running, stopped
	Template Bool   `json:"template"`
	Lock     string `json:"lock"`
	Tags     string `json:"tags"`
	CPUs     Number `json:"cpus"`
	CPU      Number `json:"cpu"`
	Mem      Int    `json:"mem"`
	MaxMem   Int    `json:"maxmem"`
	Disk     Int    `json:"disk"`
	MaxDisk  Int    `json:"maxdisk"`
	Uptime   Int    `json:"uptime"`
	PID      Int    `json:"pid"`
	// Type and Node are the list's own (the answer does not repeat them).
	Type GuestType `json:"-"`
	Node string    `json:"-"`
}

// Guests lists a node's VMs (qemu) or containers (lxc) the token may
// audit, templates included.
func (c *Client) Guests(ctx context.Context, node string, typ GuestType) ([]Guest, error) {
	var out []Guest
	if _, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/"+string(typ), nil, &out); err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Type, out[i].Node = typ, node
	}
	return out, nil
}

// GuestStatus is GET .../status/current of a VM or a container.
type GuestStatus struct {
	VMStatus
	Type    string `json:"type"` // lxc for a container; "" for a VM
	Disk    Int    `json:"disk"`
	MaxSwap Int    `json:"maxswap"`
}

// GuestStatus reads a guest's current state.
func (c *Client) GuestStatus(ctx context.Context, node string, typ GuestType, vmid int) (GuestStatus, error) {
	var s GuestStatus
	_, err := c.get(ctx, guestPath(node, typ, vmid)+"/status/current", nil, &s)
	return s, err
}

// GuestConfig reads a guest's configuration, every option as text (the
// digest included).
func (c *Client) GuestConfig(ctx context.Context, node string, typ GuestType, vmid int) (map[string]string, error) {
	var raw map[string]String
	if _, err := c.get(ctx, guestPath(node, typ, vmid)+"/config", nil, &raw); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		out[k] = string(v)
	}
	return out, nil
}

// guestTask posts a power action and returns its UPID.
func (c *Client) guestTask(ctx context.Context, node string, typ GuestType, vmid int, action string, p params) (string, error) {
	var upid string
	err := c.post(ctx, guestPath(node, typ, vmid)+"/status/"+action, p, &upid)
	return upid, err
}

// StartGuest starts a VM (qmstart) or a container (vzstart). A container
// that runs is refused at once ("CT 200 already running"); a VM's task
// fails instead.
func (c *Client) StartGuest(ctx context.Context, node string, typ GuestType, vmid int) (string, error) {
	return c.guestTask(ctx, node, typ, vmid, "start", nil)
}

// StopGuest stops a guest at once (qmstop, vzstop).
func (c *Client) StopGuest(ctx context.Context, node string, typ GuestType, vmid int) (string, error) {
	return c.guestTask(ctx, node, typ, vmid, "stop", nil)
}

// ShutdownGuest asks a guest to shut down (qmshutdown, vzshutdown).
func (c *Client) ShutdownGuest(ctx context.Context, node string, typ GuestType, vmid int, opt ShutdownOptions) (string, error) {
	p := params{}
	if opt.Timeout > 0 {
		p["timeout"] = int((opt.Timeout + time.Second - 1) / time.Second)
	}
	if opt.ForceStop {
		p["forceStop"] = true
	}
	return c.guestTask(ctx, node, typ, vmid, "shutdown", p)
}

// RebootGuest shuts a running guest down and starts it again (qmreboot,
// vzreboot); one that does not run is refused at once.
func (c *Client) RebootGuest(ctx context.Context, node string, typ GuestType, vmid int) (string, error) {
	return c.guestTask(ctx, node, typ, vmid, "reboot", nil)
}

// DeleteGuest destroys a stopped guest and its disks (qmdestroy,
// vzdestroy).
func (c *Client) DeleteGuest(ctx context.Context, node string, typ GuestType, vmid int, opt DeleteOptions) (string, error) {
	p := params{}
	if opt.Purge {
		p["purge"] = true
	}
	if opt.DestroyUnreferencedDisks {
		p["destroy-unreferenced-disks"] = true
	}
	var upid string
	err := c.del(ctx, guestPath(node, typ, vmid), p, &upid)
	return upid, err
}

// Snapshot is an entry of GET .../snapshot; the last one, "current", is
// the VM as it is now.
type Snapshot struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Parent      string `json:"parent"`
	SnapTime    Int    `json:"snaptime"`
	VMState     Bool   `json:"vmstate"`   // taken with the RAM
	SnapState   string `json:"snapstate"` // prepare, delete: not complete
	Running     Bool   `json:"running"`   // "current" only
}

// Snapshots lists a VM's snapshots, and "current".
func (c *Client) Snapshots(ctx context.Context, node string, vmid int) ([]Snapshot, error) {
	var out []Snapshot
	_, err := c.get(ctx, vmPath(node, vmid)+"/snapshot", nil, &out)
	return out, err
}

// CreateSnapshot snapshots a VM (a qmsnapshot task); vmstate also saves
// the RAM of a running VM.
func (c *Client) CreateSnapshot(ctx context.Context, node string, vmid int, name, description string, vmstate bool) (string, error) {
	if name == "" {
		return "", fmt.Errorf("pve: snapshot of %d: a name is required", vmid)
	}
	p := params{"snapname": name}
	setStr(p, "description", description)
	if vmstate {
		p["vmstate"] = true
	}
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/snapshot", p, &upid)
	return upid, err
}

// RollbackSnapshot makes a snapshot the VM's state again (a qmrollback
// task: the VM is stopped first); start starts it afterwards.
func (c *Client) RollbackSnapshot(ctx context.Context, node string, vmid int, name string, start bool) (string, error) {
	p := params{}
	if start {
		p["start"] = true
	}
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/snapshot/"+url.PathEscape(name)+"/rollback", p, &upid)
	return upid, err
}

// DeleteSnapshot removes a snapshot (a qmdelsnapshot task).
func (c *Client) DeleteSnapshot(ctx context.Context, node string, vmid int, name string) (string, error) {
	var upid string
	err := c.del(ctx, vmPath(node, vmid)+"/snapshot/"+url.PathEscape(name), nil, &upid)
	return upid, err
}

// TaskListOptions select tasks of a node.
type TaskListOptions struct {
	// Source is archive (finished tasks, Proxmox's default), active
	// (running) or all.
	Source     string
	Start      int // skip this many
	Limit      int // 0: Proxmox's default, 50
	TypeFilter string
	UserFilter string
	VMID       int
	Errors     bool // only failed tasks
}

// TaskEntry is an entry of GET /nodes/{node}/tasks.
type TaskEntry struct {
	UPID      string `json:"upid"`
	Node      string `json:"node"`
	Type      string `json:"type"`
	ID        string `json:"id"`
	User      string `json:"user"`
	TokenID   string `json:"tokenid"`
	StartTime Int    `json:"starttime"`
	EndTime   Int    `json:"endtime"`
	// Status is the exit status of a finished task (OK, "WARNINGS: n" or
	// the error), RUNNING for a running one.
	Status string `json:"status"`
}

// NodeTasks lists a node's tasks, the last ended first, and how many
// match in all.
func (c *Client) NodeTasks(ctx context.Context, node string, opt TaskListOptions) ([]TaskEntry, int, error) {
	p := params{}
	setStr(p, "source", opt.Source)
	setStr(p, "typefilter", opt.TypeFilter)
	setStr(p, "userfilter", opt.UserFilter)
	if opt.Start > 0 {
		p["start"] = opt.Start
	}
	if opt.Limit > 0 {
		p["limit"] = opt.Limit
	}
	if opt.VMID > 0 {
		p["vmid"] = opt.VMID
	}
	if opt.Errors {
		p["errors"] = true
	}
	var out []TaskEntry
	env, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/tasks", p, &out)
	if err != nil {
		return nil, 0, err
	}
	return out, int(env.Total), nil
}

// StorageStatus is an entry of GET /nodes/{node}/storage.
type StorageStatus struct {
	Storage      string `json:"storage"`
	Type         string `json:"type"`
	Content      string `json:"content"`
	Shared       Bool   `json:"shared"`
	Active       Bool   `json:"active"`
	Enabled      Bool   `json:"enabled"`
	Total        Int    `json:"total"`
	Used         Int    `json:"used"`
	Avail        Int    `json:"avail"`
	UsedFraction Number `json:"used_fraction"`
}

// NodeStorage lists the storages of a node the token may see, with
// their use there.
func (c *Client) NodeStorage(ctx context.Context, node string) ([]StorageStatus, error) {
	var out []StorageStatus
	_, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/storage", nil, &out)
	return out, err
}

// Volume is an entry of GET /nodes/{node}/storage/{storage}/content.
type Volume struct {
	VolID   string `json:"volid"`
	Content string `json:"content"` // images, rootdir, iso, vztmpl, backup...
	Format  string `json:"format"`
	Size    Int    `json:"size"`
	Used    Int    `json:"used"`
	VMID    Int    `json:"vmid"`
	CTime   Int    `json:"ctime"`
}

// StorageContent lists the volumes of a storage on a node that the token
// may see; content ("" for all) and vmid (0 for all) filter them.
func (c *Client) StorageContent(ctx context.Context, node, storage, content string, vmid int) ([]Volume, error) {
	p := params{}
	setStr(p, "content", content)
	if vmid > 0 {
		p["vmid"] = vmid
	}
	var out []Volume
	_, err := c.get(ctx, "/nodes/"+url.PathEscape(node)+"/storage/"+url.PathEscape(storage)+"/content", p, &out)
	return out, err
}

// ClusterMember is an entry of GET /cluster/status: the cluster itself
// (Type "cluster") or a node.
type ClusterMember struct {
	Type    string `json:"type"` // cluster, node
	ID      string `json:"id"`
	Name    string `json:"name"`
	Nodes   Int    `json:"nodes"`   // cluster
	Version Int    `json:"version"` // cluster
	Quorate Bool   `json:"quorate"` // cluster
	NodeID  Int    `json:"nodeid"`  // node
	IP      string `json:"ip"`      // node
	Local   Bool   `json:"local"`   // node: the one that answered
	Online  Bool   `json:"online"`  // node
	Level   string `json:"level"`   // node: subscription level
}

// ClusterStatus reads the cluster's membership and quorum (it needs
// Sys.Audit on /).
func (c *Client) ClusterStatus(ctx context.Context) ([]ClusterMember, error) {
	var out []ClusterMember
	_, err := c.get(ctx, "/cluster/status", nil, &out)
	return out, err
}
