package pve

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CloneOptions are the parameters of a clone; NewID is required.
type CloneOptions struct {
	NewID       int
	Name        string // a DNS name
	Description string
	Pool        string
	Target      string // another node (needs shared storage)
	// Full: nil lets Proxmox choose (linked for a template, full
	// otherwise); linked clones need a template.
	Full     *bool
	Storage  string // full clones only
	Format   string // full clones only: raw, qcow2, vmdk
	SnapName string
	BWLimit  int // KiB/s, 0: default
}

// CloneVM starts cloning vmid into opt.NewID and returns the task's
// UPID. The new VM exists (locked "clone") until the task ends. Never
// retried: a second clone of the same newid would fail or collide.
func (c *Client) CloneVM(ctx context.Context, node string, vmid int, opt CloneOptions) (string, error) {
	if opt.NewID == 0 {
		return "", fmt.Errorf("pve: clone of %d: NewID is required", vmid)
	}
	p := params{"newid": opt.NewID}
	setStr(p, "name", opt.Name)
	setStr(p, "description", opt.Description)
	setStr(p, "pool", opt.Pool)
	setStr(p, "target", opt.Target)
	setStr(p, "storage", opt.Storage)
	setStr(p, "format", opt.Format)
	setStr(p, "snapname", opt.SnapName)
	if opt.Full != nil {
		p["full"] = *opt.Full
	}
	if opt.BWLimit > 0 {
		p["bwlimit"] = opt.BWLimit
	}
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/clone", p, &upid)
	return upid, err
}

func setStr(p params, k, v string) {
	if v != "" {
		p[k] = v
	}
}

// VMConfig is GET .../config: the options delegate reads, and all of
// them raw.
type VMConfig struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Cores       Int    `json:"cores"`
	Sockets     Int    `json:"sockets"`
	Memory      String `json:"memory"` // "[current=]MiB"
	Tags        string `json:"tags"`
	Template    Bool   `json:"template"`
	Lock        string `json:"lock"`
	Agent       String `json:"agent"`
	Digest      string `json:"digest"`
	// Raw has every option as the API sent it.
	Raw map[string]json.RawMessage `json:"-"`
}

// MemoryMiB reads Memory (Proxmox's default is 512).
func (v VMConfig) MemoryMiB() int {
	m := strings.TrimPrefix(string(v.Memory), "current=")
	m, _, _ = strings.Cut(m, ",")
	n, err := strconv.Atoi(m)
	if err != nil || n <= 0 {
		return 512
	}
	return n
}

// TagList splits Tags.
func (v VMConfig) TagList() []string { return splitTags(v.Tags) }

// Option returns an option as text ("" if unset).
func (v VMConfig) Option(key string) string {
	raw, ok := v.Raw[key]
	if !ok {
		return ""
	}
	var s String
	if err := json.Unmarshal(raw, &s); err != nil {
		return string(raw)
	}
	return string(s)
}

// VMConfig reads a VM's configuration with its pending changes applied
// (what it will be at its next start): Proxmox's GET config.
func (c *Client) VMConfig(ctx context.Context, node string, vmid int) (VMConfig, error) {
	return c.vmConfig(ctx, node, vmid, nil)
}

// CurrentVMConfig reads the configuration a VM runs with (current=1):
// changes Proxmox could not apply to a running VM (cores, memory...)
// wait in its pending section, which this leaves out.
func (c *Client) CurrentVMConfig(ctx context.Context, node string, vmid int) (VMConfig, error) {
	return c.vmConfig(ctx, node, vmid, params{"current": true})
}

func (c *Client) vmConfig(ctx context.Context, node string, vmid int, p params) (VMConfig, error) {
	var raw map[string]json.RawMessage
	if _, err := c.get(ctx, vmPath(node, vmid)+"/config", p, &raw); err != nil {
		return VMConfig{}, err
	}
	var v VMConfig
	data, _ := json.Marshal(raw)
	if err := json.Unmarshal(data, &v); err != nil {
		return VMConfig{}, fmt.Errorf("pve: config of %d: %w", vmid, err)
	}
	v.Raw = raw
	return v, nil
}

