package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Placement. A job's VM goes to a node that holds its template (a linked
// clone stays on its template's node), or to any node when the template's
// disks are on shared storage. The room on a node is the memory VMs may
// use there less the configured memory of every VM that runs on it or is
// about to: running VMs, VMs being cloned or otherwise locked, delegate's
// VMs of any instance, and the clones this server has in flight. Proxmox's
// own "mem" is no use for this: it lags ~10 s and counts what guests use,
// not what they were given.
//
// What VMs may use on a node: PROXMOX_NODE_MEMORY if the operator set it,
// else the node's maxmem less HostReserve. Without Sys.Audit on /nodes
// Proxmox does not show maxmem; without the setting either, placement is
// blind: jobs go to their template's node unchecked, and the log says so.

// HostReserve is what a node keeps for itself when its capacity comes
// from maxmem: Proxmox asks for 2 GB for the OS and its services.
const HostReserve = 2 << 30

// hold is room reserved on a node for one VM: from Admit until the VM
// is destroyed (or the reservation is released unused). It is the
// sandbox.Admission the proxmox backend hands out.
type hold struct {
	p      *placer
	node   string
	tpl    pve.Resource // the template to clone
	info   *templateInfo
	target bool // clone with target (the template's disks are shared)
	memMiB int
	cores  int

	// pooled is the warm VM reserved for the job instead (pool.go): its
	// room is counted already, as a VM of the cluster.
	pooled *poolVM
	pool   *pool
	// evict are idle pool VMs destroyed to make this room: the VM starts
	// once they are gone.
	evict []*poolVM

	// Guarded by p.mu.
	vmid int  // the vmid being cloned, then the VM's
	used bool // Create made the VM: the hold ends when the VM is destroyed
}

// Release implements sandbox.Admission.
func (h *hold) Release() {
	h.p.mu.Lock()
	used := h.used
	if !used && h.pooled == nil {
		delete(h.p.holds, h)
	}
	h.p.mu.Unlock()
	if !used && h.pooled != nil {
		h.pool.release(h.pooled)
	}
}

// cloning records the vmid a clone for this hold is trying, so that the
// listing does not count it twice.
func (h *hold) cloning(vmid int) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.vmid = vmid
}

// bind records the VM that now holds the room; Release no longer frees it.
func (h *hold) bind(vmid int) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.vmid, h.used = vmid, true
}

// placer chooses the node and template of each new VM and holds its
// room there until the VM is gone (placement.go).
type placer struct {
	c    *pve.Client
	cfg  *Config
	log  *slog.Logger
	tpls templateSource
	// pool is the warm pool, when there is one (it may give way to jobs).
	pool func() idlePool

	placeMu sync.Mutex // one placement at a time

	mu       sync.Mutex
	holds    map[*hold]struct{}
	blindWhy string
	haBlind  bool // the HA status could not be read (logged once)
	// haAudit: the token may read the HA status (Sys.Audit on /), as its
	// permissions said at haChecked.
	haAudit   bool
	haChecked time.Time
	// drained are the nodes drained (DrainMarker), as read at drainedAt.
	drained   map[string]bool
	drainedAt time.Time
	// off are the nodes the last placement left out (drained, or in HA
	// maintenance).
	off map[string]bool
}

// isOff: the last placement found the node drained or in HA maintenance
// mode (the warm pool gives no VM of it to a job).
func (p *placer) isOff(node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.off[node]
}

// templateSource is the templates as placement sees them.
type templateSource interface {
	find(ctx context.Context, resources []pve.Resource, name string) ([]pve.Resource, error)
	info(ctx context.Context, t pve.Resource) (*templateInfo, error)
	refusal(info *templateInfo) string
}

// idlePool is the warm pool as placement sees it: idle VMs that give
// way to jobs, and jobs it must let go first.
type idlePool interface {
	evict(ctx context.Context, node string, free, need int64, resources []pve.Resource) []*poolVM
	starve(job string)
	fed(job string)
	roomFreed()
}

func newPlacer(c *pve.Client, cfg *Config, log *slog.Logger, tpls templateSource, pool func() idlePool) *placer {
	return &placer{c: c, cfg: cfg, log: log, tpls: tpls, pool: pool, holds: map[*hold]struct{}{}}
}

