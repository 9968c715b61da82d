package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// The warm pool. A cold job waits ~15 s for its VM (clone, boot, guest
// agent); a warm one takes a VM that is already booted with its agent
// answering, and runs within a second. The pool keeps PoolConfig.Size
// such VMs of the default template, sized to the pool's shape and
// without a NIC (a pool VM never serves a job that asks for network),
// each owned by this instance like any of its VMs (owner.go) and named
// "delegate-<instance>-pool-<id>", tagged "delegate-pool", and
// "delegate-ready" once its agent answers.
//
// A job whose template, size and network fit takes a ready VM with one
// config update checked against the VM's digest (compare and set): the
// update renames and tags it for the job, and fails if anything changed
// the config since it was read, so two jobs never get one VM, even from
// two servers. The job's VM is then like any other: destroyed when the
// job ends, never serving another. An empty pool means a cold start,
// never a wait.
//
// One server per data dir keeps the pool (a lock file decides); the
// others take VMs from it by reading the cluster's listing. The keeper
// refills it in the background, counts its VMs against the nodes' room
// (they are placed like jobs), adopts the pool it finds when it starts
// (VMs of a previous run: those that no longer fit the settings, or whose
// agent does not answer, are destroyed), and gives way to jobs: an idle
// VM is destroyed to make room for a job that waits for capacity, and no
// VM is made while jobs wait. The cleanup sweep never sees pool VMs: they
// carry no job (List).

// Pool tags, besides "delegate" and the instance's.
const (
	PoolTag  = "delegate-pool"  // a VM of the warm pool
	ReadyTag = "delegate-ready" // a pool VM whose guest agent answers
)

// PoolConfig is the warm pool (PROXMOX_POOL_*).
type PoolConfig struct {
	// Size is how many ready VMs to keep; 0 keeps none (and destroys the
	// pool of an earlier run).
	Size int
	// The shape of the pool's VMs; jobs of exactly this CPU and memory,
	// and at most this disk, take them.
	CPU         float64
	MemoryBytes int64
	DiskBytes   int64
	// LockFile, if set, makes one process keep the pool: the one that
	// holds an exclusive lock on it. The others take VMs from the pool
	// but do not make or destroy any. Use a file in the data dir.
	LockFile string
	// Lead, if set, says whether this process keeps the pool (it holds
	// the pool's term in a store servers share), in place of LockFile.
	Lead func() bool
	// CheckInterval is how often the pool reads the cluster's listing (to
	// see VMs taken by other servers, stopped or gone) and a follower
	// tries for the lock; default 10 s.
	CheckInterval time.Duration
	// Parallel is how many pool VMs are made at once; default 2.
	Parallel int
	// Network keeps the pool's VMs with a NIC on the job network
	// (PROXMOX_JOB_BRIDGE, or the template's), behind the egress
	// firewall where the backend has one (egress.go: it reaches the
	// egress proxy and the callback server alone), so that a fork's
	// files go in over HTTP, the archive fetched by the guest
	// (transfer.go), rather than through the agent in 45 KiB calls. A job
	// without network that takes one has its NIC hot-unplugged first, in
	// its claim, and a fork right after its files are in (nicOff): ~1 s
	// more on a real cluster (qemu-server's unplug waits a second for the
	// device to go). It needs the transfers (Config.TransferURL) and
	// network hotplug in the template (its hotplug option's default).
	Network bool
}

// shape is a VM's size as delegate configures it.
type shape struct {
	cores    int
	cpulimit float64 // 0: whole cores
	memMiB   int
}

func shapeOf(cpu float64, memBytes int64) shape {
	s := shape{cores: max(1, int(math.Ceil(cpu))), memMiB: int(max(16, (memBytes+(1<<20)-1)>>20))}
	if cpu > 0 && cpu != math.Ceil(cpu) {
		s.cpulimit = math.Round(cpu*100) / 100
	}
	return s
}

func (s shape) String() string {
	cpu := strconv.Itoa(s.cores)
	if s.cpulimit > 0 {
		cpu = strconv.FormatFloat(s.cpulimit, 'f', -1, 64)
	}
	return fmt.Sprintf("%s CPU, %d MiB", cpu, s.memMiB)
}

// shapeOfConfig reads the shape delegate gave a VM; ok is false if the
// VM is not sized the way delegate sizes (sockets, balloon).
func shapeOfConfig(cfg pve.VMConfig) (shape, bool) {
	s := shape{cores: max(1, int(cfg.Cores)), memMiB: cfg.MemoryMiB()}
	if v := cfg.Option("cpulimit"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return s, false
		}
		if f > 0 {
			s.cpulimit = math.Round(f*100) / 100
		}
	}
	if int(cfg.Sockets) > 1 || (cfg.Option("balloon") != "0" && cfg.Option("balloon") != strconv.Itoa(s.memMiB)) {
		return s, false
	}
	return s, true
}

