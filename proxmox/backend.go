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
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

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
	// Instance names this delegate server among those sharing the
	// cluster (see owner.go): it touches no VM that is not its own. Keep
	// it stable across restarts (StableInstanceID), or a restarted server
	// cannot recover its jobs. Default: a random one.
	Instance string
	// NodeMemory is what VMs may use on a node, by node name, "" for
	// every node not named (PROXMOX_NODE_MEMORY). Unset, it is the node's
	// maxmem less HostReserve, which needs Sys.Audit on /nodes.
	NodeMemory map[string]int64
	// GuestPerl is the perl in the templates' guests that keeps a job's
	// stdout and stderr apart (streams.go). Default /usr/bin/perl; a
	// guest without it gives the two together.
	GuestPerl string
	// ResourcePool is the Proxmox resource pool job and pool VMs are
	// cloned into (PROXMOX_RESOURCE_POOL), so that the token's rights can
	// be on /pool/<name> rather than on every VM of the cluster.
	ResourcePool string
	// StaleLockAfter: a VM of this server locked this long is reported
	// (its lock outlived the operation that set it). Default 15 min.
	StaleLockAfter time.Duration
	// CPUOvercommit, if above 0, reserves vCPUs on the nodes: the vCPUs
	// of the VMs that count for placement stay within the node's cores
	// times this (PROXMOX_CPU_OVERCOMMIT). 0: a job's VM needs only a
	// node with at least its cores (vCPU overcommit is normal on Proxmox).
	CPUOvercommit float64
	// Egress, if set, routes jobs' networks through delegate's egress
	// proxy alone (egress.go): their VMs' firewalls let out nothing else.
	Egress *Egress
	Logger *slog.Logger
}

// Backend implements sandbox.Backend on a Proxmox VE cluster.
type Backend struct {
	c   *pve.Client
	cfg Config
	log *slog.Logger

	placeMu  sync.Mutex // one placement at a time: see placement.go
	holdMu   sync.Mutex
	holds    map[*hold]struct{}
	blindWhy string

	idMu    sync.Mutex
	cloning map[int]bool // vmids handed out whose clone task has not ended

	destroyMu  sync.Mutex
	destroying map[string]*destroyCall // by sandbox id: see Destroy

	tplMu sync.Mutex
	tpls  map[int]*templateInfo
	// cores is the most cores of an online node (CheckResources), as
	// read at coresRead. Guarded by tplMu.
	cores     int
	coresRead time.Time

	// nodes remembers where this server's VMs are, so that destroying
	// one needs no listing of the cluster. Guarded by holdMu.
	nodes map[int]string
	// locked are this server's VMs the sweep skips for their lock, and
	// since when. Guarded by holdMu.
	locked map[int]lockedSince

	// pool is the warm pool, once KeepPool was called (pool.go).
	pool atomic.Pointer[pool]
	// tplList is the cluster's templates, for CheckTemplate.
	tplList templateList
}

var (
	_ sandbox.Backend  = (*Backend)(nil)
	_ sandbox.Admitter = (*Backend)(nil)
)

// New makes a backend over a client.
func New(c *pve.Client, cfg Config) (*Backend, error) {
	if cfg.AgentTimeout <= 0 {
		cfg.AgentTimeout = 5 * time.Minute
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.AgentLostAfter <= 0 {
		cfg.AgentLostAfter = 2 * time.Minute
	}
	if cfg.StaleLockAfter <= 0 {
		cfg.StaleLockAfter = 15 * time.Minute
	}
	if cfg.CPUOvercommit < 0 || cfg.CPUOvercommit > 100 {
		return nil, fmt.Errorf("proxmox: the CPU overcommit ratio %g must be from 0 (none) to 100", cfg.CPUOvercommit)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.GuestPerl == "" {
		cfg.GuestPerl = "/usr/bin/perl"
	}
	if !path.IsAbs(cfg.GuestPerl) || strings.ContainsRune(cfg.GuestPerl, 0) {
		return nil, fmt.Errorf("proxmox: the guest's perl %q must be an absolute path", cfg.GuestPerl)
	}
	if cfg.Instance == "" {
		cfg.Instance = NewInstanceID()
	}
	if err := checkInstance(cfg.Instance); err != nil {
		return nil, err
	}
	for node, m := range cfg.NodeMemory {
		if m < 1<<30 {
			return nil, fmt.Errorf("proxmox: node memory of %q must be at least 1G (got %d bytes)", node, m)
		}
	}
	return &Backend{c: c, cfg: cfg, log: cfg.Logger.With("instance", cfg.Instance),
		holds: map[*hold]struct{}{}, cloning: map[int]bool{}, tpls: map[int]*templateInfo{}, nodes: map[int]string{},
		locked: map[int]lockedSince{}}, nil
}

// Instance is the id this backend's VMs carry.
func (b *Backend) Instance() string { return b.cfg.Instance }

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "proxmox" }

// Close implements sandbox.Backend: the warm pool's upkeep stops (its
// VMs stay, for the next server to adopt) and the API client's idle
// connections close. Job VMs go on.
func (b *Backend) Close() error {
	if p := b.pool.Load(); p != nil {
		p.stopOnce.Do(p.stop)
	}
	b.c.CloseIdleConnections()
	return nil
}

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
		// Each command is its own runner under the guest agent, in the
		// one VM: they share its disk and its network.
		MultiExec: true,
		// status/suspend and status/resume.
		Pause: true,
		// A workspace goes in and out through the agent (archive.go);
		// caches are not kept.
		Workspaces: true,
		// A job VM's firewall lets it reach the egress proxy alone
		// (egress.go), when the operator names it.
		EgressProxy: b.cfg.Egress != nil,
	}
}

