package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// vmTable is this server's VMs as Proxmox has them: which node each is
// on (a cache: a migration moves a VM, and the cluster's listing says
// where it went), whose it is, the locked ones the sweep skips, and their
// ends. Every stop and delete goes through it, after a read of the VM's
// config says it is still its owner's; destroys left to run in the
// background are its own, and Close waits for them.
type vmTable struct {
	c   *pve.Client
	cfg *Config
	log *slog.Logger
	// room hears of a VM that is gone (its room is free).
	room roomFreer
	// clones says whether a clone of this process is making a VM.
	clones cloneWatch

	mu sync.Mutex
	// nodes remembers where this server's VMs are, so that destroying
	// one needs no listing of the cluster.
	nodes map[int]string
	// locked are this server's VMs the sweep skips for their lock, and
	// since when.
	locked map[int]lockedSince
	// destroying are the Destroys under way, by sandbox id.
	destroying map[string]*destroyCall

	bg     sync.WaitGroup // destroys in the background
	bgMu   sync.Mutex
	bgErrs []error // what they could not do, for Close
}

// roomFreer is placement as the VM table sees it: a VM that is gone
// holds no room.
type roomFreer interface{ freed(vmid int) }

// cloneWatch is the vmid hand-out as the VM table sees it.
type cloneWatch interface{ inFlight(vmid int) bool }

func newVMTable(c *pve.Client, cfg *Config, log *slog.Logger, room roomFreer, clones cloneWatch) *vmTable {
	return &vmTable{c: c, cfg: cfg, log: log, room: room, clones: clones,
		nodes: map[int]string{}, locked: map[int]lockedSince{}, destroying: map[string]*destroyCall{}}
}

// remember notes the node of a VM of this server.
func (t *vmTable) remember(vmid int, node string) {
	t.mu.Lock()
	t.nodes[vmid] = node
	t.mu.Unlock()
}

// nodeOf is the node this server last saw a VM on ("" if unknown).
func (t *vmTable) nodeOf(vmid int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nodes[vmid]
}

// gone forgets a VM that no longer exists, and its room.
func (t *vmTable) gone(vmid int) {
	t.mu.Lock()
	delete(t.nodes, vmid)
	t.mu.Unlock()
	t.room.freed(vmid)
}

// locate finds a VM's listing; ErrGone if it does not exist.
func (t *vmTable) locate(ctx context.Context, vmid int) (pve.Resource, error) {
	resources, err := t.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return pve.Resource{}, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	for _, r := range resources {
		if int(r.VMID) == vmid && r.Type == "qemu" {
			return r, nil
		}
	}
	return pve.Resource{}, fmt.Errorf("proxmox: VM %d: %w", vmid, sandbox.ErrGone)
}

// follow finds a VM of o's again when the node it was on (from) no
// longer has it: a migration moved it (a node's bulk migration before a
// reboot, a balancer, HA). Its node is the cluster listing's, and its
// config there must still be o's. moved says it is on another node now
// (remembered: where returns it); ErrGone if it is nowhere, or no
// longer o's.
func (t *vmTable) follow(ctx context.Context, vmid int, o owner, from string) (moved bool, err error) {
	r, err := t.locate(ctx, vmid)
	if errors.Is(err, sandbox.ErrGone) {
		t.gone(vmid)
		return false, err
	}
	if err != nil || r.Node == from {
		return false, err
	}
	ok, found, err := t.owned(ctx, r.Node, vmid, o)
	switch {
	case err != nil:
		return false, err
	case !found || !ok:
		return false, fmt.Errorf("proxmox: VM %d (on %s now) is no longer %s's: %w", vmid, r.Node, orLegacy(o.job), sandbox.ErrGone)
	}
	t.remember(vmid, r.Node)
	t.log.Info("a VM of this server moved to another node (a migration): following it", "vmid", vmid, "from", from, "to", r.Node, "job", o.job)
	return true, nil
}

