// Package proxmox is the Proxmox VE backend: every job in its own VM, a
// linked clone of a template, driven through the Proxmox API and the QEMU
// guest agent (package pve), and destroyed afterwards. A VM needs no
// network for the job to run: files, commands, output and status lines
// all travel through the guest agent.
package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Tag marks every VM delegate creates, so that the cleanup loop can find
// the ones no job owns.
const Tag = "delegate"

// Paths inside the guest. /tmp/delegate holds delegate's own files, so
// that the workspace holds only the job's.
const (
	guestDir    = "/tmp/delegate"
	guestOutput = guestDir + "/output"
	guestEvents = guestDir + "/events"
	// StatusFile is the job's status channel inside the VM: a FIFO that a
	// guest process copies into guestEvents.
	StatusFile = guestDir + "/status"
	workspace  = "/workspace"
)

// Config tunes the backend.
type Config struct {
	// Template is the default template (name or vmid) when a job names none.
	Template string
	// Bridge and VLAN put a job that asks for network on this bridge
	// (PROXMOX_JOB_BRIDGE, PROXMOX_JOB_VLAN); empty: the template's NIC.
	Bridge string
	VLAN   int
	// AgentTimeout bounds the wait for the guest agent after start. Default 5 min.
	AgentTimeout time.Duration
	// PollInterval between guest-agent polls. Default 1 s.
	PollInterval time.Duration
	// AgentLostAfter: a job whose agent has not answered for this long is
	// lost. Default 2 min.
	AgentLostAfter time.Duration
	Logger         *slog.Logger
}

// Backend implements sandbox.Backend on a Proxmox VE cluster.
type Backend struct {
	c   *pve.Client
	cfg Config
	log *slog.Logger
}

var _ sandbox.Backend = (*Backend)(nil)

// New makes a backend over a client.
func New(c *pve.Client, cfg Config) *Backend {
	if cfg.AgentTimeout <= 0 {
		cfg.AgentTimeout = 5 * time.Minute
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.AgentLostAfter <= 0 {
		cfg.AgentLostAfter = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{c: c, cfg: cfg, log: cfg.Logger}
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "proxmox" }

// Capabilities implements sandbox.Backend.
func (b *Backend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		FilesystemIsolation: true,
		NetworkIsolation:    true, // a job without network gets a VM without a NIC
		NetworkEgress:       true,
		CPULimit:            true,
		MemoryLimit:         true,
		DiskLimit:           true,
		Recover:             true,
		Templates:           true,
		// The engine's polls of the guest agent watch the process.
		Supervised: true,
		StatusFile: StatusFile,
	}
}

// Check verifies that the API answers and the token is accepted.
func (b *Backend) Check(ctx context.Context) error {
	if _, err := b.c.Version(ctx); err != nil {
		return fmt.Errorf("proxmox: %w", err)
	}
	return nil
}

// sandboxID names a VM; vmids are unique across a cluster.
func sandboxID(vmid int) string { return "vm-" + strconv.Itoa(vmid) }

func parseID(id string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "vm-"))
	if err != nil || !strings.HasPrefix(id, "vm-") || n < 100 {
		return 0, fmt.Errorf("proxmox: %q is not a sandbox id: %w", id, sandbox.ErrGone)
	}
	return n, nil
}

// Create implements sandbox.Backend: choose a node, clone the template,
// size and tag the VM, start it, and wait for its guest agent. Whatever
// fails, the VM is destroyed.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	tplName := spec.Template
	if tplName == "" {
		tplName = b.cfg.Template
	}
	if tplName == "" {
		return nil, errors.New("vmTemplate: no template given and DEFAULT_VM_TEMPLATE is not set")
	}
	resources, err := b.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	tpls, err := findTemplates(resources, tplName)
	if err != nil {
		return nil, err
	}
	memMiB := int(max(16, (spec.MemoryBytes+(1<<20)-1)>>20))
	tpl, node, err := b.place(ctx, tpls, memMiB)
	if err != nil {
		return nil, err
	}
	vmid, err := b.clone(ctx, tpl, node, spec)
	if err != nil {
		return nil, err
	}
	s := &vmSandbox{b: b, vmid: vmid, node: node}
	if err := b.configure(ctx, s, tpl, spec, memMiB); err != nil {
		b.destroyVM(context.WithoutCancel(ctx), node, vmid)
		return nil, err
	}
	return s, nil
}

