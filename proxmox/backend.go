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
	"regexp"
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

// Paths inside the guest. guestDir holds delegate's own files, so that
// the workspace holds only the job's: the commands' bundles, their
// directories (inputs, output, status lines) and files on their way in
// parts. It is on the guest's disk, /var/tmp, not in /tmp, which is RAM
// on Debian 13 (a tmpfs of half the VM's memory): a command's output
// there would take the job's memory, and a big one would not fit. Where
// /var/tmp, not /var/lib: any agent user may make it (a root-owned
// directory is checked, prepareScript), and systemd-tmpfiles ages its
// files only after 30 days, longer than a job VM lives (docs/PROXMOX.md).
// legacyGuestDir is where a delegate before that put them: the commands
// it started are found there (parseExecID).
const (
	guestDir       = "/var/tmp/delegate"
	legacyGuestDir = "/tmp/delegate"
	guestOutput    = legacyGuestDir + "/output"
	guestEvents    = legacyGuestDir + "/events"
	// StatusFile is what the engine names the job's status channel
	// (Capabilities.StatusFile); each command's runner points
	// DELEGATE_STATUS_FILE at a FIFO of the command's own instead, which
	// it copies into the command's events file (exec.go).
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
	// StampInterval is how often this server stamps its VMs as seen
	// (gc.go), from its first cleanup sweep on; default
	// DefaultStampInterval.
	StampInterval time.Duration
	// VMIDRange, if set (ParseVMIDRange), bounds the vmids of this
	// server's VMs (PROXMOX_VMID_RANGE), so that they are told from the
	// cluster's other VMs at a glance, and backup or replication jobs can
	// leave them out; unset, any vmid /cluster/nextid gives.
	VMIDRange [2]int
	// NodeNotesTTL is how long the nodes' notes, which say whether a node
	// is drained (drain.go), are taken as read. Default 30 s.
	NodeNotesTTL time.Duration
	// Nodes, if set, are the only nodes job and pool VMs go to
	// (PROXMOX_NODES); unset, every node of the cluster. Nodes in HA
	// maintenance mode are left out either way.
	Nodes []string
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
	// AddressTimeout bounds the wait for a job VM's address (DHCP may
	// answer well after the guest agent). Default 60 s.
	AddressTimeout time.Duration
	// FirewallWait bounds the wait for a job VM's firewall to be in force
	// (Proxmox applies it on a 5-10 s cycle). Default 30 s.
	FirewallWait time.Duration
	// Egress, if set, routes jobs' networks through delegate's egress
	// proxy alone (egress.go): their VMs' firewalls let out nothing else.
	Egress *Egress
	// TransferURL, if set, is the callback server's URL as job VMs reach
	// it (CALLBACK_PUBLIC_URL), which serves Transfers at /transfer/:
	// the workspaces of VMs with a network then travel over HTTP
	// (transfer.go); unset, or a loopback URL, through the agent.
	TransferURL string
	// CheckpointDir, if set, is where the archives of checkpoints'
	// workspaces are kept on the server, which forks start from
	// (checkpoint.go); unset, sandboxes are not checkpointed.
	CheckpointDir string
	Logger        *slog.Logger
}

// Backend implements sandbox.Backend on a Proxmox VE cluster. It is a
// coordinator of parts, each with its own job and lock, calling each
// other through small interfaces they own:
//
//	tpls    the cluster's templates (template.go, agentcheck.go)
//	placer  where a new VM goes, and the room it holds (placement.go)
//	ids     vmids for clones (clone.go)
//	cloner  the clones themselves (clone.go)
//	vms     where this server's VMs are, and their ends (vms.go)
//	fw      the egress firewall of job VMs (egress.go)
//	pool    the warm pool, once KeepPool was called (pool.go)
//	ckpts   checkpoints, rollbacks and forks' files (checkpoint.go)
//
// and it makes a VM ready for a job itself (provision.go).
type Backend struct {
	c   *pve.Client
	cfg Config
	log *slog.Logger

	tpls   *templates
	placer *placer
	ids    *vmids
	cloner *cloner
	vms    *vmTable
	fw     *firewall
	pool   atomic.Pointer[pool]
	// stamps stamps this server's VMs as seen, once its sweep runs.
	stamps     *stamper
	stampsOnce sync.Once
	// ckpts checkpoints kept VMs and fills forks (checkpoint.go).
	ckpts *checkpoints
	// xfers carries workspaces over HTTP (transfer.go); nil: through the
	// agent, for the reason xferOff gives.
	xfers   *Transfers
	xferOff string
}