// list is this instance's VMs, each with its job, as /cluster/resources
// shows them (see listedJob). A VM with a lock is left out: an operation
// (its clone, most likely) is at work on it, and the sweep must wait for
// it to end.
func (t *vmTable) list(ctx context.Context) ([]sandbox.Info, error) {
	resources, err := t.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	var out []sandbox.Info
	locked := map[int]bool{}
	for _, r := range resources {
		job := listedJob(r, t.cfg.Instance)
		if r.Lock != "" {
			if job != "" {
				locked[int(r.VMID)] = true
				t.lockedVM(r, job)
			}
			continue
		}
		if job != "" {
			out = append(out, sandbox.Info{ID: sandboxID(int(r.VMID), job), JobID: job})
		}
	}
	t.mu.Lock()
	for id := range t.locked {
		if !locked[id] {
			delete(t.locked, id)
		}
	}
	t.mu.Unlock()
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
func (t *vmTable) lockedVM(r pve.Resource, job string) {
	vmid := int(r.VMID)
	t.mu.Lock()
	l, seen := t.locked[vmid]
	if !seen || l.lock != r.Lock {
		l = lockedSince{lock: r.Lock, since: time.Now()}
	}
	report := !l.reported && time.Since(l.since) >= t.cfg.StaleLockAfter
	l.reported = l.reported || report
	t.locked[vmid] = l
	t.mu.Unlock()
	if report && !t.clones.inFlight(vmid) {
		t.log.Warn("a VM of this server has been locked too long to be an operation in progress, and cannot be destroyed while it is: "+
			"clear its lock as root on its node (qm unlock "+strconv.Itoa(vmid)+"), and the next cleanup destroys it",
			"vmid", vmid, "node", r.Node, "lock", r.Lock, "job", job, "locked_for", time.Since(l.since).Round(time.Second))
	}
}

// destroyCall is a Destroy under way; done closes when err is set.
type destroyCall struct {
	done chan struct{}
	err  error
}

// destroyID destroys the VM a sandbox id names. A VM that is no longer
// the one the id names (destroyed, its vmid reused by another owner) is
// left alone. One destroy of a sandbox at a time in this process: the
// engine ends a kept sandbox and its sweep finds the VM of an ended
// sandbox at the same moment; the second waits for the first's result
// rather than send a stop and a delete of its own to a VM being deleted.
func (t *vmTable) destroyID(ctx context.Context, id string) error {
	vmid, job, err := parseID(id)
	if err != nil {
		return nil // not ours: nothing to destroy
	}
	t.mu.Lock()
	if d := t.destroying[id]; d != nil {
		t.mu.Unlock()
		select {
		case <-d.done:
			return d.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d := &destroyCall{done: make(chan struct{})}
	t.destroying[id] = d
	t.mu.Unlock()
	d.err = t.destroy(ctx, vmid, owner{t.cfg.Instance, job})
	t.mu.Lock()
	delete(t.destroying, id)
	t.mu.Unlock()
	close(d.done)
	return d.err
}

// destroy destroys o's VM vmid wherever it is: on the node it was last
// seen on, else where the cluster's listing shows it now (it may have
// migrated).
func (t *vmTable) destroy(ctx context.Context, vmid int, o owner) error {
	if node := t.nodeOf(vmid); node != "" {
		ok, found, err := t.owned(ctx, node, vmid, o)
		switch {
		case err != nil:
			return err
		case found && !ok:
			return nil
		case found:
			return t.remove(ctx, node, vmid, o)
		}
		// Not there (any more): it may have migrated.
	}
	r, err := t.locate(ctx, vmid)
	if errors.Is(err, sandbox.ErrGone) {
		t.gone(vmid)
		return nil
	}
	if err != nil {
		return err
	}
	return t.destroyVM(ctx, r.Node, vmid, o)
}

// destroyVM stops (at once: the guest is not trusted to shut down) and
// deletes a VM with its disks, after making sure that it is o's: a vmid
// may have been reused by anyone since.
func (t *vmTable) destroyVM(ctx context.Context, node string, vmid int, o owner) error {
	if ok, err := t.ownedBy(ctx, node, vmid, o); err != nil || !ok {
		return err
	}
	return t.remove(ctx, node, vmid, o)
}

// destroyLater destroys o's VM in the background, bounded: Close waits
// for it, and reports what it could not do.
func (t *vmTable) destroyLater(ctx context.Context, node string, vmid int, o owner) {
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := t.destroyVM(ctx, node, vmid, o); err != nil {
			t.log.Warn("destroy a VM in the background", "vmid", vmid, "node", node, "err", err)
			t.bgMu.Lock()
			t.bgErrs = append(t.bgErrs, fmt.Errorf("destroy VM %d: %w", vmid, err))
			t.bgMu.Unlock()
		}
	}()
}

// wait waits for the background destroys (a while at most), and returns
// what they could not do.
func (t *vmTable) wait(timeout time.Duration) error {
	done := make(chan struct{})
	go func() { t.bg.Wait(); close(done) }()
	var late error
	select {
	case <-done:
	case <-time.After(timeout):
		late = fmt.Errorf("proxmox: destroys still under way after %s (the cleanup sweep of the next start destroys what they leave)", timeout)
	}
	t.bgMu.Lock()
	defer t.bgMu.Unlock()
	return errors.Join(append(t.bgErrs, late)...)
}

// remove stops and deletes a VM known to be o's, retrying while it is
// locked (a migration, a backup: lockPatience at most) and following it
// to another node if it moved. Before each retry the VM's owner is read
// again: another process may have destroyed it meanwhile, and its vmid
// been reused.
func (t *vmTable) remove(ctx context.Context, node string, vmid int, o owner) error {
	var last error
	unprotected := false
	lockedUntil := time.Now().Add(lockPatience)
	// moved follows the VM to the node it went to; false: it is gone.
	moved := func() bool {
		if ok, _ := t.follow(ctx, vmid, o, node); ok {
			node = t.nodeOf(vmid)
			return true
		}
		return false
	}
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(t.cfg.PollInterval):
			}
			ok, found, err := t.owned(ctx, node, vmid, o)
			switch {
			case err != nil:
				last = err
				continue
			case !found && moved():
				attempt--
				continue
			case !found:
				return nil
			case !ok:
				return nil
			}
		}
		upid, err := t.c.StopVM(ctx, node, vmid)
		if err == nil {
			logTask(t.log, "stop", vmid, o.job, upid)
			err = t.waitQuietly(ctx, node, upid)
		}
		if err != nil && pve.IsNotFound(err) {
			if moved() {
				continue // its owner is read again there
			}
			t.gone(vmid)
			return nil
		}
		if err != nil && !pve.IsVMNotRunning(err) {
			last = err
			if pve.IsLocked(err) {
				if time.Now().Before(lockedUntil) {
					attempt-- // a lock of an operation that ends: a migration, a backup
				}
				continue
			}
			// A stop can fail on a VM that is already stopped; the delete
			// below tells the truth.
		}
		if err != nil && attempt == 0 {
			// Not stopped by us: it may have been destroyed by another
			// process since its owner was read, and its vmid taken by a
			// new VM (not running yet). Read the owner again.
			if ok, found, oerr := t.owned(ctx, node, vmid, o); oerr == nil && (!found || !ok) {
				return nil
			}
		}
		// Not destroy-unreferenced-disks: a fresh clone has none, and with
		// it every destroy on the node fails while any of its image
		// storages is offline ("storage 'x' is not online"), for ever.
		// Not purge: delegate's VMs are in no backup job by vmid, no
		// replication job and no HA resource, and purge rewrites the
		// cluster's jobs.cfg and replication.cfg under their cluster
		// locks at every destroy all the same (qemu-server destroy_vm).
		upid, err = t.c.DeleteVM(ctx, node, vmid, pve.DeleteOptions{})
		if err == nil {
			logTask(t.log, "destroy", vmid, o.job, upid)
			err = t.waitQuietly(ctx, node, upid)
		}
		if pve.IsProtected(err) && !unprotected {
			unprotected = true
			// A VM made before its template's protection was cleared on
			// clones: ours, so its protection goes.
			t.log.Info("clearing the protection a VM of ours copied from its template", "vmid", vmid, "node", node)
			if perr := t.c.SetVMConfig(ctx, node, vmid, pve.VMConfigUpdate{Delete: []string{"protection"}}); perr != nil {
				err = fmt.Errorf("%w (and clearing its protection failed: %w)", err, privilegeHint(perr))
			} else {
				attempt--
			}
		}
		if pve.IsNotFound(err) && moved() {
			continue
		}
		if err == nil || pve.IsNotFound(err) {
			t.gone(vmid)
			t.log.Info("destroyed VM", "vmid", vmid, "node", node, "job", o.job)
			return nil
		}
		last = err
		if pve.IsLocked(err) && time.Now().Before(lockedUntil) {
			attempt--
		}
	}
	return fmt.Errorf("proxmox: destroy VM %d: %w", vmid, privilegeHint(last))
}

