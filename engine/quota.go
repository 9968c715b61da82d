package engine

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
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
	// DiskBytes bounds the disk of its checkpoints and caches together:
	// a checkpoint that would pass it is refused (and deleted), a
	// cache's growth is not written back (the backend logs it, and the
	// next job that takes the cache has it in its CacheMissed).
	DiskBytes int64
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

// diskAdmitter is the check of ctx's principal's disk quota for a
// checkpoint of asked bytes, for the store to run where it records the
// checkpoint (delegate.QuotaStore.UpdateSandboxAdmitted), so that two
// checkpoints at once never both pass it: nil when none applies (no
// principal, an operator, no disk quota). Its checkpoints are read there;
// its caches, which the backend measures (sandbox.CacheMeter), now.
func diskAdmitter(ctx context.Context, b sandbox.Backend, q Quotas, asked int64) (delegate.Admit, error) {
	p := delegate.PrincipalOf(ctx)
	if p == nil || p.Admin() || q.DiskBytes <= 0 {
		return nil, nil
	}
	var caches int64
	if m, ok := b.(sandbox.CacheMeter); ok {
		c, err := m.CacheBytes(p.Name)
		if err != nil {
			return nil, fmt.Errorf("disk quota of %s: its caches: %w", p.Name, err)
		}
		caches = c
	}
	return func(h delegate.Holdings) error {
		if use := h.CheckpointBytes + caches; use+asked > q.DiskBytes {
			return &delegate.QuotaError{Principal: p.Name, Quota: "disk of checkpoints and caches", Setting: "DELEGATE_QUOTA_DISK",
				Use: delegate.FormatBytes(use), Asked: delegate.FormatBytes(asked), Limit: delegate.FormatBytes(q.DiskBytes),
				Free: "delete a checkpoint (sandbox_checkpoint action delete) or release a kept sandbox (its checkpoints go with it)"}
		}
		return nil
	}, nil
}

// cacheLimit is the room principal's disk quota leaves its caches (less
// its checkpoints), for the backend's write-back: 0 (no bound) for an
// operator, or without a quota. A job's start has no request, so the
// operator is known by name: the local user, or a principal with a
// valid token of the admin scope (an issuer's operator is held).
func cacheLimit(ctx context.Context, store delegate.Store, q Quotas, principal string) (int64, error) {
	if q.DiskBytes <= 0 || principal == delegate.LocalPrincipal || principal == "" {
		return 0, nil
	}
	tokens, err := store.Tokens(ctx)
	if err != nil {
		return q.DiskBytes, err
	}
	now := time.Now()
	for _, t := range tokens {
		if t.Principal == principal && t.Valid(now) && slices.Contains(t.Scopes, delegate.ScopeAdmin) {
			return 0, nil
		}
	}
	h, err := store.Holdings(ctx, principal)
	if err != nil {
		return q.DiskBytes, err
	}
	return max(q.DiskBytes-h.CheckpointBytes, 1), nil
}

func formatCPU(c float64) string { return strconv.FormatFloat(c, 'f', -1, 64) }
