package proxmox

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// Cloning. Proxmox's /cluster/nextid reserves nothing: the new VM's
// config is written by the clone task, so two clones started together can
// be given the same vmid, and the loser's task fails ("unable to create VM
// N: config file already exists", or a time-out on the lock of N). Within
// one server, vmids are handed out under one lock and ids whose clone is
// still in flight are skipped; between servers, a collision is retried
// with another id. After a failed clone the vmid is checked before
// anything is cleaned up: it may belong to the clone that won.

// maxCloneAttempts bounds the retries of collisions and lock time-outs.
const maxCloneAttempts = 6

// vmids hands out vmids to this server's clones.
type vmids struct {
	c *pve.Client
	// lo and hi bound the vmids handed out (PROXMOX_VMID_RANGE); 0: any,
	// as /cluster/nextid says.
	lo, hi int

	mu      sync.Mutex
	cloning map[int]bool // vmids handed out whose clone task has not ended
	next    int          // where the range's next look starts
}

// allocate returns a vmid no clone of this server is using.
func (ids *vmids) allocate(ctx context.Context) (int, error) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.lo > 0 {
		return ids.inRange(ctx)
	}
	first, err := ids.c.NextID(ctx)
	if err != nil {
		return 0, fmt.Errorf("proxmox: next vmid: %w", privilegeHint(err))
	}
	// Proxmox's answer may be an id a clone of ours is still making: the
	// next one that is neither ours in flight nor taken is.
	id := first
	for ; ; id++ {
		if ids.cloning[id] {
			continue
		}
		if id == first {
			break
		}
		free, err := ids.c.VMIDFree(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("proxmox: is vmid %d free: %w", id, err)
		}
		if free {
			break
		}
	}
	ids.cloning[id] = true
	return id, nil
}

// inRange finds a vmid of the range that no VM or container has and no
// clone of this server is making, looking on from the last one handed
// out (/cluster/nextid gives the lowest free id of the cluster, which may
// be outside it). Another server may take the same id meanwhile: the
// clone's collision is retried with another (clone). ids.mu held.
func (ids *vmids) inRange(ctx context.Context) (int, error) {
	resources, err := ids.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return 0, fmt.Errorf("proxmox: list VMs for a vmid: %w", privilegeHint(err))
	}
	used := map[int]bool{}
	for _, r := range resources {
		used[int(r.VMID)] = true
	}
	n := ids.hi - ids.lo + 1
	start := max(ids.next, ids.lo)
	for i := range n {
		id := ids.lo + (start-ids.lo+i)%n
		if !used[id] && !ids.cloning[id] {
			ids.cloning[id], ids.next = true, id+1
			return id, nil
		}
	}
	return 0, fmt.Errorf("proxmox: every vmid of PROXMOX_VMID_RANGE %d-%d is taken: widen it", ids.lo, ids.hi)
}

// ParseVMIDRange reads PROXMOX_VMID_RANGE ("LOW-HIGH", vmids from 100 to
// 999999999).
func ParseVMIDRange(s string) (lo, hi int, err error) {
	a, b, ok := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || lo < 100 || hi > 999999999 || lo > hi {
		return 0, 0, fmt.Errorf("PROXMOX_VMID_RANGE=%q: must be LOW-HIGH, vmids from 100 to 999999999, like 800000-899999", s)
	}
	return lo, hi, nil
}

// allocated ends the hand-out of a vmid: its clone task ended, and the
// vmid is now Proxmox's to report as taken (or free).
func (ids *vmids) allocated(id int) {
	ids.mu.Lock()
	delete(ids.cloning, id)
	ids.mu.Unlock()
}

// inFlight: a clone of this process is making the VM.
func (ids *vmids) inFlight(vmid int) bool {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	return ids.cloning[vmid]
}

// cloner makes VMs: linked (or full) clones of a template, named for
// their owner in the clone call itself.
type cloner struct {
	c    *pve.Client
	cfg  *Config
	log  *slog.Logger
	ids  *vmids
	link linkMemo
	vms  destroyer
}

