package pvetools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/pve"
)

// Which VMs delegate's running jobs hold. Two signs, read together, so
// that a VM is protected from its clone on:
//
//   - the job store's sandbox id: the Proxmox backend names a job's
//     sandbox after its VM, "vm-<vmid>" (and "vm-<vmid>-<job id>" since
//     ownership became explicit), recorded once the clone is made;
//   - the VM itself, for the moments before that: delegate names the VM
//     in its clone call "delegate-[<instance>-]<job id>" and tags it with
//     the job id right after. A job id ("job-" and 26 random characters)
//     is no template's name or tag, so neither can be inherited by
//     mistake.
//
// Only jobs that have not finished (provisioning, running) count: a
// pending job has no VM yet, a finished one has given it back.

var sandboxVMRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^vm-(\d+)(?:-|$)`) })

// liveJobs lists the jobs that may hold a VM now.
func (t *tools) liveJobs(ctx context.Context) ([]*delegate.Job, error) {
	var out []*delegate.Job
	for _, status := range []delegate.Status{delegate.StatusProvisioning, delegate.StatusRunning} {
		cursor := ""
		for {
			page, err := t.cfg.Jobs.List(ctx, delegate.ListOptions{Status: status, Limit: delegate.MaxPageSize, Cursor: cursor})
			if err != nil {
				return nil, err
			}
			for _, s := range page.Jobs {
				j, err := t.cfg.Jobs.Get(ctx, s.ID)
				if errors.Is(err, delegate.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				if !j.Status.Terminal() {
					out = append(out, j)
				}
			}
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
	}
	return out, nil
}

// jobOwning returns the running job that holds a VM, or nil.
func (t *tools) jobOwning(ctx context.Context, node string, typ pve.GuestType, vmid int) (*delegate.Job, error) {
	if t.cfg.Jobs == nil || typ != pve.QEMU {
		return nil, nil // delegate's jobs run in VMs only
	}
	jobs, err := t.liveJobs(ctx)
	if err != nil || len(jobs) == 0 {
		return nil, err
	}
	for _, j := range jobs {
		if m := sandboxVMRe().FindStringSubmatch(j.SandboxID); m != nil && m[1] == strconv.Itoa(vmid) {
			return j, nil
		}
	}
	conf, err := t.c.GuestConfig(ctx, node, typ, vmid)
	if err != nil {
		if pve.IsNotFound(err) {
			return nil, nil // the action itself will say so, in Proxmox's words
		}
		return nil, err
	}
	name := conf["name"]
	tags := strings.FieldsFunc(conf["tags"], func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
	for _, j := range jobs {
		id := strings.ToLower(j.ID)
		if strings.HasPrefix(name, "delegate-") && strings.HasSuffix(name, "-"+id) || slices.Contains(tags, id) {
			return j, nil
		}
	}
	return nil, nil
}

// refuseJobVM fails when a running job holds the VM. action says what
// the tool would do to it ("resizing its disk").
func (t *tools) refuseJobVM(ctx context.Context, node string, typ pve.GuestType, vmid int, action string) error {
	j, err := t.jobOwning(ctx, node, typ, vmid)
	if err != nil {
		return fmt.Errorf("cannot tell whether a delegate job holds VM %d, so it is left alone: %w", vmid, proxmoxError(err))
	}
	if j == nil {
		return nil
	}
	return answer(delegate.ErrConflict, "VM %d belongs to delegate job %s (%s): %s could break the job; "+
		"cancel the job with cancel_job, or pass force: true to go ahead", vmid, j.ID, j.Status, action)
}
