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

// quotaNeeds is what a submission adds.
type quotaNeeds struct {
	job, sandbox bool
	res          delegate.Resources // zero: none (a command in a kept sandbox)
}

// admitter is the check of ctx's principal's quotas for need, for the
// store to run where it inserts (delegate.QuotaStore): nil when none
// applies (no principal, an operator, no quota set).
func admitter(ctx context.Context, q Quotas, need quotaNeeds) delegate.Admit {
	p := delegate.PrincipalOf(ctx)
	if p == nil || p.Admin() || q == (Quotas{}) {
		return nil
	}
	return func(use delegate.Holdings) error { return overQuota(p.Name, q, need, use) }
}

// overQuota refuses principal, holding use, what would take it over q.
func overQuota(principal string, q Quotas, need quotaNeeds, use delegate.Holdings) error {
	over := func(quota, setting, used, asked, limit string) error {
		return &delegate.QuotaError{Principal: principal, Quota: quota, Setting: setting, Use: used, Asked: asked, Limit: limit}
	}
	if need.job && q.Jobs > 0 && use.Jobs+1 > q.Jobs {
		return over("jobs not ended", "DELEGATE_QUOTA_JOBS", strconv.Itoa(use.Jobs), "1", strconv.Itoa(q.Jobs))
	}
	if need.sandbox && q.Sandboxes > 0 && use.Sandboxes+1 > q.Sandboxes {
		return over("kept sandboxes", "DELEGATE_QUOTA_SANDBOXES", strconv.Itoa(use.Sandboxes), "1", strconv.Itoa(q.Sandboxes))
	}
	if q.CPU > 0 && need.res.CPU > 0 && use.CPU+need.res.CPU > q.CPU {
		return over("CPU in use", "DELEGATE_QUOTA_CPU", formatCPU(use.CPU), formatCPU(need.res.CPU), formatCPU(q.CPU))
	}
	if mem, _ := delegate.ParseSize(need.res.Memory); q.MemoryBytes > 0 && mem > 0 && use.MemoryBytes+mem > q.MemoryBytes {
		return over("memory in use", "DELEGATE_QUOTA_MEMORY", delegate.FormatBytes(use.MemoryBytes), delegate.FormatBytes(mem), delegate.FormatBytes(q.MemoryBytes))
	}
	return nil
}

// checkQuota refuses ctx's principal what would take it over a quota now,
// ahead of a costly step (a sandbox's machine made): the store's insert
// decides again, atomically (admitter).
func checkQuota(ctx context.Context, store delegate.QuotaStore, q Quotas, need quotaNeeds) error {
	admit := admitter(ctx, q, need)
	if admit == nil {
		return nil
	}
	name := delegate.PrincipalOf(ctx).Name
	use, err := store.Holdings(ctx, name)
	if err != nil {
		return fmt.Errorf("quota of %s: %w", name, err)
	}
	return admit(use)
}

func formatCPU(c float64) string { return strconv.FormatFloat(c, 'f', -1, 64) }