// linkMemo remembers which templates' storages cannot link.
type linkMemo interface {
	isFull(info *templateInfo) bool
	cloneFull(info *templateInfo)
}

// destroyer ends a VM of an owner, after checking it is still the owner's.
type destroyer interface {
	destroyVM(ctx context.Context, node string, vmid int, o owner) error
}

// clone makes the job's VM on the hold's node, named for its owner in
// the clone call itself, and returns its vmid.
func (cl *cloner) clone(ctx context.Context, h *hold, o owner) (int, error) {
	tpl := h.tpl
	for attempt := 1; ; attempt++ {
		vmid, err := cl.ids.allocate(ctx)
		if err != nil {
			return 0, err
		}
		h.cloning(vmid)
		full := cl.link.isFull(h.info)
		opt := pve.CloneOptions{NewID: vmid, Name: o.vmName(), Description: "delegate job " + o.job, Full: &full, Pool: cl.cfg.ResourcePool}
		if h.target {
			opt.Target = h.node
		}
		err = cl.cloneOnce(ctx, tpl, opt, h.node, o)
		cl.ids.allocated(vmid)
		switch {
		case err == nil:
			cl.log.Info("cloned", "template", tpl.VMID, "vmid", vmid, "node", h.node, "full", full, "job", o.job)
			return vmid, nil
		case !full && pve.IsLinkedCloneUnsupported(err):
			// Refused before anything was made: this storage cannot link.
			cl.log.Info("the template's storage cannot make linked clones: full clones from now on", "template", tpl.VMID, "err", err)
			cl.link.cloneFull(h.info)
			attempt--
			continue
		case ctx.Err() != nil:
			return 0, fmt.Errorf("proxmox: clone template %d: %w", tpl.VMID, ctx.Err())
		case attempt < maxCloneAttempts && retryClone(err):
			cl.log.Info("clone collided, retrying with another vmid", "vmid", vmid, "attempt", attempt, "err", err)
			wait := time.Duration(50+rand.IntN(200)) * time.Millisecond * time.Duration(attempt)
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(wait):
			}
		default:
			return 0, fmt.Errorf("proxmox: clone template %s (%d) on %s: %w", templateLabel(tpl), tpl.VMID, tpl.Node, privilegeHint(err))
		}
	}
}

// cloneOnce starts one clone and waits for its task. If it fails, what
// the vmid now holds is destroyed only if it is this owner's. If ctx ends
// meanwhile, the task (which goes on in Proxmox) is still waited for, a
// while, so that its VM is not left behind.
func (cl *cloner) cloneOnce(ctx context.Context, tpl pve.Resource, opt pve.CloneOptions, node string, o owner) error {
	upid, err := cl.c.CloneVM(ctx, tpl.Node, int(tpl.VMID), opt)
	if err != nil {
		return err // refused before a task began: nothing was made
	}
	logTask(cl.log, "clone", opt.NewID, o.job, upid)
	err = cl.c.WaitTask(ctx, tpl.Node, upid)
	if err == nil {
		return nil
	}
	cleanup := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		cleanup, cancel = context.WithTimeout(cleanup, 5*time.Minute)
		defer cancel()
		if werr := cl.c.WaitTask(cleanup, tpl.Node, upid); werr != nil {
			return err // it failed anyway (or still runs): Proxmox removes a failed clone
		}
	}
	cl.vms.destroyVM(cleanup, node, opt.NewID, o)
	return err
}

// retryClone: the clone failed in a way another vmid, or another moment,
// can fix: the vmid was taken (on this node, or on another: pmxcfs's
// "close (rename) atomic file ... File exists"), or a lock (of the new
// VM, the template, a local storage, or pmxcfs's of a shared storage) was
// held too long.
func retryClone(err error) bool {
	return pve.IsAlreadyExists(err) || pve.IsVMIDTakenElsewhere(err) || pve.LockTimeout(err) != "" ||
		pve.IsClusterLockTimeout(err) || pve.IsLocked(err)
}