var (
	_ sandbox.Backend          = (*Backend)(nil)
	_ sandbox.Admitter         = (*Backend)(nil)
	_ sandbox.CheckpointKeeper = (*Backend)(nil)
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
	if cfg.NodeNotesTTL <= 0 {
		cfg.NodeNotesTTL = 30 * time.Second
	}
	if cfg.StampInterval <= 0 {
		cfg.StampInterval = DefaultStampInterval
	}
	if cfg.AddressTimeout <= 0 {
		cfg.AddressTimeout = time.Minute
	}
	if cfg.FirewallWait <= 0 {
		cfg.FirewallWait = 30 * time.Second
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
	if cfg.Egress != nil && cfg.Bridge == "" {
		return nil, errors.New("proxmox: PROXMOX_EGRESS_PROXY needs PROXMOX_JOB_BRIDGE (and PROXMOX_JOB_VLAN where that bridge carries other networks): " +
			"job VMs behind the proxy must be on a network of their own whose only other host is the proxy's, as Proxmox's firewall lets their DHCP packets out to any address " +
			"(docs/PROXMOX.md, \"A job network of its own\")")
	}
	if r := cfg.VMIDRange; r != ([2]int{}) {
		if _, _, err := ParseVMIDRange(fmt.Sprintf("%d-%d", r[0], r[1])); err != nil {
			return nil, fmt.Errorf("proxmox: %w", err)
		}
	}
	for _, n := range cfg.Nodes {
		if !nodeNameRe().MatchString(n) {
			return nil, fmt.Errorf("proxmox: PROXMOX_NODES: %q is not a node name (letters, digits and '-')", n)
		}
	}
	for node, m := range cfg.NodeMemory {
		if m < 1<<30 {
			return nil, fmt.Errorf("proxmox: node memory of %q must be at least 1G (got %d bytes)", node, m)
		}
	}
	b := &Backend{c: c, cfg: cfg, log: cfg.Logger.With("instance", cfg.Instance),
		xferOff: "the server serves no transfers (no callback URL for job VMs)"}
	if cfg.TransferURL != "" {
		var err error
		if b.xfers, b.xferOff, err = newTransfers(cfg.TransferURL, cfg.PollInterval, b.log); err != nil {
			return nil, err
		}
		if b.xfers == nil {
			b.log.Info("workspaces go through the guest agent", "why", b.xferOff)
		}
	}
	conf := &b.cfg
	b.tpls = newTemplates(c, conf, b.log)
	b.placer = newPlacer(c, conf, b.log, b.tpls, b.idlePool)
	b.ids = &vmids{c: c, lo: cfg.VMIDRange[0], hi: cfg.VMIDRange[1], cloning: map[int]bool{}}
	b.vms = newVMTable(c, conf, b.log, b.placer, b.ids)
	b.cloner = &cloner{c: c, cfg: conf, log: b.log, ids: b.ids, link: b.tpls, vms: b.vms}
	b.fw = &firewall{c: c, cfg: conf, egress: conf.Egress, log: b.log}
	b.ckpts = &checkpoints{b: b, dir: cfg.CheckpointDir}
	b.stamps = &stamper{c: c, instance: cfg.Instance, every: cfg.StampInterval, log: b.log, stamped: func(vmid int, digest string) {
		if p := b.pool.Load(); p != nil {
			p.restamped(vmid, digest)
		}
	}}
	return b, nil
}

var nodeNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`) })

// idlePool is the warm pool as placement sees it (nil: none).
func (b *Backend) idlePool() idlePool {
	if p := b.pool.Load(); p != nil {
		return p
	}
	return nil
}

// Instance is the id this backend's VMs carry.
func (b *Backend) Instance() string { return b.cfg.Instance }

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "proxmox" }

// Close implements sandbox.Backend: the warm pool's upkeep stops (its
// VMs stay, for the next server to adopt), the background work ends
// (destroys are waited for a while), and the API client's idle
// connections close. Job VMs go on. It reports what did not end well.
func (b *Backend) Close() error {
	var errs []error
	if p := b.pool.Load(); p != nil {
		p.stopOnce.Do(p.stop)
		errs = append(errs, p.stopErr)
	}
	b.tpls.close()
	b.stamps.close()
	errs = append(errs, b.vms.wait(30*time.Second))
	b.c.CloseIdleConnections()
	return errors.Join(errs...)
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
		// Snapshots without vmstate, and archives of the workspace for
		// forks (checkpoint.go).
		Checkpoint:              b.cfg.CheckpointDir != "",
		CheckpointMissing:       checkpointMissing(b.cfg.CheckpointDir),
		CheckpointMemoryMissing: checkpointMemoryMissing,
	}
}

func checkpointMissing(dir string) string {
	if dir == "" {
		return noCheckpointDir
	}
	return ""
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
	if spec.From == "" {
		s, err := b.create(ctx, spec)
		if err != nil {
			return nil, err
		}
		return instance(s), nil
	}
	// A fork: a new VM, and the checkpoint's files in it.
	f, err := b.ckpts.open(spec.From)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := b.create(ctx, spec)
	if err != nil {
		return nil, err
	}
	// A warm VM's NIC, which brought the files, goes in fill when the
	// fork has no network.
	if err := b.ckpts.fill(ctx, s, spec, f); err != nil {
		if derr := s.Destroy(context.WithoutCancel(ctx)); derr != nil {
			b.log.Warn("destroy a fork that could not be filled", "vmid", s.vmid, "err", derr)
		}
		return nil, err
	}
	return instance(s), nil
}

// DeleteCheckpoint implements sandbox.CheckpointKeeper (checkpoint.go).
func (b *Backend) DeleteCheckpoint(ctx context.Context, id string) error {
	return b.ckpts.delete(ctx, id)
}

// create makes a VM for a job (Create, without its files).
func (b *Backend) create(ctx context.Context, spec sandbox.Spec) (*vmSandbox, error) {
	h, _ := spec.Admission.(*hold)
	if h == nil || h.p != b.placer {
		var err error
		if h, err = b.admit(ctx, spec); err != nil {
			return nil, err
		}
		defer h.Release()
	}
	o := owner{b.cfg.Instance, spec.JobID}
	// A fork keeps a warm VM's NIC for its files (PoolConfig.Network),
	// where they can come over HTTP; a job without network never has it.
	keepNIC := spec.From != "" && b.xfers != nil
	for attempt := 1; h.pooled != nil; attempt++ {
		v := h.pooled
		err := h.pool.claim(ctx, v, spec, o, keepNIC)
		h.pool.forget(v)
		if err == nil {
			h.bind(v.vmid)
			return &vmSandbox{b: b, vmid: v.vmid, node: v.node, owner: o, kept: spec.MultiExec, nic: keepNIC && h.pool.cfg.Network}, nil
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
			if h, err = b.placer.place(ctx, spec, false); err != nil {
				return nil, err
			}
		}
		defer h.Release()
	}
	spec.Step(fmt.Sprintf("cloning from %s on %s", templateLabel(h.tpl), h.node))
	vmid, err := b.cloner.clone(ctx, h, o)
	if err != nil {
		return nil, err
	}
	h.bind(vmid)
	b.vms.remember(vmid, h.node)
	if err := b.configure(ctx, vmid, h.node, o, h, spec, jobDescription(spec.JobID)); err != nil {
		b.vms.destroyVM(context.WithoutCancel(ctx), h.node, vmid, o)
		return nil, err
	}
	return &vmSandbox{b: b, vmid: vmid, node: h.node, owner: o, kept: spec.MultiExec, nic: spec.Network}, nil
}

func templateLabel(t pve.Resource) string {
	if t.Name != "" {
		return t.Name
	}
	return strconv.Itoa(int(t.VMID))
}

// TemplateTagPrefix, followed by a template name, is a tag that makes a
// template one of those the name stands for, whatever its own name: the
// copies of one template on each node ("debian-job-pve1",
// "debian-job-pve2", each tagged "delegate-template-debian-job"), so
// that jobs are cloned from a node that is up.
const TemplateTagPrefix = "delegate-template-"

// templateNamed: a template listing is one of those name stands for: by
// its name (several nodes may have one of that name), its vmid, or its
// tag TemplateTagPrefix+name.
func templateNamed(r pve.Resource, name string) bool {
	return r.Name == name || strconv.Itoa(int(r.VMID)) == name || slices.Contains(r.TagList(), TemplateTagPrefix+tagOf(name))
}

// findTemplates finds the templates a job names (templateNamed).
func findTemplates(resources []pve.Resource, name string) ([]pve.Resource, error) {
	var out []pve.Resource
	for _, r := range resources {
		if r.Type == "qemu" && bool(r.Template) && templateNamed(r, name) {
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

// Recover implements sandbox.Backend: a VM of ours that still exists.
func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Instance, error) {
	vmid, job, err := parseID(id)
	if err != nil {
		return nil, err
	}
	r, err := b.vms.locate(ctx, vmid)
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
	b.vms.remember(vmid, r.Node)
	// A kept sandbox opened without a job has an sbx- id; a persistent
	// job's VM found again is not known to be kept (its commands'
	// directories then stay until it goes).
	return instance(&vmSandbox{b: b, vmid: vmid, node: r.Node, owner: o, kept: strings.HasPrefix(job, "sbx-"), nic: len(netKeys(cfg)) > 0}), nil
}

func orLegacy(job string) string {
	if job == "" {
		return "its job"
	}
	return "job " + job
}

// List implements sandbox.Backend: this instance's VMs, each with its
// job, as /cluster/resources shows them; locked ones are left out (see
// vmTable.list). The first List (the server's first cleanup sweep)
// starts the stamping of this server's VMs as seen (gc.go).
func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) {
	b.stampsOnce.Do(b.stamps.start)
	return b.vms.list(ctx)
}

// Destroy implements sandbox.Backend. A VM that is no longer the one the
// id names (destroyed, its vmid reused by another owner) is left alone.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	err := b.vms.destroyID(ctx, id)
	if vmid, _, perr := parseID(id); err == nil && perr == nil {
		b.ckpts.dropArchives(vmid)
	}
	return err
}

// Admit implements sandbox.Admitter: it chooses the template and node of
// a job's VM and reserves the room there. One placement runs at a time,
// so that two jobs never count the same room.
func (b *Backend) Admit(ctx context.Context, spec sandbox.Spec) (sandbox.Admission, error) {
	h, err := b.admit(ctx, spec)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// admit reserves a warm VM of the pool if one fits, else room for a
// cold one.
func (b *Backend) admit(ctx context.Context, spec sandbox.Spec) (*hold, error) {
	if h := b.poolHold(ctx, spec); h != nil {
		return h, nil
	}
	return b.placer.place(ctx, spec, false)
}

// poolHold reserves a warm VM for a job, or returns nil.
func (b *Backend) poolHold(ctx context.Context, spec sandbox.Spec) *hold {
	p := b.pool.Load()
	if p == nil {
		return nil
	}
	v := p.take(ctx, spec)
	if v == nil {
		return nil
	}
	p.fed(spec.JobID)
	return &hold{p: b.placer, node: v.node, memMiB: v.shape.memMiB, pooled: v, pool: p}
}

// CheckTemplate implements sandbox.TemplateChecker.
func (b *Backend) CheckTemplate(ctx context.Context, name string) error {
	return b.tpls.check(ctx, name)
}

// CheckResources implements sandbox.ResourceChecker.
func (b *Backend) CheckResources(ctx context.Context, spec sandbox.Spec) error {
	return b.tpls.checkCores(ctx, spec)
}