type poolState int

const (
	poolStarting poolState = iota // being cloned, configured and booted
	poolReady                     // its agent answers: a job may take it
	poolReserved                  // a job's admission holds it
	poolRetiring                  // being destroyed
)

var poolStates = []string{"starting", "ready", "claiming", "retiring"}

func (s poolState) String() string { return poolStates[s] }

// poolVM is one VM of the pool.
type poolVM struct {
	vmid  int
	node  string
	owner owner
	// digest is the config's digest when the VM became ready; "" when it
	// was found in a listing (a follower's): it is read before a claim.
	digest string
	shape  shape
	disk   int64 // its boot disk's size
	// tpls are the vmids of the templates it may have been cloned from,
	// when it was found in a listing (its description is checked).
	tpls []int
	// nets are its NICs (PoolConfig.Network), known once it is ready or
	// its config was read.
	nets  []string
	state poolState
	gone  chan struct{} // closed once retired
}

// pool keeps the warm pool of a Backend.
type pool struct {
	c *pve.Client
	// instance and template are the backend's (Config).
	instance, template string
	placer             poolPlacer
	cloner             vmCloner
	prep               vmPreparer
	tables             poolVMTable
	tpls               poolTemplates
	clones             cloneWatch

	cfg   PoolConfig
	shape shape
	// proxied: the backend has an egress proxy, whose firewall the pool's
	// NICs are behind (PoolConfig.Network).
	proxied bool
	log     *slog.Logger
	kick    chan struct{}
	wg      sync.WaitGroup
	// stop ends the upkeep (KeepPool's stop and Backend.Close share it);
	// stopErr says if it left VMs being made.
	stop     func()
	stopOnce sync.Once
	stopErr  error

	mu       sync.Mutex
	vms      map[int]*poolVM
	lock     *os.File // held while this process keeps the pool
	adopted  bool
	noRoom   bool // nextTry waits for room, not after an error
	making   int  // VMs being made
	unlisted int  // of which not yet in vms (still cloning)
	failures int
	nextTry  time.Time
	hungry   map[string]time.Time // jobs refused room, by job id
	waitLog  bool
	termHeld bool // Config.Lead said so last
}

// What the pool needs of the backend's other parts.
type (
	poolPlacer interface {
		place(ctx context.Context, spec sandbox.Spec, forPool bool) (*hold, error)
		holdsVM(vmid int) bool
		isOff(node string) bool
	}
	vmCloner interface {
		clone(ctx context.Context, h *hold, o owner) (int, error)
	}
	vmPreparer interface {
		configure(ctx context.Context, vmid int, node string, o owner, h *hold, spec sandbox.Spec, desc string) error
	}
	poolVMTable interface {
		remember(vmid int, node string)
		gone(vmid int)
		destroyVM(ctx context.Context, node string, vmid int, o owner) error
		destroyLater(ctx context.Context, node string, vmid int, o owner)
		remove(ctx context.Context, node string, vmid int, o owner) error
	}
	poolTemplates interface {
		find(ctx context.Context, resources []pve.Resource, name string) ([]pve.Resource, error)
		info(ctx context.Context, t pve.Resource) (*templateInfo, error)
	}
)

// poolCalls marks the upkeep's calls (KeepPool): background work. A
// variable for BenchmarkForkSim, which measures a refill in the
// foreground too (export_test.go).
var poolCalls = pve.Background

// hungerWindow: a job refused room this recently holds up the pool's
// refills (the engine asks again every few seconds while a job waits).
const hungerWindow = time.Minute