// VMConfigUpdate is a change of configuration: only what is set is sent.
type VMConfigUpdate struct {
	Name        string  // "": unchanged
	Description *string // nil: unchanged
	Cores       int     // 0: unchanged
	Sockets     int
	MemoryMiB   int
	Tags        []string       // nil: unchanged (use Delete to remove)
	Nets        map[int]string // netN, e.g. "virtio,bridge=vmbr0" (a MAC is generated)
	Options     map[string]string
	Delete      []string
	// Digest, if set, refuses the change when the config changed since
	// it was read.
	Digest string
}

func (u VMConfigUpdate) params() params {
	p := params{}
	setStr(p, "name", u.Name)
	if u.Description != nil {
		p["description"] = *u.Description
	}
	for k, n := range map[string]int{"cores": u.Cores, "sockets": u.Sockets, "memory": u.MemoryMiB} {
		if n != 0 {
			p[k] = n
		}
	}
	if u.Tags != nil {
		p["tags"] = strings.Join(u.Tags, ";")
	}
	for i, n := range u.Nets {
		p["net"+strconv.Itoa(i)] = n
	}
	for k, v := range u.Options {
		p[k] = v
	}
	if len(u.Delete) > 0 {
		p["delete"] = strings.Join(u.Delete, ",")
	}
	setStr(p, "digest", u.Digest)
	return p
}

// SetVMConfig changes a VM's configuration synchronously (PUT).
func (c *Client) SetVMConfig(ctx context.Context, node string, vmid int, u VMConfigUpdate) error {
	return c.put(ctx, vmPath(node, vmid)+"/config", u.params(), nil)
}

// SetVMConfigAsync changes it in a qmconfig task (POST) and returns the
// UPID.
func (c *Client) SetVMConfigAsync(ctx context.Context, node string, vmid int, u VMConfigUpdate) (string, error) {
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/config", u.params(), &upid)
	return upid, err
}

// VMStatus is GET .../status/current.
type VMStatus struct {
	VMID        Int    `json:"vmid"`
	Status      string `json:"status"` // running, stopped
	QMPStatus   string `json:"qmpstatus"`
	Name        string `json:"name"`
	Lock        string `json:"lock"`
	Tags        string `json:"tags"`
	Template    Bool   `json:"template"`
	Agent       Bool   `json:"agent"`
	CPUs        Number `json:"cpus"`
	MaxMem      Int    `json:"maxmem"`
	Mem         Int    `json:"mem"`
	MaxDisk     Int    `json:"maxdisk"`
	Uptime      Int    `json:"uptime"`
	PID         Int    `json:"pid"`
	RunningQEMU string `json:"running-qemu"`
}

// VMStatus reads a VM's current state.
func (c *Client) VMStatus(ctx context.Context, node string, vmid int) (VMStatus, error) {
	var s VMStatus
	_, err := c.get(ctx, vmPath(node, vmid)+"/status/current", nil, &s)
	return s, err
}

// StartVM starts a VM: a qmstart task. "Already running" and a template
// fail the task, not the call.
func (c *Client) StartVM(ctx context.Context, node string, vmid int) (string, error) {
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/status/start", nil, &upid)
	return upid, err
}

// StopVM stops a VM at once (pulls the plug): a qmstop task.
func (c *Client) StopVM(ctx context.Context, node string, vmid int) (string, error) {
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/status/stop", nil, &upid)
	return upid, err
}

// SuspendVM pauses a running VM, its RAM kept (a qmsuspend task).
func (c *Client) SuspendVM(ctx context.Context, node string, vmid int) (string, error) {
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/status/suspend", nil, &upid)
	return upid, err
}

// ResumeVM lets a suspended VM go on (a qmresume task).
func (c *Client) ResumeVM(ctx context.Context, node string, vmid int) (string, error) {
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/status/resume", nil, &upid)
	return upid, err
}