// findTemplates finds the templates a job names (by name, which several
// nodes may share, or by vmid).
func findTemplates(resources []pve.Resource, name string) ([]pve.Resource, error) {
	var out []pve.Resource
	for _, r := range resources {
		if r.Type == "qemu" && bool(r.Template) && (r.Name == name || strconv.Itoa(int(r.VMID)) == name) {
			out = append(out, r)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	var names []string
	for _, r := range resources {
		if r.Type == "qemu" && bool(r.Template) {
			names = append(names, fmt.Sprintf("%s (%d)", r.Name, r.VMID))
		}
	}
	sort.Strings(names)
	return nil, fmt.Errorf("vmTemplate: no template %q on the cluster (templates: %s)", name, strings.Join(names, ", "))
}

// place picks the template to clone and the node for the VM: an online
// node with room for its memory that holds one of the templates (a linked
// clone, fast and thin), else the online node with the most free memory,
// reached by a full clone from a template on an online node.
func (b *Backend) place(ctx context.Context, tpls []pve.Resource, memMiB int) (pve.Resource, string, error) {
	nodes, err := b.c.Nodes(ctx)
	if err != nil {
		return pve.Resource{}, "", fmt.Errorf("proxmox: list nodes: %w", err)
	}
	need := int64(memMiB) << 20
	online := map[string]bool{}
	best, bestFree := "", int64(-1)
	for _, n := range nodes {
		if n.Status != "online" {
			continue
		}
		online[n.Node] = true
		free := int64(n.MaxMem) - int64(n.Mem)
		if free < need {
			continue
		}
		for _, t := range tpls {
			if t.Node == n.Node {
				return t, n.Node, nil
			}
		}
		if free > bestFree {
			best, bestFree = n.Node, free
		}
	}
	if best == "" {
		return pve.Resource{}, "", fmt.Errorf("proxmox: no online node has %d MiB free for the VM (lower resources.memory or free the cluster)", memMiB)
	}
	for _, t := range tpls {
		if online[t.Node] {
			return t, best, nil
		}
	}
	return pve.Resource{}, "", fmt.Errorf("vmTemplate: every node holding template %q is offline", tpls[0].Name)
}

// clone makes the VM: a linked clone on the template's node, a full clone
// with a target elsewhere. A vmid taken by a racing clone is retried.
func (b *Backend) clone(ctx context.Context, tpl pve.Resource, node string, spec sandbox.Spec) (int, error) {
	full := node != tpl.Node
	for attempt := 0; ; attempt++ {
		vmid, err := b.c.NextID(ctx)
		if err != nil {
			return 0, fmt.Errorf("proxmox: next vmid: %w", err)
		}
		opt := pve.CloneOptions{NewID: vmid, Name: "delegate-" + spec.JobID, Description: "delegate job " + spec.JobID, Full: &full}
		if full {
			opt.Target = node
		}
		upid, err := b.c.CloneVM(ctx, tpl.Node, int(tpl.VMID), opt)
		if err != nil {
			if pve.IsAlreadyExists(err) && attempt < 5 {
				continue // another clone took the id between nextid and clone
			}
			return 0, fmt.Errorf("proxmox: clone template %d: %w", tpl.VMID, err)
		}
		if err := b.c.WaitTask(ctx, tpl.Node, upid); err != nil {
			b.destroyVM(context.WithoutCancel(ctx), node, vmid)
			if pve.IsAlreadyExists(err) && attempt < 5 {
				continue
			}
			return 0, fmt.Errorf("proxmox: clone template %d: %w", tpl.VMID, err)
		}
		b.log.Info("cloned", "template", tpl.VMID, "vmid", vmid, "node", node, "full", full)
		return vmid, nil
	}
}

// configure sizes, tags and starts the VM and waits for its agent.
func (b *Backend) configure(ctx context.Context, s *vmSandbox, tpl pve.Resource, spec sandbox.Spec, memMiB int) error {
	cfg, err := b.c.VMConfig(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read config of %d: %w", s.vmid, err)
	}
	desc := fmt.Sprintf("delegate job %s\n(destroyed when the job ends)", spec.JobID)
	u := pve.VMConfigUpdate{
		Cores:       max(1, int(math.Ceil(spec.CPU))),
		MemoryMiB:   memMiB,
		Tags:        []string{Tag, tagOf(spec.JobID)},
		Description: &desc,
	}
	if spec.CPU > 0 && spec.CPU != math.Ceil(spec.CPU) {
		u.Options = map[string]string{"cpulimit": strconv.FormatFloat(spec.CPU, 'f', 2, 64)}
	}
	nets := netKeys(cfg)
	switch {
	case !spec.Network:
		u.Delete = nets // no NIC: the job reaches nothing, the agent still works
	case b.cfg.Bridge != "":
		net := "virtio,bridge=" + b.cfg.Bridge
		if b.cfg.VLAN > 0 {
			net += ",tag=" + strconv.Itoa(b.cfg.VLAN)
		}
		u.Nets = map[int]string{0: net}
	}
	upid, err := b.c.SetVMConfigAsync(ctx, s.node, s.vmid, u)
	if err == nil {
		err = b.c.WaitTask(ctx, s.node, upid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: configure VM %d: %w", s.vmid, err)
	}
	if disk, size := bootDisk(cfg); disk != "" && spec.DiskBytes > size {
		upid, err := b.c.ResizeDisk(ctx, s.node, s.vmid, disk, strconv.FormatInt((spec.DiskBytes+(1<<30)-1)>>30, 10)+"G")
		if err == nil {
			err = b.c.WaitTask(ctx, s.node, upid)
		}
		if err != nil {
			return fmt.Errorf("proxmox: resize %s of VM %d: %w", disk, s.vmid, err)
		}
	}
	upid, err = b.c.StartVM(ctx, s.node, s.vmid)
	if err == nil {
		err = b.c.WaitTask(ctx, s.node, upid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: start VM %d: %w", s.vmid, err)
	}
	if err := b.waitAgent(ctx, s); err != nil {
		return err
	}
	// The workspace, and delegate's own directory, exist before files come.
	if _, err := s.run(ctx, []string{"/bin/mkdir", "-p", workspace, guestDir}); err != nil {
		return fmt.Errorf("proxmox: prepare VM %d: %w", s.vmid, err)
	}
	return nil
}

// tagOf makes a job id a valid Proxmox tag (lower case, [a-z0-9_+.-]).
func tagOf(jobID string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(jobID) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("_+.-", r) {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

func netKeys(cfg pve.VMConfig) []string {
	var keys []string
	for k := range cfg.Raw {
		if n, ok := strings.CutPrefix(k, "net"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// bootDisk finds the VM's first disk and its size in bytes.
func bootDisk(cfg pve.VMConfig) (string, int64) {
	for _, bus := range []string{"scsi", "virtio", "sata", "ide"} {
		for i := range 4 {
			key := bus + strconv.Itoa(i)
			v := cfg.Option(key)
			if v == "" || strings.Contains(v, "media=cdrom") {
				continue
			}
			for _, part := range strings.Split(v, ",") {
				if size, ok := strings.CutPrefix(part, "size="); ok {
					return key, parseSize(size)
				}
			}
			return key, 0
		}
	}
	return "", 0
}

func parseSize(s string) int64 {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "T"):
		mult, s = 1<<40, strings.TrimSuffix(s, "T")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return int64(n * float64(mult))
}

// waitAgent polls the guest agent until it answers.
func (b *Backend) waitAgent(ctx context.Context, s *vmSandbox) error {
	deadline := time.Now().Add(b.cfg.AgentTimeout)
	for {
		err := b.c.AgentPing(ctx, s.node, s.vmid)
		if err == nil {
			return nil
		}
		if !pve.IsAgentNotRunning(err) && !pve.IsAgentError(err) {
			return fmt.Errorf("proxmox: guest agent of VM %d: %w", s.vmid, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxmox: the guest agent of VM %d did not answer within %s (is qemu-guest-agent installed and enabled in the template?): %w",
				s.vmid, b.cfg.AgentTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.cfg.PollInterval):
		}
	}
}

// locate finds a VM's node; ErrGone if it does not exist.
func (b *Backend) locate(ctx context.Context, vmid int) (pve.Resource, error) {
	resources, err := b.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return pve.Resource{}, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	for _, r := range resources {
		if int(r.VMID) == vmid {
			return r, nil
		}
	}
	return pve.Resource{}, fmt.Errorf("proxmox: VM %d: %w", vmid, sandbox.ErrGone)
}

// Recover implements sandbox.Backend: a VM of ours that still runs.
func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Sandbox, error) {
	vmid, err := parseID(id)
	if err != nil {
		return nil, err
	}
	r, err := b.locate(ctx, vmid)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(r.TagList(), Tag) {
		return nil, fmt.Errorf("proxmox: VM %d is not delegate's: %w", vmid, sandbox.ErrGone)
	}
	return &vmSandbox{b: b, vmid: vmid, node: r.Node}, nil
}

// List implements sandbox.Backend: every VM tagged delegate, with the
// job named by its other tag. A VM whose clone task still runs has no
// tags yet: it is left out, since its Create is still at work.
func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) {
	resources, err := b.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	var out []sandbox.Info
	for _, r := range resources {
		tags := r.TagList()
		if r.Type != "qemu" || bool(r.Template) || !slices.Contains(tags, Tag) {
			continue
		}
		info := sandbox.Info{ID: sandboxID(int(r.VMID))}
		for _, t := range tags {
			if strings.HasPrefix(t, "job-") {
				info.JobID = t
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// Destroy implements sandbox.Backend.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	vmid, err := parseID(id)
	if err != nil {
		return nil // not ours: nothing to destroy
	}
	r, err := b.locate(ctx, vmid)
	if errors.Is(err, sandbox.ErrGone) {
		return nil
	}
	if err != nil {
		return err
	}
	if bool(r.Template) || !slices.Contains(r.TagList(), Tag) {
		return fmt.Errorf("proxmox: refusing to destroy VM %d: it is not a VM delegate made", vmid)
	}
	return b.destroyVM(ctx, r.Node, vmid)
}

// destroyVM stops (at once: the guest is not trusted to shut down) and
// deletes a VM with its disks, retrying while it is locked.
func (b *Backend) destroyVM(ctx context.Context, node string, vmid int) error {
	var last error
	for attempt := range 20 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(b.cfg.PollInterval):
			}
		}
		upid, err := b.c.StopVM(ctx, node, vmid)
		if err == nil {
			err = b.c.WaitTask(ctx, node, upid)
		}
		if err != nil && pve.IsNotFound(err) {
			return nil
		}
		if err != nil && !pve.IsVMNotRunning(err) {
			last = err
			if pve.IsLocked(err) {
				continue
			}
			// A stop can fail on a VM that is already stopped; the delete
			// below tells the truth.
		}
		upid, err = b.c.DeleteVM(ctx, node, vmid, pve.DeleteOptions{Purge: true, DestroyUnreferencedDisks: true})
		if err == nil {
			err = b.c.WaitTask(ctx, node, upid)
		}
		if err == nil || pve.IsNotFound(err) {
			b.log.Info("destroyed VM", "vmid", vmid, "node", node)
			return nil
		}
		last = err
	}
	return fmt.Errorf("proxmox: destroy VM %d: %w", vmid, last)
}