// Check verifies that the API answers and the token is accepted.
func (b *Backend) Check(ctx context.Context) error {
	if _, err := b.c.Version(ctx); err != nil {
		return fmt.Errorf("proxmox: %w", err)
	}
	return nil
}

// Create implements sandbox.Backend: take a warm VM of the pool if
// Admit reserved one, else clone the template where Admit placed the VM,
// size and tag it, start it, and wait for its guest agent. Whatever
// fails, the VM is destroyed (if it is still ours).
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	h, _ := spec.Admission.(*hold)
	if h == nil || h.b != b {
		var err error
		if h, err = b.admit(ctx, spec); err != nil {
			return nil, err
		}
		defer h.Release()
	}
	o := owner{b.cfg.Instance, spec.JobID}
	for attempt := 1; h.pooled != nil; attempt++ {
		v := h.pooled
		s, err := b.claim(ctx, h.pool, v, spec, o)
		h.pool.forget(v)
		if err == nil {
			h.bind(v.vmid)
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Taken by another server, gone, or stopped: another warm VM, or
		// a cold start.
		b.log.Info("could not take a pool VM", "vmid", v.vmid, "job", spec.JobID, "err", err)
		if attempt >= 3 {
			h = nil
		} else {
			h = b.poolHold(ctx, spec)
		}
		if h == nil {
			if h, err = b.place(ctx, spec, false); err != nil {
				return nil, err
			}
		}
		defer h.Release()
	}
	spec.Step(fmt.Sprintf("cloning from %s on %s", templateLabel(h.tpl), h.node))
	vmid, err := b.clone(ctx, h, o)
	if err != nil {
		return nil, err
	}
	h.bind(vmid)
	b.remember(vmid, h.node)
	s := &vmSandbox{b: b, vmid: vmid, node: h.node, owner: o}
	if err := b.configure(ctx, s, h, spec, jobDescription(spec.JobID)); err != nil {
		b.destroyVM(context.WithoutCancel(ctx), h.node, vmid, o)
		return nil, err
	}
	return s, nil
}

