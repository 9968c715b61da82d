package proxmox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	b      *Backend
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

	// Guarded by b.holdMu.
	vmid int  // the vmid being cloned, then the VM's
	used bool // Create made the VM: the hold ends when the VM is destroyed
}

// Release implements sandbox.Admission.
func (h *hold) Release() {
	h.b.holdMu.Lock()
	used := h.used
	if !used && h.pooled == nil {
		delete(h.b.holds, h)
	}
	h.b.holdMu.Unlock()
	if !used && h.pooled != nil {
		h.pool.release(h.pooled)
	}
}

// cloning records the vmid a clone for this hold is trying, so that the
// listing does not count it twice.
func (h *hold) cloning(vmid int) {
	h.b.holdMu.Lock()
	defer h.b.holdMu.Unlock()
	h.vmid = vmid
}

// bind records the VM that now holds the room; Release no longer frees it.
func (h *hold) bind(vmid int) {
	h.b.holdMu.Lock()
	defer h.b.holdMu.Unlock()
	h.vmid, h.used = vmid, true
}

// dropHolds forgets the room (and the node) of a VM that is gone.
func (b *Backend) dropHolds(vmid int) {
	b.holdMu.Lock()
	defer b.holdMu.Unlock()
	delete(b.nodes, vmid)
	for h := range b.holds {
		if h.used && h.vmid == vmid { // not a reservation still cloning
			delete(b.holds, h)
		}
	}
}

// memMiB is the VM memory a spec asks for.
func memMiB(spec sandbox.Spec) int {
	return int(max(16, (spec.MemoryBytes+(1<<20)-1)>>20))
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
	return b.place(ctx, spec, false)
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
	return &hold{b: b, node: v.node, memMiB: v.shape.memMiB, pooled: v, pool: p}
}

// place finds room for a new VM. forPool: it is for the warm pool,
// which never takes room from jobs.
func (b *Backend) place(ctx context.Context, spec sandbox.Spec, forPool bool) (*hold, error) {
	h, err := b.placeOnce(ctx, spec, forPool)
	if p := b.pool.Load(); p != nil && !forPool {
		if errors.Is(err, sandbox.ErrNoCapacity) {
			p.starve(spec.JobID)
		} else {
			p.fed(spec.JobID)
		}
	}
	return h, err
}