// KeepPool keeps the warm pool in the background until ctx ends or stop
// is called; stop waits a while for the VMs being made. Only a
// long-running server keeps a pool; every process of an instance may
// take VMs from it once KeepPool was called.
func (b *Backend) KeepPool(ctx context.Context, cfg PoolConfig) (stop func(), err error) {
	if cfg.Size < 0 || cfg.Size > 100 {
		return nil, fmt.Errorf("proxmox: pool size %d must be from 0 to 100", cfg.Size)
	}
	if cfg.CPU <= 0 || cfg.MemoryBytes < 16<<20 {
		return nil, fmt.Errorf("proxmox: pool VMs need a CPU and at least 16 MiB (got %g CPU, %d bytes)", cfg.CPU, cfg.MemoryBytes)
	}
	if b.cfg.Template == "" {
		return nil, errors.New("proxmox: the pool needs a default template")
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = 10 * time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 2
	}
	if cfg.Network && b.xfers == nil {
		return nil, fmt.Errorf("proxmox: pool VMs with a NIC (PoolConfig.Network, PROXMOX_POOL_NETWORK) are for forks' files over HTTP, "+
			"which this server does not serve: %s; set CALLBACK_PUBLIC_URL to the callback server's URL as job VMs reach it, or leave the pool's VMs without a NIC", b.xferOff)
	}
	p := &pool{c: b.c, instance: b.cfg.Instance, template: b.cfg.Template, placer: b.placer, cloner: b.cloner, prep: b,
		tables: b.vms, tpls: b.tpls, clones: b.ids,
		cfg: cfg, shape: shapeOf(cfg.CPU, cfg.MemoryBytes), proxied: b.cfg.Egress != nil, log: b.log.With("pool", b.cfg.Template),
		kick: make(chan struct{}, 1), vms: map[int]*poolVM{}, hungry: map[string]time.Time{}}
	if !b.pool.CompareAndSwap(nil, p) {
		return nil, errors.New("proxmox: the backend already keeps a pool")
	}
	ctx, cancel := context.WithCancel(ctx)
	// The upkeep's calls are background work: they leave each node's last
	// call slot to jobs and forks, and give way to them (pve.Background):
	// a refill's pings of guests still booting hold a pvedaemon worker 3 s
	// each, and would otherwise hold both of a node's slots while a job
	// that took a warm VM waits to put its files in.
	ctx = poolCalls(ctx)
	// The pool of an earlier run is adopted before KeepPool returns (a
	// while at most), so that the first jobs find it.
	adopted := false
	if p.lead() {
		first, cancelFirst := context.WithTimeout(ctx, 10*time.Second)
		p.sync(first)
		cancelFirst()
		adopted = p.isAdopted()
	}
	p.wg.Add(1)
	go p.run(ctx, !adopted)
	p.stop = func() {
		cancel()
		done := make(chan struct{})
		go func() { p.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.log.Warn("the pool's VMs being made are left to the next start (it destroys them)")
			p.stopErr = errors.New("proxmox: the pool's VMs being made were left to the next start (it destroys them)")
		}
	}
	return func() { p.stopOnce.Do(p.stop) }, nil
}

// PoolCount is how many of the pool's VMs are in a state.
type PoolCount struct {
	Template, State string
	Count           int
}

// PoolVMs counts the pool's VMs by state (nil when the backend keeps no
// pool, or another process keeps it).
func (b *Backend) PoolVMs() []PoolCount {
	p := b.pool.Load()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lock == nil && p.cfg.LockFile != "" || p.cfg.Lead != nil && !p.cfg.Lead() {
		return nil
	}
	counts := make([]int, len(poolStates))
	for _, v := range p.vms {
		counts[v.state]++
	}
	out := make([]PoolCount, len(poolStates))
	for i, n := range counts {
		out[i] = PoolCount{Template: b.cfg.Template, State: poolStates[i], Count: n}
	}
	return out
}

// roomFreed: a VM of this server was destroyed; a refill that found no
// room may try again at once.
func (p *pool) roomFreed() {
	p.mu.Lock()
	if p.noRoom {
		p.nextTry, p.noRoom = time.Time{}, false
	}
	p.mu.Unlock()
	p.poke()
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run is the keeper's loop: take the lock (or try again later), adopt
// what a previous run left, then keep the pool at its size.
func (p *pool) run(ctx context.Context, list bool) {
	defer p.wg.Done()
	defer p.unlock()
	tick := time.NewTicker(p.cfg.CheckInterval)
	defer tick.Stop()
	for {
		if p.lead() {
			// A process that has just taken the pool over adopts it first.
			if list || !p.isAdopted() {
				p.sync(ctx)
			}
			p.fill(ctx)
		}
		list = false
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
			list = true
		}
	}
}

// lead reports whether this process keeps the pool, taking the lock if
// it is free.
func (p *pool) lead() bool {
	if p.cfg.Lead != nil {
		return p.leadByTerm()
	}
	if p.cfg.LockFile == "" {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lock != nil {
		return true
	}
	f, err := os.OpenFile(p.cfg.LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		p.log.Warn("pool lock", "err", err)
		return false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if !p.waitLog {
			p.waitLog = true
			p.log.Info("another process keeps the warm pool; this one takes VMs from it", "lock", p.cfg.LockFile)
		}
		return false
	}
	p.lock = f
	p.log.Info("keeping the warm pool", "size", p.cfg.Size, "shape", p.shape.String())
	return true
}

func (p *pool) unlock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lock != nil {
		p.lock.Close()
		p.lock = nil
	}
}

func (p *pool) isAdopted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.adopted
}