// ShutdownOptions tune a clean shutdown.
type ShutdownOptions struct {
	Timeout   time.Duration // 0: Proxmox's default
	ForceStop bool          // stop if the guest does not shut down in time
}

// ShutdownVM asks the guest to shut down: a qmshutdown task.
func (c *Client) ShutdownVM(ctx context.Context, node string, vmid int, opt ShutdownOptions) (string, error) {
	p := params{}
	if opt.Timeout > 0 {
		p["timeout"] = int((opt.Timeout + time.Second - 1) / time.Second)
	}
	if opt.ForceStop {
		p["forceStop"] = true
	}
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/status/shutdown", p, &upid)
	return upid, err
}

// DeleteOptions tune a destroy.
type DeleteOptions struct {
	Purge                    bool // also remove it from backup, replication and HA configs
	DestroyUnreferencedDisks bool
}

// DeleteVM destroys a stopped VM and its disks: a qmdestroy task. A
// running VM is refused at once ("VM 100 is running - destroy failed").
func (c *Client) DeleteVM(ctx context.Context, node string, vmid int, opt DeleteOptions) (string, error) {
	p := params{}
	if opt.Purge {
		p["purge"] = true
	}
	if opt.DestroyUnreferencedDisks {
		p["destroy-unreferenced-disks"] = true
	}
	var upid string
	err := c.del(ctx, vmPath(node, vmid), p, &upid)
	return upid, err
}

// ResizeDisk grows a disk: size is absolute ("20G") or an increase
// ("+4G"). PVE 8 and later answer a task; older versions resize at once
// and the UPID is "" (WaitTask accepts it).
func (c *Client) ResizeDisk(ctx context.Context, node string, vmid int, disk, size string) (string, error) {
	var upid string
	err := c.put(ctx, vmPath(node, vmid)+"/resize", params{"disk": disk, "size": size}, &upid)
	return upid, err
}

// PendingOption is one option of a VM's pending view: its current value,
// the value it takes at the next start, or its removal then.
type PendingOption struct {
	Key     string `json:"key"`
	Value   String `json:"value"`
	Pending String `json:"pending"`
	// Delete is 1 when the option goes at the next start (2: forced).
	Delete Int `json:"delete"`
}

// Changed: the option changes at the next start.
func (p PendingOption) Changed() bool { return p.Pending != "" || p.Delete > 0 }

// Pending reads a VM's options with their pending changes (GET pending).
func (c *Client) Pending(ctx context.Context, node string, vmid int) ([]PendingOption, error) {
	var out []PendingOption
	_, err := c.get(ctx, vmPath(node, vmid)+"/pending", nil, &out)
	return out, err
}

// MigrateOptions tune a migration.
type MigrateOptions struct {
	Target string // the node to move to
	// Online migrates a running VM live (Proxmox refuses a running VM
	// without it).
	Online bool
	// WithLocalDisks copies disks on local storage too.
	WithLocalDisks bool
}

// MigrateVM moves a VM to another node of the cluster: a qmigrate task,
// during which the VM's config has lock "migrate"; at its end the config
// is on the target node.
func (c *Client) MigrateVM(ctx context.Context, node string, vmid int, opt MigrateOptions) (string, error) {
	p := params{"target": opt.Target}
	if opt.Online {
		p["online"] = true
	}
	if opt.WithLocalDisks {
		p["with-local-disks"] = true
	}
	var upid string
	err := c.post(ctx, vmPath(node, vmid)+"/migrate", p, &upid)
	return upid, err
}

// MigrateAll moves every guest of a node to another (Node → Bulk
// Migrate): a migrateall task starting one migration per guest, at most
// maxWorkers at once (0: Proxmox's default).
func (c *Client) MigrateAll(ctx context.Context, node, target string, maxWorkers int) (string, error) {
	p := params{"target": target}
	if maxWorkers > 0 {
		p["maxworkers"] = maxWorkers
	}
	var upid string
	err := c.post(ctx, nodePath(node)+"/migrateall", p, &upid)
	return upid, err
}