// freed forgets the room of a VM that is gone: it is free for the next.
func (p *placer) freed(vmid int) {
	p.mu.Lock()
	for h := range p.holds {
		if h.used && h.vmid == vmid { // not a reservation still cloning
			delete(p.holds, h)
		}
	}
	p.mu.Unlock()
	if pl := p.pool(); pl != nil {
		pl.roomFreed()
	}
}

// memMiB is the VM memory a spec asks for.
func memMiB(spec sandbox.Spec) int {
	return int(max(16, (spec.MemoryBytes+(1<<20)-1)>>20))
}

// place finds room for a new VM. forPool: it is for the warm pool,
// which never takes room from jobs.
func (p *placer) place(ctx context.Context, spec sandbox.Spec, forPool bool) (*hold, error) {
	h, err := p.placeOnce(ctx, spec, forPool)
	if pl := p.pool(); pl != nil && !forPool {
		if errors.Is(err, sandbox.ErrNoCapacity) {
			pl.starve(spec.JobID)
		} else {
			pl.fed(spec.JobID)
		}
	}
	return h, err
}

func (p *placer) placeOnce(ctx context.Context, spec sandbox.Spec, forPool bool) (*hold, error) {
	tplName := spec.Template
	if tplName == "" {
		tplName = p.cfg.Template
	}
	if tplName == "" {
		return nil, fmt.Errorf("vmTemplate: no template given and DEFAULT_VM_TEMPLATE is not set")
	}
	p.placeMu.Lock()
	defer p.placeMu.Unlock()
	resources, err := p.c.ClusterResources(ctx, pve.ResourceAll)
	if err != nil {
		return nil, fmt.Errorf("proxmox: read the cluster's resources: %w", err)
	}
	tpls, err := p.tpls.find(ctx, resources, tplName)
	if err != nil {
		return nil, err
	}
	off := p.maintenance(ctx, resources)
	p.mu.Lock()
	p.off = off
	p.mu.Unlock()
	cl := p.survey(ctx, resources, off)
	need := memMiB(spec)
	cores := shapeOf(spec.CPU, spec.MemoryBytes).cores

	// The candidates: every online node that holds one of the templates,
	// and every online node if a template's disks are all shared.
	type cand struct {
		node   string
		tpl    pve.Resource
		info   *templateInfo
		target bool
	}
	var cands []cand
	seen := map[string]bool{}
	for _, t := range tpls {
		if cl.nodes[t.Node] == nil {
			continue
		}
		info, err := p.tpls.info(ctx, t)
		if err != nil {
			return nil, err
		}
		if why := p.tpls.refusal(info); why != "" {
			return nil, fmt.Errorf("vmTemplate: %s", why)
		}
		if !seen[t.Node] {
			seen[t.Node] = true
			cands = append(cands, cand{t.Node, t, info, false})
		}
	}
	for _, t := range tpls {
		if cl.nodes[t.Node] == nil {
			continue
		}
		info, _ := p.tpls.info(ctx, t) // cached above
		if info == nil || !cl.shared(t.Node, info.storages) {
			continue
		}
		for _, n := range cl.order {
			if !seen[n] {
				seen[n] = true
				cands = append(cands, cand{n, t, info, true})
			}
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("vmTemplate: every node holding template %q is offline", tplName)
	}
	// A VM may not have more vCPUs than its node has cores (qemu-server
	// config_to_command: "MAX n vcpus allowed per VM on this node"): only
	// nodes with enough cores are candidates (all, when Proxmox shows this
	// token no node's cores).
	mostCores := 0
	fit := cands[:0:0]
	for _, c := range cands {
		n := cl.nodes[c.node]
		mostCores = max(mostCores, n.cores)
		if n.cores == 0 || n.cores >= cores {
			fit = append(fit, c)
		}
	}
	if len(fit) == 0 {
		return nil, fmt.Errorf("resources.cpu: %d cores is more than any node that can run template %q has (at most %d)", cores, tplName, mostCores)
	}
	cands = fit

	known := false
	for _, c := range cands {
		if cl.nodes[c.node].capacity > 0 {
			known = true
		}
	}
	if !known {
		// Blind: Proxmox shows no node memory to this token and the
		// operator set none. The template's own node is the best guess.
		p.blind(cl.why)
		c := cands[0]
		return p.reserve(c.node, c.tpl, c.info, c.target, need, cores), nil
	}

	best, bestFree := -1, int64(0)
	var views []string
	biggest := int64(0)
	frees := make([]int64, len(cands))
	for i, c := range cands {
		n := cl.nodes[c.node]
		if n.capacity <= 0 {
			continue
		}
		heldMem, heldCPU := p.heldOn(c.node, cl.vmids)
		free := n.capacity - n.used - heldMem
		frees[i] = free
		biggest = max(biggest, n.capacity)
		view := fmt.Sprintf("%s %d of %d MiB", c.node, max(0, free)>>20, n.capacity>>20)
		cpuOK := true
		if r := p.cfg.CPUOvercommit; r > 0 && n.cores > 0 {
			// vCPUs are reserved only when the operator sets a ratio.
			room := int(float64(n.cores)*r) - n.usedCPU - heldCPU
			cpuOK = room >= cores
			view += fmt.Sprintf(", %d of %d vCPUs", max(0, room), int(float64(n.cores)*r))
		}
		views = append(views, view)
		// A linked clone on the template's node beats a clone elsewhere;
		// then the most room.
		if cpuOK && free >= int64(need)<<20 && (best < 0 || (cands[best].target && !c.target) || (cands[best].target == c.target && free > bestFree)) {
			best, bestFree = i, free
		}
	}
	if pl := p.pool(); best < 0 && pl != nil && !forPool && int64(need)<<20 <= biggest {
		// Idle pool VMs give way to a job: those of a node where they
		// make enough room (a linked clone's node first) are destroyed.
		order := make([]int, 0, len(cands))
		for i, c := range cands {
			if !c.target && cl.nodes[c.node].capacity > 0 {
				order = append(order, i)
			}
		}
		for i, c := range cands {
			if c.target && cl.nodes[c.node].capacity > 0 {
				order = append(order, i)
			}
		}
		for _, i := range order {
			c := cands[i]
			if victims := pl.evict(ctx, c.node, frees[i], int64(need)<<20, resources); victims != nil {
				h := p.reserve(c.node, c.tpl, c.info, c.target, need, cores)
				h.evict = victims
				return h, nil
			}
		}
	}
	if best < 0 {
		if int64(need)<<20 > biggest {
			return nil, fmt.Errorf("resources.memory: %d MiB is more than any node that can run template %q has for VMs (at most %d MiB; PROXMOX_NODE_MEMORY or the nodes' memory less %d MiB for the host)",
				need, tplName, biggest>>20, HostReserve>>20)
		}
		what := fmt.Sprintf("%d MiB", need)
		if p.cfg.CPUOvercommit > 0 {
			what += fmt.Sprintf(" and %d vCPUs", cores)
		}
		return nil, &sandbox.CapacityError{Reason: fmt.Sprintf("no node has %s free for a VM of template %q (free: %s)", what, tplName, strings.Join(views, "; "))}
	}
	c := cands[best]
	return p.reserve(c.node, c.tpl, c.info, c.target, need, cores), nil
}

func (p *placer) reserve(node string, tpl pve.Resource, info *templateInfo, target bool, need, cores int) *hold {
	h := &hold{p: p, node: node, tpl: tpl, info: info, target: target, memMiB: need, cores: cores}
	p.mu.Lock()
	p.holds[h] = struct{}{}
	p.mu.Unlock()
	return h
}

// heldOn is the memory and vCPUs this server has reserved on a node, for
// VMs not yet in the listing (or counted by their hold instead). A hold
// whose VM is no longer listed is gone (destroyed by another process): it
// is dropped.
func (p *placer) heldOn(node string, listed map[int]bool) (mem int64, cpus int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.holds {
		if h.used && !listed[h.vmid] {
			delete(p.holds, h)
			continue
		}
		if h.node == node {
			mem += int64(h.memMiB) << 20
			cpus += h.cores
		}
	}
	return mem, cpus
}

// holdsVM reports whether a hold of this server counts a VM.
func (p *placer) holdsVM(vmid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.holds {
		if h.vmid == vmid {
			return true
		}
	}
	return false
}

// blind logs, once per reason, that placement cannot see node memory.
func (p *placer) blind(why string) {
	p.mu.Lock()
	again := p.blindWhy == why
	p.blindWhy = why
	p.mu.Unlock()
	if !again {
		p.log.Warn("placement is blind: jobs go to their template's node without a capacity check", "why", why)
	}
}

// maintenance reads which nodes take no new VM: those in HA maintenance
// mode (ha-manager crm-command node-maintenance enable NODE, or a reboot
// with the "migrate" shutdown policy), as the HA manager itself moves
// its services off them, and those drained (delegate proxmox drain: a
// line of DrainMarker in the node's notes), read at most every
// Config.NodeNotesTTL. Reading either needs Sys.Audit on /, which the token's own
// permissions say (asked once in a while, so that a token without it is
// never refused); without it (or without HA) none is known, and the log
// says so once.
func (p *placer) maintenance(ctx context.Context, resources []pve.Resource) map[string]bool {
	p.mu.Lock()
	can, checked := p.haAudit, p.haChecked
	p.mu.Unlock()
	if checked.IsZero() || time.Since(checked) > 10*time.Minute {
		perms, err := p.c.Permissions(ctx, "/")
		can = err == nil && perms["Sys.Audit"]
		p.mu.Lock()
		p.haAudit, p.haChecked = can, time.Now()
		p.mu.Unlock()
	}
	out := p.drainedNodes(ctx, resources)
	var st pve.HAStatus
	err := errors.New("the API token lacks Sys.Audit on /")
	if can {
		st, err = p.c.HAManagerStatus(ctx)
	}
	if err != nil {
		p.mu.Lock()
		again := p.haBlind
		p.haBlind = true
		p.mu.Unlock()
		if !again {
			p.log.Info("cannot read the HA manager's status or the nodes' notes: nodes in HA maintenance mode or drained are not known to placement", "err", err)
		}
		return out
	}
	for node, s := range st.NodeStatus {
		if s == "maintenance" {
			out[node] = true
		}
	}
	return out
}

// drainedNodes are the online nodes whose notes hold DrainMarker (none
// without Sys.Audit on /: see maintenance).
func (p *placer) drainedNodes(ctx context.Context, resources []pve.Resource) map[string]bool {
	p.mu.Lock()
	can, drained, read := p.haAudit, p.drained, p.drainedAt
	p.mu.Unlock()
	out := map[string]bool{}
	if !can {
		return out
	}
	if !read.IsZero() && time.Since(read) < p.cfg.NodeNotesTTL {
		for n := range drained {
			out[n] = true
		}
		return out
	}
	for _, r := range resources {
		if r.Type != "node" || r.Status != "online" {
			continue
		}
		nc, err := p.c.NodeConfig(ctx, r.Node)
		if err != nil {
			p.log.Debug("read a node's notes", "node", r.Node, "err", err)
			continue
		}
		if isDrained(nc.Description) {
			out[r.Node] = true
		}
	}
	p.mu.Lock()
	p.drained, p.drainedAt = out, time.Now()
	p.mu.Unlock()
	return maps.Clone(out)
}

// nodeRoom is what placement knows of one online node.
type nodeRoom struct {
	capacity int64 // what VMs may use; 0 when unknown
	used     int64 // configured memory of the VMs that count
	cores    int   // the node's cores; 0 when unknown
	usedCPU  int   // vCPUs of the VMs that count
}

// clusterView is one reading of /cluster/resources.
type clusterView struct {
	nodes    map[string]*nodeRoom // online nodes
	order    []string             // online nodes by name
	storages map[string]bool      // "node/storage" -> shared
	vmids    map[int]bool         // every VM listed
	why      string               // why no capacity is known, if so
}

func (cl *clusterView) shared(node string, storages []string) bool {
	if len(storages) == 0 {
		return false
	}
	for _, s := range storages {
		if !cl.storages[node+"/"+s] {
			return false
		}
	}
	return true
}

// survey reads the nodes' capacity and the memory their VMs hold.
func (p *placer) survey(ctx context.Context, resources []pve.Resource, maintenance map[string]bool) *clusterView {
	cl := &clusterView{nodes: map[string]*nodeRoom{}, storages: map[string]bool{}, vmids: map[int]bool{}}
	noMaxMem := false
	for _, r := range resources {
		switch r.Type {
		case "node":
			if r.Status != "online" || maintenance[r.Node] || (len(p.cfg.Nodes) > 0 && !slices.Contains(p.cfg.Nodes, r.Node)) {
				continue // not a node VMs may go to now (PROXMOX_NODES, HA maintenance)
			}
			n := &nodeRoom{cores: int(r.MaxCPU)}
			if m, ok := p.cfg.NodeMemory[r.Node]; ok {
				n.capacity = m
			} else if m, ok := p.cfg.NodeMemory[""]; ok {
				n.capacity = m
			} else if r.MaxMem > 0 {
				n.capacity = max(1, int64(r.MaxMem)-HostReserve)
			} else {
				noMaxMem = true
			}
			cl.nodes[r.Node] = n
			cl.order = append(cl.order, r.Node)
		case "storage":
			if bool(r.Shared) {
				cl.storages[r.Node+"/"+r.Storage] = true
			}
		case "qemu", "lxc":
			cl.vmids[int(r.VMID)] = true
		}
	}
	sort.Strings(cl.order)
	if noMaxMem {
		cl.why = "Proxmox shows this API token no node memory (it lacks Sys.Audit on /nodes) and PROXMOX_NODE_MEMORY is not set"
	}
	lookups := 0
	for _, r := range resources {
		n := cl.nodes[r.Node]
		if n == nil || (r.Type != "qemu" && r.Type != "lxc") || bool(r.Template) || p.holdsVM(int(r.VMID)) {
			continue
		}
		fresh := r.Status == "" || r.Status == "unknown" // no RRD data yet: a VM seconds old
		ours := strings.HasPrefix(r.Name, Tag+"-") || hasTagPrefix(r, Tag)
		if !(r.Status == "running" || r.Lock != "" || ours || (fresh && r.Type == "qemu")) {
			continue
		}
		mem, cpus := int64(r.MaxMem), int(r.MaxCPU)
		if mem == 0 && r.Type == "qemu" && lookups < maxMemoryLookups {
			// Fresh VMs are listed without maxmem: their config says (what
			// they run with, not what waits for their next start).
			lookups++
			if cfg, err := p.c.CurrentVMConfig(ctx, r.Node, int(r.VMID)); err == nil && !bool(cfg.Template) {
				mem = int64(cfg.MemoryMiB()) << 20
				cpus = max(1, int(cfg.Cores)) * max(1, int(cfg.Sockets))
			}
		}
		n.used += mem
		n.usedCPU += cpus
	}
	return cl
}

// maxMemoryLookups bounds the config reads of one placement.
const maxMemoryLookups = 8

func hasTagPrefix(r pve.Resource, prefix string) bool {
	for _, t := range r.TagList() {
		if t == prefix || strings.HasPrefix(t, prefix+"-") {
			return true
		}
	}
	return false
}

// diskStorages lists the storages of a VM's drives: its disks, and its
// CD-ROMs and cloud-init drive on a storage (not "none", nor the host's
// drive "cdrom"), which Proxmox's clone counts too.
func diskStorages(cfg pve.VMConfig) []string {
	var out []string
	for k := range cfg.Raw {
		if !isDiskKey(k) {
			continue
		}
		vol := volumeOf(cfg.Option(k))
		if vol == "none" || vol == "" || vol == "cdrom" || strings.HasPrefix(vol, "/") {
			continue
		}
		if sid, _, ok := strings.Cut(vol, ":"); ok && !containsStr(out, sid) {
			out = append(out, sid)
		}
	}
	sort.Strings(out)
	return out
}

// isBusDisk: k is a drive on a bus (scsiN, virtioN, sataN, ideN), whose
// format has the options of a disk (backup among them); efidisk0 and
// tpmstate0 have formats of their own.
func isBusDisk(k string) bool {
	for _, bus := range []string{"scsi", "virtio", "sata", "ide"} {
		if n, ok := strings.CutPrefix(k, bus); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return true
			}
		}
	}
	return false
}

func isDiskKey(k string) bool {
	for _, bus := range []string{"scsi", "virtio", "sata", "ide", "efidisk", "tpmstate"} {
		if n, ok := strings.CutPrefix(k, bus); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return true
			}
		}
	}
	return false
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