func templateLabel(t pve.Resource) string {
	if t.Name != "" {
		return t.Name
	}
	return strconv.Itoa(int(t.VMID))
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

// configure sizes and tags the VM, starts it, waits for its agent and
// readies the guest. The clone's config is read first: its disks and NICs
// are the template's, under names of its own.
func (b *Backend) configure(ctx context.Context, s *vmSandbox, h *hold, spec sandbox.Spec, desc string) error {
	cfg, err := b.c.VMConfig(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read the config of VM %d: %w", s.vmid, privilegeHint(err))
	}
	sh := shapeOf(spec.CPU, spec.MemoryBytes)
	u := pve.VMConfigUpdate{
		Cores:       sh.cores,
		Sockets:     1, // a template's sockets would multiply the cores
		MemoryMiB:   h.memMiB,
		Tags:        s.owner.tags(),
		Description: &desc,
		// No balloon: the job gets the memory it asked for, and a
		// template's balloon larger than that memory is refused.
		Options: map[string]string{"balloon": "0"},
	}
	if sh.cpulimit > 0 {
		u.Options["cpulimit"] = strconv.FormatFloat(sh.cpulimit, 'f', 2, 64)
	}
	// A clone copies the template's protection, which would keep it from
	// ever being destroyed.
	if cfg.Option("protection") == "1" {
		u.Delete = append(u.Delete, "protection")
	}
	// Its disks are left out of backups: vzdump --all neither freezes a
	// running job nor keeps its secrets. Only the buses' drives have a
	// backup key: an EFI vars disk or a TPM state (UEFI templates) given
	// one is refused (qemu-server Drive.pm $efidisk_fmt, $tpmstate_fmt),
	// and vzdump always takes both anyway.
	for _, k := range diskKeys(cfg) {
		if v := cfg.Option(k); isBusDisk(k) && !strings.Contains(v, "media=cdrom") {
			u.Options[k] = withDriveOption(v, "backup", "0")
		}
	}
	proxied := spec.Network && spec.Egress != nil
	switch {
	case !spec.Network:
		u.Delete = append(u.Delete, netKeys(cfg)...) // no NIC: the job reaches nothing, the agent still works
	case b.cfg.Bridge != "":
		u.Nets = map[int]string{0: jobNet(cfg.Option("net0"), b.cfg.Bridge, b.cfg.VLAN)}
	}
	if proxied {
		// Its one NIC, behind the firewall (egress.go); a NIC the rules
		// do not cover goes.
		if b.cfg.Egress == nil {
			return fmt.Errorf("proxmox: this backend has no egress proxy (PROXMOX_EGRESS_PROXY): %w", errFirewall)
		}
		if len(spec.Egress.CACert) > 0 {
			return errors.New("proxmox: injected credentials need the job's CA in the VM's trust, which this backend does not install")
		}
		if err := b.checkFirewallOn(ctx, s.node); err != nil {
			return err
		}
		net0 := cfg.Option("net0")
		if u.Nets != nil {
			net0 = u.Nets[0]
		}
		if net0 == "" {
			return fmt.Errorf("proxmox: template of VM %d has no net0 to put behind the firewall: %w", s.vmid, errFirewall)
		}
		u.Nets = map[int]string{0: withDriveOption(net0, "firewall", "1")}
		for _, k := range netKeys(cfg) {
			if k != "net0" {
				u.Delete = append(u.Delete, k)
			}
		}
	}
	if err := b.c.SetVMConfig(ctx, s.node, s.vmid, u); err != nil {
		return fmt.Errorf("proxmox: configure VM %d: %w", s.vmid, privilegeHint(err))
	}
	if proxied {
		spec.Step(fmt.Sprintf("setting VM %d's firewall: only the egress proxy", s.vmid))
		if err := b.setFirewall(ctx, s); err != nil {
			return err
		}
	}
	if disk, size := bootDisk(cfg); disk != "" && spec.DiskBytes > size {
		upid, err := b.c.ResizeDisk(ctx, s.node, s.vmid, disk, strconv.FormatInt((spec.DiskBytes+(1<<30)-1)>>30, 10)+"G")
		if err == nil {
			err = b.c.WaitTask(ctx, s.node, upid)
		}
		if err != nil {
			return fmt.Errorf("proxmox: resize %s of VM %d: %w", disk, s.vmid, privilegeHint(err))
		}
	}
	// Idle pool VMs destroyed to make room for this one: it starts once
	// they are gone, so that the node never holds both.
	for _, v := range h.evict {
		select {
		case <-v.gone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	spec.Step(fmt.Sprintf("starting VM %d", s.vmid))
	upid, err := b.c.StartVM(ctx, s.node, s.vmid)
	if err == nil {
		err = b.c.WaitTask(ctx, s.node, upid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: start VM %d: %w", s.vmid, privilegeHint(err))
	}
	spec.Step("waiting for the guest agent")
	if err := b.waitAgent(ctx, s); err != nil {
		return err
	}
	if err := b.checkAgent(ctx, s, h.info); err != nil {
		return err
	}
	if proxied {
		if err := b.pinAddress(ctx, s); err != nil {
			return err
		}
	}
	return s.prepare(ctx)
}

// diskKeys lists the drive keys of a config (disks and CD-ROMs).
func diskKeys(cfg pve.VMConfig) []string {
	var keys []string
	for k := range cfg.Raw {
		if isDiskKey(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// withDriveOption sets key=value in a drive (or NIC) string, keeping the
// rest.
func withDriveOption(drive, key, value string) string {
	parts := strings.Split(drive, ",")
	for i, p := range parts {
		if k, _, _ := strings.Cut(p, "="); k == key && i > 0 {
			parts[i] = key + "=" + value
			return strings.Join(parts, ",")
		}
	}
	return drive + "," + key + "=" + value
}

// jobNet is a NIC of the clone moved to the job's bridge and VLAN: its
// model, MAC and other options (firewall, rate, mtu, queues...) stay, so
// that the template's firewall still applies. A clone without a NIC gets
// a virtio one.
func jobNet(net, bridge string, vlan int) string {
	if net == "" {
		net = "virtio"
	}
	var parts []string
	for _, p := range strings.Split(net, ",") {
		if k, _, _ := strings.Cut(p, "="); k != "bridge" && k != "tag" {
			parts = append(parts, p)
		}
	}
	out := parts[0] + ",bridge=" + bridge
	if vlan > 0 {
		out += ",tag=" + strconv.Itoa(vlan)
	}
	for _, p := range parts[1:] {
		out += "," + p
	}
	return out
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

// waitAgent polls the guest agent until it answers. Until its deadline
// every error that may pass is waited out: the agent not up yet, and any
// transient 5xx or transport error; what cannot pass (the VM gone or
// stopped, no agent configured, a refused token) ends the wait at once.
//
// The pings back off: a ping to a guest that is still booting holds one
// of its node's three pvedaemon workers for 3 s (qemu-server's
// qga_check_running), so pinging without a pause keeps a worker busy for
// each booting VM (the client's per-node bound keeps one free whatever
// happens). The first comes a PollInterval after the start (no guest
// answers sooner), then the pauses grow by half from half a PollInterval
// to two: a booting VM holds a worker at most about two thirds of the
// time, and is found ready at most some 5 s after it is.
func (b *Backend) waitAgent(ctx context.Context, s *vmSandbox) error {
	deadline := time.Now().Add(b.cfg.AgentTimeout)
	pause := b.cfg.PollInterval
	for first := true; ; first = false {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		if first {
			pause = b.cfg.PollInterval / 2
		} else {
			pause = min(pause*3/2, 2*b.cfg.PollInterval)
		}
		err := b.c.AgentPing(ctx, s.node, s.vmid)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if lastingAgentError(err) {
			return fmt.Errorf("proxmox: guest agent of VM %d: %w", s.vmid, privilegeHint(err))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxmox: the guest agent of VM %d did not answer within %s (is qemu-guest-agent installed and enabled in the template?): %w",
				s.vmid, b.cfg.AgentTimeout, err)
		}
	}
}

// lastingAgentError: an agent call failed in a way waiting cannot change.
func lastingAgentError(err error) bool {
	var api *pve.APIError
	if errors.As(err, &api) && api.StatusCode >= 400 && api.StatusCode < 500 {
		return true // refused: parameters, token, privileges
	}
	return pve.IsNotFound(err) || pve.IsVMNotRunning(err) || pve.IsAgentNotConfigured(err)
}

// privilegeHint names the privilege a 403 says the token lacks.
func privilegeHint(err error) error {
	if path, priv := pve.MissingPrivilege(err); priv != "" {
		return fmt.Errorf("the API token lacks %s on %s (see docs/PROXMOX.md for the role delegate needs): %w", priv, path, err)
	}
	return err
}

// locate finds a VM's listing; ErrGone if it does not exist.
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

// Recover implements sandbox.Backend: a VM of ours that still exists.
func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Instance, error) {
	vmid, job, err := parseID(id)
	if err != nil {
		return nil, err
	}
	r, err := b.locate(ctx, vmid)
	if err != nil {
		return nil, err
	}
	o := owner{b.cfg.Instance, job}
	cfg, err := b.c.VMConfig(ctx, r.Node, vmid)
	if pve.IsNotFound(err) {
		return nil, fmt.Errorf("proxmox: VM %d: %w", vmid, sandbox.ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("proxmox: read config of VM %d: %w", vmid, err)
	}
	if !o.owns(cfg) {
		return nil, fmt.Errorf("proxmox: VM %d is not this server's VM of %s (it is named %q): %w", vmid, orLegacy(job), cfg.Name, sandbox.ErrGone)
	}
	b.remember(vmid, r.Node)
	return &vmSandbox{b: b, vmid: vmid, node: r.Node, owner: o}, nil
}

// remember notes the node of a VM of this server.
func (b *Backend) remember(vmid int, node string) {
	b.holdMu.Lock()
	b.nodes[vmid] = node
	b.holdMu.Unlock()
}

// nodeOf is the node this server last saw a VM on ("" if unknown).
func (b *Backend) nodeOf(vmid int) string {
	b.holdMu.Lock()
	defer b.holdMu.Unlock()
	return b.nodes[vmid]
}

func orLegacy(job string) string {
	if job == "" {
		return "its job"
	}
	return "job " + job
}

// List implements sandbox.Backend: this instance's VMs, each with its
// job, as /cluster/resources shows them (see listedJob). A VM with a
// lock is left out: an operation (its clone, most likely) is at work on
// it, and the sweep must wait for it to end.
func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) {
	resources, err := b.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	var out []sandbox.Info
	locked := map[int]bool{}
	for _, r := range resources {
		job := listedJob(r, b.cfg.Instance)
		if r.Lock != "" {
			if job != "" {
				locked[int(r.VMID)] = true
				b.lockedVM(r, job)
			}
			continue
		}
		if job != "" {
			out = append(out, sandbox.Info{ID: sandboxID(int(r.VMID), job), JobID: job})
		}
	}
	b.holdMu.Lock()
	for id := range b.locked {
		if !locked[id] {
			delete(b.locked, id)
		}
	}
	b.holdMu.Unlock()
	return out, nil
}

// lockedSince is when the sweep first saw a VM of ours locked.
type lockedSince struct {
	lock     string
	since    time.Time
	reported bool
}

// lockedVM notes a VM of ours the sweep must skip because it is locked,
// and reports it once its lock has lasted StaleLockAfter with no
// operation of this server on it: a clone or create that died half-way
// (its node rebooted) leaves the lock, and only root may clear it (qm
// unlock, or skiplock, which Proxmox refuses to API tokens), so the VM
// would stay for ever unseen.
func (b *Backend) lockedVM(r pve.Resource, job string) {
	vmid := int(r.VMID)
	b.holdMu.Lock()
	l, seen := b.locked[vmid]
	if !seen || l.lock != r.Lock {
		l = lockedSince{lock: r.Lock, since: time.Now()}
	}
	report := !l.reported && time.Since(l.since) >= b.cfg.StaleLockAfter
	l.reported = l.reported || report
	b.locked[vmid] = l
	b.holdMu.Unlock()
	if report && !b.inFlight(vmid) {
		b.log.Warn("a VM of this server has been locked too long to be an operation in progress, and cannot be destroyed while it is: "+
			"clear its lock as root on its node (qm unlock "+strconv.Itoa(vmid)+"), and the next cleanup destroys it",
			"vmid", vmid, "node", r.Node, "lock", r.Lock, "job", job, "locked_for", time.Since(l.since).Round(time.Second))
	}
}

// Destroy implements sandbox.Backend. A VM that is no longer the one the
// id names (destroyed, its vmid reused by another owner) is left alone.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	vmid, job, err := parseID(id)
	if err != nil {
		return nil // not ours: nothing to destroy
	}
	// One destroy of a sandbox at a time in this process: the engine
	// ends a kept sandbox and its sweep finds the VM of an ended sandbox
	// at the same moment; the second waits for the first's result rather
	// than send a stop and a delete of its own to a VM being deleted.
	b.destroyMu.Lock()
	if b.destroying == nil {
		b.destroying = map[string]*destroyCall{}
	}
	if d := b.destroying[id]; d != nil {
		b.destroyMu.Unlock()
		select {
		case <-d.done:
			return d.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d := &destroyCall{done: make(chan struct{})}
	b.destroying[id] = d
	b.destroyMu.Unlock()
	d.err = b.destroy(ctx, vmid, job)
	b.destroyMu.Lock()
	delete(b.destroying, id)
	b.destroyMu.Unlock()
	close(d.done)
	return d.err
}

// destroyCall is a Destroy under way; done closes when err is set.
type destroyCall struct {
	done chan struct{}
	err  error
}

func (b *Backend) destroy(ctx context.Context, vmid int, job string) error {
	o := owner{b.cfg.Instance, job}
	if node := b.nodeOf(vmid); node != "" {
		ok, found, err := b.owned(ctx, node, vmid, o)
		switch {
		case err != nil:
			return err
		case found && !ok:
			return nil
		case found:
			return b.remove(ctx, node, vmid, o)
		}
		// Not there (any more): it may have migrated.
	}
	r, err := b.locate(ctx, vmid)
	if errors.Is(err, sandbox.ErrGone) {
		b.dropHolds(vmid)
		return nil
	}
	if err != nil {
		return err
	}
	return b.destroyVM(ctx, r.Node, vmid, o)
}

// destroyVM stops (at once: the guest is not trusted to shut down) and
// deletes a VM with its disks, after making sure that it is o's: a vmid
// may have been reused by anyone since.
func (b *Backend) destroyVM(ctx context.Context, node string, vmid int, o owner) error {
	if ok, err := b.ownedBy(ctx, node, vmid, o); err != nil || !ok {
		return err
	}
	return b.remove(ctx, node, vmid, o)
}

// remove stops and deletes a VM known to be o's, retrying while it is
// locked. Before each retry the VM's owner is read again: another
// process may have destroyed it meanwhile, and its vmid been reused.
func (b *Backend) remove(ctx context.Context, node string, vmid int, o owner) error {
	var last error
	unprotected := false
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(b.cfg.PollInterval):
			}
			ok, found, err := b.owned(ctx, node, vmid, o)
			switch {
			case err != nil:
				last = err
				continue
			case !found:
				return nil
			case !ok:
				return nil
			}
		}
		upid, err := b.c.StopVM(ctx, node, vmid)
		if err == nil {
			err = b.waitQuietly(ctx, node, upid)
		}
		if err != nil && pve.IsNotFound(err) {
			b.dropHolds(vmid)
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
		if err != nil && attempt == 0 {
			// Not stopped by us: it may have been destroyed by another
			// process since its owner was read, and its vmid taken by a
			// new VM (not running yet). Read the owner again.
			if ok, found, oerr := b.owned(ctx, node, vmid, o); oerr == nil && (!found || !ok) {
				return nil
			}
		}
		// Not destroy-unreferenced-disks: a fresh clone has none, and with
		// it every destroy on the node fails while any of its image
		// storages is offline ("storage 'x' is not online"), for ever.
		upid, err = b.c.DeleteVM(ctx, node, vmid, pve.DeleteOptions{Purge: true})
		if err == nil {
			err = b.waitQuietly(ctx, node, upid)
		}
		if pve.IsProtected(err) && !unprotected {
			unprotected = true
			// A VM made before its template's protection was cleared on
			// clones: ours, so its protection goes.
			b.log.Info("clearing the protection a VM of ours copied from its template", "vmid", vmid, "node", node)
			if perr := b.c.SetVMConfig(ctx, node, vmid, pve.VMConfigUpdate{Delete: []string{"protection"}}); perr != nil {
				err = fmt.Errorf("%w (and clearing its protection failed: %w)", err, privilegeHint(perr))
			} else {
				attempt--
			}
		}
		if err == nil || pve.IsNotFound(err) {
			b.dropHolds(vmid)
			b.log.Info("destroyed VM", "vmid", vmid, "node", node, "job", o.job)
			if p := b.pool.Load(); p != nil {
				p.roomFreed()
			}
			return nil
		}
		last = err
	}
	return fmt.Errorf("proxmox: destroy VM %d: %w", vmid, privilegeHint(last))
}

// waitQuietly waits for a task nobody waits on (a stop or delete after
// the job ended): it looks every PollInterval, first after half of it,
// rather than WaitTask's quick first polls. A failed task is read by
// WaitTask, which fetches its log.
func (b *Backend) waitQuietly(ctx context.Context, node, upid string) error {
	wait := b.cfg.PollInterval / 2
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		st, err := b.c.TaskStatus(ctx, node, upid)
		if err != nil {
			return err
		}
		if !st.Running() {
			if st.OK() {
				return nil
			}
			return b.c.WaitTask(ctx, node, upid)
		}
		wait = b.cfg.PollInterval
	}
}

// ownedBy reads a VM's config and says whether it is o's. A VM that does
// not exist is not (and that is no error).
func (b *Backend) ownedBy(ctx context.Context, node string, vmid int, o owner) (bool, error) {
	ok, _, err := b.owned(ctx, node, vmid, o)
	return ok, err
}

// owned is ownedBy that also says whether the VM was found on node.
func (b *Backend) owned(ctx context.Context, node string, vmid int, o owner) (ok, found bool, err error) {
	cfg, err := b.c.VMConfig(ctx, node, vmid)
	if pve.IsNotFound(err) {
		b.dropHolds(vmid)
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("proxmox: read config of VM %d: %w", vmid, privilegeHint(err))
	}
	if !o.owns(cfg) {
		b.log.Info("leaving alone a VM that is not ours", "vmid", vmid, "name", cfg.Name, "want", o.vmName())
		return false, true, nil
	}
	return true, true, nil
}