func (b *Backend) placeOnce(ctx context.Context, spec sandbox.Spec, forPool bool) (*hold, error) {
	tplName := spec.Template
	if tplName == "" {
		tplName = b.cfg.Template
	}
	if tplName == "" {
		return nil, fmt.Errorf("vmTemplate: no template given and DEFAULT_VM_TEMPLATE is not set")
	}
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	resources, err := b.c.ClusterResources(ctx, pve.ResourceAll)
	if err != nil {
		return nil, fmt.Errorf("proxmox: read the cluster's resources: %w", err)
	}
	tpls, err := b.findTemplates(ctx, resources, tplName)
	if err != nil {
		return nil, err
	}
	cl := b.survey(ctx, resources)
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
		info, err := b.template(ctx, t)
		if err != nil {
			return nil, err
		}
		if why := b.refusal(info); why != "" {
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
		info, _ := b.template(ctx, t) // cached above
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
		b.blind(cl.why)
		c := cands[0]
		return b.reserve(c.node, c.tpl, c.info, c.target, need, cores), nil
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
		heldMem, heldCPU := b.heldOn(c.node, cl.vmids)
		free := n.capacity - n.used - heldMem
		frees[i] = free
		biggest = max(biggest, n.capacity)
		view := fmt.Sprintf("%s %d of %d MiB", c.node, max(0, free)>>20, n.capacity>>20)
		cpuOK := true
		if r := b.cfg.CPUOvercommit; r > 0 && n.cores > 0 {
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
	if p := b.pool.Load(); best < 0 && p != nil && !forPool && int64(need)<<20 <= biggest {
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
			if victims := p.evict(ctx, c.node, frees[i], int64(need)<<20, resources); victims != nil {
				h := b.reserve(c.node, c.tpl, c.info, c.target, need, cores)
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
		if b.cfg.CPUOvercommit > 0 {
			what += fmt.Sprintf(" and %d vCPUs", cores)
		}
		return nil, &sandbox.CapacityError{Reason: fmt.Sprintf("no node has %s free for a VM of template %q (free: %s)", what, tplName, strings.Join(views, "; "))}
	}
	c := cands[best]
	return b.reserve(c.node, c.tpl, c.info, c.target, need, cores), nil
}

func (b *Backend) reserve(node string, tpl pve.Resource, info *templateInfo, target bool, need, cores int) *hold {
	h := &hold{b: b, node: node, tpl: tpl, info: info, target: target, memMiB: need, cores: cores}
	b.holdMu.Lock()
	b.holds[h] = struct{}{}
	b.holdMu.Unlock()
	return h
}

// heldOn is the memory and vCPUs this server has reserved on a node, for
// VMs not yet in the listing (or counted by their hold instead). A hold
// whose VM is no longer listed is gone (destroyed by another process): it
// is dropped.
func (b *Backend) heldOn(node string, listed map[int]bool) (mem int64, cpus int) {
	b.holdMu.Lock()
	defer b.holdMu.Unlock()
	for h := range b.holds {
		if h.used && !listed[h.vmid] {
			delete(b.holds, h)
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
func (b *Backend) holdsVM(vmid int) bool {
	b.holdMu.Lock()
	defer b.holdMu.Unlock()
	for h := range b.holds {
		if h.vmid == vmid {
			return true
		}
	}
	return false
}

// blind logs, once per reason, that placement cannot see node memory.
func (b *Backend) blind(why string) {
	b.holdMu.Lock()
	again := b.blindWhy == why
	b.blindWhy = why
	b.holdMu.Unlock()
	if !again {
		b.log.Warn("placement is blind: jobs go to their template's node without a capacity check", "why", why)
	}
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
func (b *Backend) survey(ctx context.Context, resources []pve.Resource) *clusterView {
	cl := &clusterView{nodes: map[string]*nodeRoom{}, storages: map[string]bool{}, vmids: map[int]bool{}}
	noMaxMem := false
	for _, r := range resources {
		switch r.Type {
		case "node":
			if r.Status != "online" {
				continue
			}
			n := &nodeRoom{cores: int(r.MaxCPU)}
			if m, ok := b.cfg.NodeMemory[r.Node]; ok {
				n.capacity = m
			} else if m, ok := b.cfg.NodeMemory[""]; ok {
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
		if n == nil || (r.Type != "qemu" && r.Type != "lxc") || bool(r.Template) || b.holdsVM(int(r.VMID)) {
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
			if cfg, err := b.c.CurrentVMConfig(ctx, r.Node, int(r.VMID)); err == nil && !bool(cfg.Template) {
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

// findTemplates finds the templates a job names. Proxmox lists a VM's
// name and template flag from its statistics, which a VM made in the last
// ~10 s does not have yet: if none matches, those VMs' configs are read.
func (b *Backend) findTemplates(ctx context.Context, resources []pve.Resource, name string) ([]pve.Resource, error) {
	tpls, err := findTemplates(resources, name)
	if err == nil {
		return tpls, nil
	}
	found, lookups := false, 0
	for i, r := range resources {
		if r.Type != "qemu" || r.Name != "" || lookups >= 2*maxMemoryLookups || slices.Contains(r.TagList(), instanceTag(b.cfg.Instance)) {
			continue // this instance's VMs are clones, never templates
		}
		lookups++
		cfg, cerr := b.c.VMConfig(ctx, r.Node, int(r.VMID))
		if cerr == nil && bool(cfg.Template) {
			resources[i].Name, resources[i].Template, found = cfg.Name, true, true
		}
	}
	if !found {
		return nil, err
	}
	return findTemplates(resources, name)
}

func hasTagPrefix(r pve.Resource, prefix string) bool {
	for _, t := range r.TagList() {
		if t == prefix || strings.HasPrefix(t, prefix+"-") {
			return true
		}
	}
	return false
}

// templateInfo is what delegate needs of a template's config: it does
// not change while it is a template, so it is read once in a while.
type templateInfo struct {
	read   time.Time
	label  string // "name (vmid)"
	digest string // of its config: a pool VM remembers it
	// storages are those of its disks and of its CD-ROM and cloud-init
	// drives: Proxmox refuses to clone it to another node unless every
	// one is shared (qemu-server clone_vm, $check_storage_access_clone).
	storages []string
	nets     []string // netN keys
	bootDisk string
	bootSize int64
	// agent: its agent option is on; without it no job can run.
	agent bool
	// protection is set: its clones copy it, and must lose it.
	protection bool

	// Guarded by b.tplMu.
	full bool // its storage cannot make linked clones
	// agentOK: a clone's guest agent was seen to allow what delegate
	// needs; agentRefused says what it refused (then no job can run).
	agentOK      bool
	agentRefused string
}

// refusal says why no job can run on a template ("" if one can).
func (b *Backend) refusal(info *templateInfo) string {
	if !info.agent {
		return fmt.Sprintf("template %s has no QEMU guest agent enabled (agent: 1), and delegate reaches its VMs only through the agent: "+
			"install qemu-guest-agent in it and enable the option (qm set <vmid> --agent enabled=1)", info.label)
	}
	b.tplMu.Lock()
	defer b.tplMu.Unlock()
	return info.agentRefused
}

// templateTTL: a template is read again after this long (it may have
// been replaced under the same vmid).
const templateTTL = 10 * time.Minute

func (b *Backend) template(ctx context.Context, t pve.Resource) (*templateInfo, error) {
	b.tplMu.Lock()
	info := b.tpls[int(t.VMID)]
	b.tplMu.Unlock()
	if info != nil && time.Since(info.read) < templateTTL {
		return info, nil
	}
	cfg, err := b.c.VMConfig(ctx, t.Node, int(t.VMID))
	if err != nil {
		return nil, fmt.Errorf("proxmox: read template %d: %w", t.VMID, privilegeHint(err))
	}
	info = &templateInfo{read: time.Now(), label: templateLabel(t) + " (" + strconv.Itoa(int(t.VMID)) + ")", digest: cfg.Digest,
		nets: netKeys(cfg), storages: diskStorages(cfg), agent: agentEnabled(cfg), protection: cfg.Option("protection") == "1"}
	if t.Name == "" {
		info.label = cfg.Name + " (" + strconv.Itoa(int(t.VMID)) + ")"
	}
	info.bootDisk, info.bootSize = bootDisk(cfg)
	b.tplMu.Lock()
	old := b.tpls[int(t.VMID)]
	if old != nil {
		info.full = old.full
		if old.digest == info.digest {
			info.agentOK, info.agentRefused = old.agentOK, old.agentRefused
		}
	}
	b.tpls[int(t.VMID)] = info
	b.tplMu.Unlock()
	if old == nil || old.digest != info.digest {
		b.warnTemplate(info, cfg)
	}
	return info, nil
}

// warnTemplate logs what a template's config shows that costs jobs
// dearly but does not stop them.
func (b *Backend) warnTemplate(info *templateInfo, cfg pve.VMConfig) {
	if hasCloudInit(cfg) && cfg.Option("ciupgrade") != "0" {
		b.log.Warn("the template's cloud-init upgrades packages at every first boot of a VM with network (ciupgrade defaults to 1): "+
			"minutes per job, and it may restart the guest agent; set ciupgrade 0 on the template", "template", info.label)
	}
	if !info.agent {
		b.log.Warn("the template has no QEMU guest agent enabled: its jobs fail", "template", info.label)
	}
}

// agentEnabled reads the agent option ("1", "enabled=1,fstrim_cloned_disks=1"...).
func agentEnabled(cfg pve.VMConfig) bool {
	for _, part := range strings.Split(string(cfg.Agent), ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			v = k
		} else if k != "enabled" {
			continue
		}
		return v == "1" || v == "on" || v == "yes" || v == "true"
	}
	return false
}

// hasCloudInit: a drive of the config is a cloud-init drive.
func hasCloudInit(cfg pve.VMConfig) bool {
	for k := range cfg.Raw {
		if v := cfg.Option(k); isDiskKey(k) && strings.Contains(v, "media=cdrom") && strings.Contains(volumeOf(v), "cloudinit") {
			return true
		}
	}
	return false
}

func volumeOf(drive string) string {
	vol, _, _ := strings.Cut(drive, ",")
	return vol
}

// cloneFull remembers that a template's storage cannot link.
func (b *Backend) cloneFull(info *templateInfo) {
	b.tplMu.Lock()
	info.full = true
	b.tplMu.Unlock()
}

func (b *Backend) isFull(info *templateInfo) bool {
	b.tplMu.Lock()
	defer b.tplMu.Unlock()
	return info.full
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
