package engine

import (
	"fmt"
	"strconv"

	"github.com/delegate-dev/delegate"
)

// Maxima are the operator's caps on what one job may ask for, within the
// manifest's own bounds (delegate.MaxCPU...): a server on a laptop must
// not accept a job of 1 TiB of memory or 128 cores. Zero leaves a
// resource to the manifest's bounds. Each cap's setting names it in the
// error a manifest over it gets.
type Maxima struct {
	CPU            float64 // DELEGATE_MAX_CPU
	MemoryBytes    int64   // DELEGATE_MAX_MEMORY
	DiskBytes      int64   // DELEGATE_MAX_DISK
	TimeoutSeconds int     // DELEGATE_MAX_TIMEOUT
}

// check returns a *delegate.FieldError for the first resource of m (its
// defaults applied) over its maximum.
func (x Maxima) check(m *delegate.Manifest) error {
	over := func(field, setting, max, got string) error {
		return &delegate.FieldError{Field: field, Rule: fmt.Sprintf("must be at most %s on this server (%s; got %s)", max, setting, got)}
	}
	if r := m.Resources; r != nil {
		if x.CPU > 0 && r.CPU > x.CPU {
			return over("manifest.resources.cpu", "DELEGATE_MAX_CPU", strconv.FormatFloat(x.CPU, 'g', -1, 64)+" cores", strconv.FormatFloat(r.CPU, 'g', -1, 64))
		}
		for _, s := range []struct {
			field, setting, value string
			max                   int64
		}{
			{"manifest.resources.memory", "DELEGATE_MAX_MEMORY", r.Memory, x.MemoryBytes},
			{"manifest.resources.disk", "DELEGATE_MAX_DISK", r.Disk, x.DiskBytes},
		} {
			if n, err := delegate.ParseSize(s.value); err == nil && s.max > 0 && n > s.max {
				return over(s.field, s.setting, formatSize(s.max), s.value)
			}
		}
	}
	if t := m.Timeout; t != nil && x.TimeoutSeconds > 0 && *t > x.TimeoutSeconds {
		return over("manifest.timeout", "DELEGATE_MAX_TIMEOUT", strconv.Itoa(x.TimeoutSeconds)+" seconds", strconv.Itoa(*t))
	}
	return nil
}

// formatSize writes n bytes as the largest unit of K, M, G, T (powers of
// 1024) that it is a whole number of, as a manifest's sizes are written.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