// lockPatience is how long a destroy waits out a lock of an operation
// that ends by itself: a live migration copies the guest's memory (a
// minute or more for a large one), a backup its disks.
const lockPatience = 5 * time.Minute

// waitQuietly waits for a task nobody waits on (a stop or delete after
// the job ended): it looks every PollInterval, first after half of it,
// rather than WaitTask's quick first polls. A failed task is read by
// WaitTask, which fetches its log.
func (t *vmTable) waitQuietly(ctx context.Context, node, upid string) error {
	wait := t.cfg.PollInterval / 2
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		st, err := t.c.TaskStatus(ctx, node, upid)
		if err != nil {
			return err
		}
		if !st.Running() {
			if st.OK() {
				return nil
			}
			return t.c.WaitTask(ctx, node, upid)
		}
		wait = t.cfg.PollInterval
	}
}

// ownedBy reads a VM's config and says whether it is o's. A VM that does
// not exist is not (and that is no error).
func (t *vmTable) ownedBy(ctx context.Context, node string, vmid int, o owner) (bool, error) {
	ok, _, err := t.owned(ctx, node, vmid, o)
	return ok, err
}

// owned is ownedBy that also says whether the VM was found on node.
func (t *vmTable) owned(ctx context.Context, node string, vmid int, o owner) (ok, found bool, err error) {
	cfg, err := t.c.VMConfig(ctx, node, vmid)
	if pve.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("proxmox: read config of VM %d: %w", vmid, privilegeHint(err))
	}
	if !o.owns(cfg) {
		t.log.Info("leaving alone a VM that is not ours", "vmid", vmid, "name", cfg.Name, "want", o.vmName())
		return false, true, nil
	}
	return true, true, nil
}

// logTask logs a Proxmox task started for a job's VM, its UPID at info
// level: the audit's link from a job to what Proxmox's task log holds.
func logTask(log *slog.Logger, what string, vmid int, job, upid string) {
	log.Info("proxmox task", "task", what, "vmid", vmid, "job", job, "upid", upid)
}
