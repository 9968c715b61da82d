package cli

import (
	"fmt"
	"strconv"

	"github.com/delegate-dev/delegate"
)

// Quotas per principal (DELEGATE_QUOTA_*): what one principal without the
// admin scope (a token of delegate's own, an issuer's user) may hold at
// once on a shared server. The local operator is held by the server's
// maxima alone.
const (
	defaultQuotaJobs      = 16
	defaultQuotaSandboxes = 4
	defaultQuotaDisk      = 20 << 30
)

// Quotas are the DELEGATE_QUOTA_* settings; 0 is no bound.
type Quotas struct {
	Jobs, Sandboxes int
	CPU             float64
	MemoryBytes     int64
	DiskBytes       int64
}

func quotaVars() []envVar {
	return []envVar{
		{"DELEGATE_QUOTA_JOBS", strconv.Itoa(defaultQuotaJobs), "jobs not ended (pending or running) one principal may have at once, besides the operator (0: no bound)"},
		{"DELEGATE_QUOTA_SANDBOXES", strconv.Itoa(defaultQuotaSandboxes), "kept sandboxes one principal may have at once, besides the operator (0: no bound)"},
		{"DELEGATE_QUOTA_CPU", "0 (no bound)", "cpu cores one principal's jobs and kept sandboxes may hold at once, besides the operator"},
		{"DELEGATE_QUOTA_MEMORY", "0 (no bound)", "memory one principal's jobs and kept sandboxes may hold at once, like 16G, besides the operator"},
		{"DELEGATE_QUOTA_DISK", "20G", "disk one principal's checkpoints and caches may hold together, besides the operator (0: no bound)"},
	}
}

// loadQuotas reads DELEGATE_QUOTA_*.
func (c *Config) loadQuotas(getenv func(string) string, bad func(name, rule string)) {
	c.Quotas = Quotas{Jobs: defaultQuotaJobs, Sandboxes: defaultQuotaSandboxes, DiskBytes: defaultQuotaDisk}
	for _, q := range []struct {
		name string
		dst  *int
	}{{"DELEGATE_QUOTA_JOBS", &c.Quotas.Jobs}, {"DELEGATE_QUOTA_SANDBOXES", &c.Quotas.Sandboxes}} {
		if v := getenv(q.name); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 100_000 {
				bad(q.name, "must be a whole number from 0 (no bound) to 100000")
			} else {
				*q.dst = n
			}
		}
	}
	if v := getenv("DELEGATE_QUOTA_CPU"); v != "" {
		if n, err := strconv.ParseFloat(v, 64); err != nil || n < 0 || n > 1_000_000 {
			bad("DELEGATE_QUOTA_CPU", "must be a number of cores, 0 for no bound")
		} else {
			c.Quotas.CPU = n
		}
	}
	if v := getenv("DELEGATE_QUOTA_MEMORY"); v == "0" {
		c.Quotas.MemoryBytes = 0
	} else if v != "" {
		if n, err := delegate.ParseSize(v); err != nil || n < delegate.MinMemoryBytes {
			bad("DELEGATE_QUOTA_MEMORY", fmt.Sprintf("must be a size like 16G (at least %dM), or 0 for no bound", delegate.MinMemoryBytes>>20))
		} else {
			c.Quotas.MemoryBytes = n
		}
	}
	if v := getenv("DELEGATE_QUOTA_DISK"); v == "0" {
		c.Quotas.DiskBytes = 0
	} else if v != "" {
		if n, err := delegate.ParseSize(v); err != nil || n < delegate.MinDiskBytes {
			bad("DELEGATE_QUOTA_DISK", "must be a size like 20G (at least 1M), or 0 for no bound")
		} else {
			c.Quotas.DiskBytes = n
		}
	}
}