func (p *pool) leader() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Lead != nil {
		return p.cfg.Lead()
	}
	return p.cfg.LockFile == "" || p.lock != nil
}

// leadByTerm is lead by Config.Lead, saying when this process takes the
// pool over or lets it go.
func (p *pool) leadByTerm() bool {
	lead := p.cfg.Lead()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case lead && !p.termHeld:
		p.log.Info("keeping the warm pool", "size", p.cfg.Size, "shape", p.shape.String())
	case !lead && p.termHeld:
		p.log.Info("another server keeps the warm pool now; this one takes VMs from it")
		p.adopted = false // a later term adopts the pool again
	}
	p.termHeld = lead
	return lead
}

// fill makes or retires VMs to bring the pool to its size.
func (p *pool) fill(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	live := p.unlisted
	var ready []*poolVM
	for _, v := range p.vms {
		switch v.state {
		case poolReady:
			ready = append(ready, v)
			live++
		case poolStarting, poolReserved:
			live++
		}
	}
	for excess := live - p.cfg.Size; excess > 0 && len(ready) > 0; excess-- {
		v := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		p.log.Info("pool larger than its size: destroying a VM", "vmid", v.vmid, "size", p.cfg.Size)
		p.retireLocked(ctx, v)
	}
	deficit := p.cfg.Size - live
	if deficit <= 0 || ctx.Err() != nil || time.Now().Before(p.nextTry) {
		return
	}
	for id, t := range p.hungry {
		if time.Since(t) > hungerWindow {
			delete(p.hungry, id)
		}
	}
	if len(p.hungry) > 0 {
		return // jobs wait for room: they come first
	}
	for ; deficit > 0 && p.making < p.cfg.Parallel; deficit-- {
		p.making++
		p.unlisted++
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			listed := false
			err := p.make(ctx, &listed)
			p.mu.Lock()
			p.making--
			if !listed {
				p.unlisted--
			}
			p.noRoom = false
			switch {
			case err == nil:
				p.failures = 0
			case ctx.Err() != nil:
			case errors.Is(err, sandbox.ErrNoCapacity):
				// Room may be freed by the end of one of this server's VMs
				// (roomFreed), or elsewhere: look again at the next check.
				p.nextTry, p.noRoom = time.Now().Add(p.cfg.CheckInterval), true
				p.log.Debug("no room for a pool VM", "err", err)
			default:
				p.failures++
				wait := min(5*time.Minute, 5*time.Second<<min(p.failures-1, 6))
				p.nextTry = time.Now().Add(wait)
				p.log.Warn("could not make a pool VM", "err", err, "retry_in", wait)
			}
			p.mu.Unlock()
			p.poke()
		}()
	}
}

var poolDescRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?m)^delegate-pool template=(\d+) template-digest=([0-9a-f]*)$`)
})

func poolDescription(tpl int, digest string) string {
	return fmt.Sprintf("delegate warm pool VM: a job takes it, then it is destroyed\ndelegate-pool template=%d template-digest=%s", tpl, digest)
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func jobDescription(job string) string {
	return fmt.Sprintf("delegate job %s\n(destroyed when the job ends)", job)
}

// make clones, configures and boots one pool VM, and marks it ready once
// its agent answers. listed is set once the VM is in p.vms.
func (p *pool) make(ctx context.Context, listed *bool) error {
	spec := sandbox.Spec{CPU: p.cfg.CPU, MemoryBytes: p.cfg.MemoryBytes, DiskBytes: p.cfg.DiskBytes, Network: p.cfg.Network}
	if p.cfg.Network && p.proxied {
		spec.Egress = &sandbox.Egress{} // behind the egress firewall, as a job with network
	}
	h, err := p.placer.place(ctx, spec, true)
	if err != nil {
		return err
	}
	defer h.Release()
	o := owner{p.instance, "pool-" + NewInstanceID()}
	spec.JobID = o.job
	vmid, err := p.cloner.clone(ctx, h, o)
	if err != nil {
		return err
	}
	h.bind(vmid)
	p.tables.remember(vmid, h.node)
	v := &poolVM{vmid: vmid, node: h.node, owner: o, shape: p.shape, state: poolStarting, gone: make(chan struct{})}
	p.mu.Lock()
	p.vms[vmid] = v
	p.unlisted--
	*listed = true
	p.mu.Unlock()
	fail := func(err error) error {
		p.mu.Lock()
		delete(p.vms, vmid)
		p.mu.Unlock()
		close(v.gone)
		if ctx.Err() != nil {
			// Shutting down: the next start adopts the VM if it became
			// ready, and destroys it if not.
			p.log.Info("pool VM left half-made to the next start", "vmid", vmid)
			return err
		}
		p.tables.destroyVM(context.WithoutCancel(ctx), h.node, vmid, o)
		return err
	}
	if err := p.prep.configure(ctx, vmid, h.node, o, h, spec, poolDescription(int(h.tpl.VMID), h.info.digest)); err != nil {
		return fail(err)
	}
	if err := p.c.SetVMConfig(ctx, h.node, vmid, pve.VMConfigUpdate{Tags: append(o.tags(), ReadyTag)}); err != nil {
		return fail(fmt.Errorf("proxmox: mark pool VM %d ready: %w", vmid, privilegeHint(err)))
	}
	cfg, err := p.c.VMConfig(ctx, h.node, vmid)
	if err != nil {
		return fail(fmt.Errorf("proxmox: read pool VM %d: %w", vmid, err))
	}
	if why := p.nicUnfit(cfg); why != "" {
		return fail(fmt.Errorf("proxmox: pool VM %d: %s", vmid, why))
	}
	_, size := bootDisk(cfg)
	p.mu.Lock()
	v.digest, v.disk, v.nets, v.state = cfg.Digest, size, netKeys(cfg), poolReady
	p.mu.Unlock()
	p.log.Info("pool VM ready", "vmid", vmid, "node", h.node)
	return nil
}

// retireLocked destroys a pool VM in the background (p.mu held).
func (p *pool) retireLocked(ctx context.Context, v *poolVM) {
	v.state = poolRetiring
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		p.retire(ctx, v)
	}()
}

// retire destroys a pool VM unless it was taken meanwhile. First the VM
// loses its ready tag, in an update checked against its digest: a job
// that read it ready can no longer take it.
func (p *pool) retire(ctx context.Context, v *poolVM) {
	defer func() {
		p.mu.Lock()
		if p.vms[v.vmid] == v {
			delete(p.vms, v.vmid)
		}
		p.mu.Unlock()
		close(v.gone)
		p.poke()
	}()
	cfg, err := p.c.VMConfig(ctx, v.node, v.vmid)
	switch {
	case pve.IsNotFound(err):
		p.tables.gone(v.vmid)
		return
	case err != nil:
		p.log.Warn("retire pool VM: read its config", "vmid", v.vmid, "err", err)
		return // the next check finds it again
	case v.owner.instance == "":
		// Found in a listing: its name says which pool VM it is.
		job, ok := strings.CutPrefix(cfg.Name, namePrefix(p.instance))
		if !ok || !strings.HasPrefix(job, "pool-") {
			return // a job took it
		}
		v.owner = owner{p.instance, job}
	case !v.owner.owns(cfg):
		return // a job took it
	}
	if slices.Contains(cfg.TagList(), ReadyTag) {
		if err := p.c.SetVMConfig(ctx, v.node, v.vmid, pve.VMConfigUpdate{Tags: v.owner.tags(), Digest: cfg.Digest}); err != nil {
			p.log.Info("pool VM changed before it could be retired (a job took it?)", "vmid", v.vmid, "err", err)
			return
		}
	}
	if err := p.tables.remove(ctx, v.node, v.vmid, v.owner); err != nil {
		p.log.Warn("retire pool VM", "vmid", v.vmid, "err", err)
	}
}

// sync reads the cluster's listing: VMs of the pool that are gone,
// taken by another process's job or stopped are forgotten or retired;
// pool VMs of this instance it does not know (a previous run's) are
// adopted if they are ready and fit, else retired.
func (p *pool) sync(ctx context.Context) {
	resources, err := p.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("pool: list VMs", "err", err)
		}
		return
	}
	listed := map[int]pve.Resource{}
	for _, r := range resources {
		if r.Type == "qemu" {
			listed[int(r.VMID)] = r
		}
	}
	var found []pve.Resource
	p.mu.Lock()
	for id, v := range p.vms {
		if v.state != poolReady {
			continue // being made, taken or retired: that ends on its own
		}
		r, ok := listed[id]
		switch {
		case !ok || !slices.Contains(r.TagList(), PoolTag):
			delete(p.vms, id) // gone, or another process's job took it
			p.log.Info("pool VM gone or taken elsewhere", "vmid", id)
		case r.Status == "stopped" || r.Lock != "":
			p.log.Info("pool VM no longer running: destroying it", "vmid", id, "status", r.Status, "lock", r.Lock)
			p.retireLocked(ctx, v)
		case p.placer.isOff(r.Node):
			p.log.Info("pool VM on a node drained or in maintenance: destroying it", "vmid", id, "node", r.Node)
			p.retireLocked(ctx, v)
		}
	}
	for _, r := range resources {
		// A VM this process is making or made has a hold (it may be
		// listed between its clone and its entry in the pool).
		if _, known := p.vms[int(r.VMID)]; !known && r.Lock == "" && isPoolListing(r, p.instance) && !p.clones.inFlight(int(r.VMID)) && !p.placer.holdsVM(int(r.VMID)) {
			found = append(found, r)
		}
	}
	first := !p.adopted
	p.adopted = true
	p.mu.Unlock()
	if len(found) == 0 {
		return
	}
	var tpls []pve.Resource
	if t, err := p.tpls.find(ctx, resources, p.template); err == nil {
		tpls = t
	}
	for _, r := range found {
		p.adopt(ctx, r, tpls, first)
	}
}

// isPoolListing: a listing that may be a pool VM of the instance (its
// config says for sure). A pool VM is tagged once configured; until
// then only its name says, and a job's VM always has its job's tag.
func isPoolListing(r pve.Resource, instance string) bool {
	if r.Type != "qemu" || bool(r.Template) {
		return false
	}
	tags := r.TagList()
	if slices.Contains(tags, instanceTag(instance)) && slices.Contains(tags, PoolTag) {
		return true
	}
	return strings.HasPrefix(r.Name, namePrefix(instance)+"pool-") &&
		!slices.ContainsFunc(tags, isOwnerID)
}

// adopt takes into the pool a VM found in the listing, if it is a ready
// pool VM of this instance that fits the settings and answers; any
// other pool VM of the instance is retired.
func (p *pool) adopt(ctx context.Context, r pve.Resource, tpls []pve.Resource, first bool) {
	vmid := int(r.VMID)
	// Its shape as it runs: a change waiting for its next start is not
	// what a job would get.
	cfg, err := p.c.CurrentVMConfig(ctx, r.Node, vmid)
	if err != nil {
		if !pve.IsNotFound(err) {
			p.log.Warn("pool: read a VM found", "vmid", vmid, "err", err)
		}
		return
	}
	job, ok := strings.CutPrefix(cfg.Name, namePrefix(p.instance))
	if !ok || !strings.HasPrefix(job, "pool-") || bool(cfg.Template) {
		return
	}
	v := &poolVM{vmid: vmid, node: r.Node, owner: owner{p.instance, job}, digest: cfg.Digest, gone: make(chan struct{})}
	_, v.disk = bootDisk(cfg)
	why := p.unfit(ctx, cfg, r, tpls)
	if why == "" {
		if err := p.c.AgentPing(ctx, r.Node, vmid); err != nil {
			why = "its guest agent does not answer: " + err.Error()
		}
	}
	v.shape, _ = shapeOfConfig(cfg)
	v.nets = netKeys(cfg)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, known := p.vms[vmid]; known {
		return
	}
	p.vms[vmid] = v
	if why != "" {
		p.log.Info("destroying a pool VM found", "vmid", vmid, "why", why)
		p.retireLocked(ctx, v)
		return
	}
	v.state = poolReady
	if first {
		p.log.Info("adopted a pool VM of an earlier run", "vmid", vmid, "node", r.Node)
	} else {
		p.log.Info("adopted a pool VM", "vmid", vmid, "node", r.Node)
	}
}

// unfit says why a pool VM cannot serve this pool's jobs ("" if it can).
func (p *pool) unfit(ctx context.Context, cfg pve.VMConfig, r pve.Resource, tpls []pve.Resource) string {
	if r.Status != "running" {
		return "it is " + r.Status
	}
	if !slices.Contains(cfg.TagList(), ReadyTag) {
		return "it was never ready"
	}
	if why := p.nicUnfit(cfg); why != "" {
		return why
	}
	if s, ok := shapeOfConfig(cfg); !ok || s != p.shape {
		return fmt.Sprintf("it is %s, the pool's VMs are %s", s, p.shape)
	}
	m := poolDescRe().FindStringSubmatch(cfg.Description)
	if m == nil {
		return "its description does not name its template"
	}
	tpl, _ := strconv.Atoi(m[1])
	i := slices.IndexFunc(tpls, func(t pve.Resource) bool { return int(t.VMID) == tpl })
	if i < 0 {
		return fmt.Sprintf("its template %d is not the pool's template %q", tpl, p.template)
	}
	info, err := p.tpls.info(ctx, tpls[i])
	if err != nil {
		return "its template cannot be read: " + err.Error()
	}
	if info.digest != m[2] {
		return fmt.Sprintf("its template %d changed since it was made", tpl)
	}
	return ""
}

// nicUnfit says why a pool VM's NICs are not what the pool's VMs have
// ("" if they are): none, or (PoolConfig.Network) net0 alone, which
// Proxmox can unplug from the running VM (network hotplug).
func (p *pool) nicUnfit(cfg pve.VMConfig) string {
	nets := netKeys(cfg)
	switch {
	case !p.cfg.Network && len(nets) > 0:
		return "it has a NIC"
	case !p.cfg.Network:
		return ""
	case len(nets) == 0:
		return "it has no NIC, and the pool's VMs have one (PoolConfig.Network): the template has none, and PROXMOX_JOB_BRIDGE gives it none"
	case len(nets) > 1 || nets[0] != "net0":
		return fmt.Sprintf("it has the NICs %s, and the pool's VMs have net0 alone", strings.Join(nets, ", "))
	case !hotplugsNetwork(cfg.Option("hotplug")):
		return fmt.Sprintf("its hotplug option %q leaves out network: Proxmox could not take its NIC away from a job without network until it restarts "+
			"(give the template network hotplug, the default, or leave the pool's VMs without a NIC)", cfg.Option("hotplug"))
	}
	return ""
}

// hotplugsNetwork: a VM's hotplug option lets Proxmox plug and unplug its
// NICs while it runs (qemu-server's parse_hotplug_features: unset and "1"
// are network,disk,usb; "0" is none).
func hotplugsNetwork(opt string) bool {
	switch opt {
	case "", "1":
		return true
	case "0":
		return false
	}
	return slices.Contains(strings.Split(opt, ","), "network")
}

// fits reports whether a job may take a VM of this pool.
func (p *pool) fits(spec sandbox.Spec) bool {
	return !spec.Network && (spec.Template == "" || spec.Template == p.template) &&
		shapeOf(spec.CPU, spec.MemoryBytes) == p.shape
}

// take reserves a ready VM for a job, if the job fits the pool and one
// fits the job. The keeper knows its VMs; another process looks for
// them in the cluster's listing.
func (p *pool) take(ctx context.Context, spec sandbox.Spec) *poolVM {
	if !p.fits(spec) {
		return nil
	}
	if p.leader() {
		p.mu.Lock()
		defer p.mu.Unlock()
		var best *poolVM
		for _, v := range p.vms {
			if v.state == poolReady && spec.DiskBytes <= v.disk && !p.placer.isOff(v.node) && (best == nil || v.vmid < best.vmid) {
				best = v
			}
		}
		if best != nil {
			best.state = poolReserved
		}
		return best
	}
	resources, err := p.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil
	}
	var tpls []int
	for _, r := range resources {
		if r.Type == "qemu" && bool(r.Template) && templateNamed(r, p.template) {
			tpls = append(tpls, int(r.VMID))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range resources {
		tags := r.TagList()
		if r.Type != "qemu" || r.Status != "running" || r.Lock != "" || p.vms[int(r.VMID)] != nil || p.placer.isOff(r.Node) ||
			!slices.Contains(tags, instanceTag(p.instance)) || !slices.Contains(tags, PoolTag) || !slices.Contains(tags, ReadyTag) ||
			(r.MaxMem > 0 && int(r.MaxMem>>20) != p.shape.memMiB) || (r.MaxCPU > 0 && int(r.MaxCPU) != p.shape.cores) {
			continue
		}
		// Its name, shape and disk are checked in its config, at the claim.
		v := &poolVM{vmid: int(r.VMID), node: r.Node, shape: p.shape, tpls: tpls, state: poolReserved, gone: make(chan struct{})}
		p.vms[v.vmid] = v
		return v
	}
	return nil
}

// restamped: a ready VM's tags were stamped (gc.go), its config's digest
// is new.
func (p *pool) restamped(vmid int, digest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.vms[vmid]; v != nil && v.state == poolReady && v.digest != "" {
		v.digest = digest
	}
}

// release gives back a VM a job reserved and did not take.
func (p *pool) release(v *poolVM) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.vms[v.vmid] != v || v.state != poolReserved {
		return
	}
	if v.digest == "" {
		delete(p.vms, v.vmid) // found in a listing: not this process's to keep
		return
	}
	v.state = poolReady
}

// forget drops a VM from the pool: a job took it, or it could not be
// taken.
func (p *pool) forget(v *poolVM) {
	p.mu.Lock()
	if p.vms[v.vmid] == v {
		delete(p.vms, v.vmid)
	}
	p.mu.Unlock()
	p.poke()
}

// starve notes a job refused room; fed that it got some.
func (p *pool) starve(job string) {
	if job == "" {
		return
	}
	p.mu.Lock()
	p.hungry[job] = time.Now()
	p.mu.Unlock()
}

func (p *pool) fed(job string) {
	p.mu.Lock()
	_, was := p.hungry[job]
	delete(p.hungry, job)
	p.mu.Unlock()
	if was {
		p.poke()
	}
}

// evict chooses idle VMs on a node whose memory, with free, makes room
// for need bytes, and retires them; nil if the node's idle VMs are not
// enough. The keeper knows which VMs are idle; another process finds
// them in the listing (ready pool VMs), and its retire's digest check
// leaves alone one the keeper gave a job meanwhile.
func (p *pool) evict(ctx context.Context, node string, free, need int64, resources []pve.Resource) []*poolVM {
	leader := p.leader()
	p.mu.Lock()
	defer p.mu.Unlock()
	var idle []*poolVM
	if leader {
		for _, v := range p.vms {
			if v.state == poolReady && v.node == node {
				idle = append(idle, v)
			}
		}
	} else {
		for _, r := range resources {
			tags := r.TagList()
			if r.Type == "qemu" && r.Node == node && r.Status == "running" && r.Lock == "" && r.MaxMem > 0 && p.vms[int(r.VMID)] == nil &&
				slices.Contains(tags, instanceTag(p.instance)) && slices.Contains(tags, PoolTag) && slices.Contains(tags, ReadyTag) {
				idle = append(idle, &poolVM{vmid: int(r.VMID), node: node, shape: shape{memMiB: int(r.MaxMem >> 20)}, gone: make(chan struct{})})
			}
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].shape.memMiB > idle[j].shape.memMiB })
	var out []*poolVM
	for _, v := range idle {
		if free >= need {
			break
		}
		free += int64(v.shape.memMiB) << 20
		out = append(out, v)
	}
	if free < need {
		return nil
	}
	for _, v := range out {
		p.log.Info("destroying an idle pool VM to make room for a job", "vmid", v.vmid, "node", node)
		p.vms[v.vmid] = v
		p.retireLocked(ctx, v)
	}
	return out
}

// claim takes a reserved pool VM for a job: one config update, checked
// against the VM's digest, renames and tags it for the job. Then the
// agent is asked once: a VM that stopped since it was ready is not
// given to the job. A pool VM's NIC (PoolConfig.Network) goes in the
// same update, unplugged and then checked gone (nicOff), unless keepNIC
// (a fork's files come over it first).
func (p *pool) claim(ctx context.Context, v *poolVM, spec sandbox.Spec, o owner, keepNIC bool) error {
	spec.Step(fmt.Sprintf("taking warm VM %d on %s", v.vmid, v.node))
	digest, nets := v.digest, v.nets
	if digest == "" {
		cfg, err := p.c.CurrentVMConfig(ctx, v.node, v.vmid)
		if err != nil {
			return fmt.Errorf("proxmox: read pool VM %d: %w", v.vmid, err)
		}
		job, _ := strings.CutPrefix(cfg.Name, namePrefix(p.instance))
		s, ok := shapeOfConfig(cfg)
		_, disk := bootDisk(cfg)
		m := poolDescRe().FindStringSubmatch(cfg.Description)
		if !strings.HasPrefix(job, "pool-") || !slices.Contains(cfg.TagList(), ReadyTag) || !ok || s != p.shape ||
			p.nicUnfit(cfg) != "" || spec.DiskBytes > disk || m == nil || !slices.Contains(v.tpls, atoi(m[1])) {
			return fmt.Errorf("proxmox: VM %d is not a ready pool VM of this shape, network and template", v.vmid)
		}
		digest, nets = cfg.Digest, netKeys(cfg)
	}
	desc := jobDescription(o.job)
	u := pve.VMConfigUpdate{Name: o.vmName(), Tags: o.tags(), Description: &desc, Digest: digest}
	if !keepNIC {
		u.Delete = nets
	}
	err := p.c.SetVMConfig(ctx, v.node, v.vmid, u)
	if err != nil && len(u.Delete) > 0 {
		// An unplug that failed leaves the rest of the update made: the
		// VM is the job's, its NIC still there, and not for the job
		// (destroyed if its name says it is the job's).
		p.tables.destroyLater(ctx, v.node, v.vmid, o)
	}
	if err != nil {
		return fmt.Errorf("proxmox: take pool VM %d: %w", v.vmid, privilegeHint(err))
	}
	p.tables.remember(v.vmid, v.node)
	if len(u.Delete) > 0 {
		if err := checkNICsGone(ctx, p.c, v.node, v.vmid); err != nil {
			p.tables.destroyLater(ctx, v.node, v.vmid, o)
			return err
		}
	}
	if err := p.c.AgentPing(ctx, v.node, v.vmid); err != nil {
		p.tables.destroyLater(ctx, v.node, v.vmid, o)
		return fmt.Errorf("proxmox: the guest agent of pool VM %d: %w", v.vmid, err)
	}
	p.log.Info("took a pool VM", "vmid", v.vmid, "node", v.node, "job", o.job)
	return nil
}
