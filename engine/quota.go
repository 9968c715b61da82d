package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/delegate-dev/delegate"
)

// Quotas bound what one principal holds at once, so that one agent (or
// one person) cannot take a shared server's every slot, sandbox, CPU or
// byte of memory; 0 is no bound. The operator (admin scope) is held only
// by the server's own maxima. A submission over a quota is refused at
// once with the quota, the use and the setting named: nothing waits
// silently for room that this principal's own work holds.
type Quotas struct {
	// Jobs not ended (pending, provisioning, running).
	Jobs int
	// Sandboxes kept and not released.
	Sandboxes int
	// CPU and MemoryBytes in use: the resources of the jobs not ended
	// (a command in a kept sandbox uses its sandbox's) and of the kept
	// sandboxes.
	CPU         float64
	MemoryBytes int64
}

// quotaUse is what a principal holds now.
type quotaUse struct {
	jobs, sandboxes int
	cpu             float64
	mem             int64
}

// quotaNeeds is what a submission adds.
type quotaNeeds struct {
	job, sandbox bool
	res          delegate.Resources // zero: none (a command in a kept sandbox)
}

// checkQuota refuses ctx's principal what would take it over a quota.
func checkQuota(ctx context.Context, store delegate.Store, q Quotas, need quotaNeeds) error {
	p := delegate.PrincipalOf(ctx)
	if p == nil || p.Admin() || q == (Quotas{}) {
		return nil
	}
	use, err := usage(ctx, store, p.Name)
	if err != nil {
		return fmt.Errorf("quota of %s: %w", p.Name, err)
	}
	over := func(quota, setting, used, asked, limit string) error {
		return &delegate.QuotaError{Principal: p.Name, Quota: quota, Setting: setting, Use: used, Asked: asked, Limit: limit}
	}
	if need.job && q.Jobs > 0 && use.jobs+1 > q.Jobs {
		return over("jobs not ended", "DELEGATE_QUOTA_JOBS", strconv.Itoa(use.jobs), "1", strconv.Itoa(q.Jobs))
	}
	if need.sandbox && q.Sandboxes > 0 && use.sandboxes+1 > q.Sandboxes {
		return over("kept sandboxes", "DELEGATE_QUOTA_SANDBOXES", strconv.Itoa(use.sandboxes), "1", strconv.Itoa(q.Sandboxes))
	}
	if q.CPU > 0 && need.res.CPU > 0 && use.cpu+need.res.CPU > q.CPU {
		return over("CPU in use", "DELEGATE_QUOTA_CPU", formatCPU(use.cpu), formatCPU(need.res.CPU), formatCPU(q.CPU))
	}
	if mem, _ := delegate.ParseSize(need.res.Memory); q.MemoryBytes > 0 && mem > 0 && use.mem+mem > q.MemoryBytes {
		return over("memory in use", "DELEGATE_QUOTA_MEMORY", delegate.FormatBytes(use.mem), delegate.FormatBytes(mem), delegate.FormatBytes(q.MemoryBytes))
	}
	return nil
}

func formatCPU(c float64) string { return strconv.FormatFloat(c, 'f', -1, 64) }

// usage adds up what principal holds: its jobs not ended and its live
// kept sandboxes, read under its own name (the stores' filter).
func usage(ctx context.Context, store delegate.Store, principal string) (quotaUse, error) {
	var u quotaUse
	ctx = delegate.WithPrincipal(ctx, &delegate.Principal{Name: principal})
	add := func(r delegate.Resources) {
		u.cpu += r.CPU
		if m, err := delegate.ParseSize(r.Memory); err == nil {
			u.mem += m
		}
	}
	cursor := ""
	for {
		jobs, next, err := store.ListJobs(ctx, delegate.JobFilter{Principal: principal, Active: true, Limit: delegate.MaxPageSize, Cursor: cursor})
		if err != nil {
			return u, err
		}
		for _, j := range jobs {
			u.jobs++
			// A command in a kept sandbox (or a persistent job once its
			// sandbox is kept) uses the sandbox's resources, counted there.
			if j.Sandbox == "" && j.Manifest.Resources != nil {
				add(*j.Manifest.Resources)
			}
		}
		if next == "" || len(jobs) == 0 {
			break
		}
		cursor = next
	}
	sbs, err := store.ListSandboxes(ctx, true, delegate.MaxPageSize)
	if err != nil {
		return u, err
	}
	for _, sb := range sbs {
		u.sandboxes++
		add(sb.Resources)
	}
	return u, nil
}
