package delegate

import "time"

// Server defaults, defined once: the engine fills what its configuration
// leaves at zero from these, the CLI documents its environment with them,
// and the adapters describe them in their schemas and help.
const (
	// DefaultTimeoutSeconds, DefaultCPU, DefaultMemory and DefaultDisk fill
	// what a manifest leaves out (see ServerDefaults).
	DefaultTimeoutSeconds = 3600
	DefaultCPU            = 2
	DefaultMemory         = "2G"
	DefaultDisk           = "10G"

	// DefaultMaxConcurrent jobs run at once; more wait as pending.
	DefaultMaxConcurrent = 4
	// DefaultOutputLimit bytes of a job's output are kept, at most
	// MaxOutputLimit; the rest is counted, not kept.
	DefaultOutputLimit int64 = 4 << 20
	MinOutputLimit     int64 = 1 << 10
	MaxOutputLimit     int64 = 1 << 30

	// DefaultCleanupInterval is the time between sweeps for orphaned sandboxes.
	DefaultCleanupInterval = 30 * time.Second
	// DefaultHeartbeatThreshold: a running job silent this long fails.
	DefaultHeartbeatThreshold = 120 * time.Second
	// DefaultProvisionTimeout bounds creating a sandbox and writing its files.
	DefaultProvisionTimeout = 10 * time.Minute
	// DefaultArtifactMaxFile and DefaultArtifactMaxTotal cap what is kept
	// of one artifact and of all of one job's.
	DefaultArtifactMaxFile  int64 = 16 << 20
	DefaultArtifactMaxTotal int64 = 64 << 20

	// DefaultPageSize jobs are listed when ListOptions.Limit is 0, and at
	// most MaxPageSize.
	DefaultPageSize = 20
	MaxPageSize     = 200

	// DefaultOutputTail is how much of the end of the output a JobResult
	// carries when ResultOptions.OutputTail is 0.
	DefaultOutputTail = 64 << 10
	// DefaultLogBytes is the size of a LogPage when LogOptions.MaxBytes is
	// 0, and MaxLogBytes its largest.
	DefaultLogBytes = 64 << 10
	MaxLogBytes     = 1 << 20
)

// ServerDefaults are the manifest defaults of a server configured with
// nothing.
func ServerDefaults() Defaults {
	return Defaults{Timeout: DefaultTimeoutSeconds, CPU: DefaultCPU, Memory: DefaultMemory, Disk: DefaultDisk}
}

// Fill sets every zero field of d from fallback.
func (d *Defaults) Fill(fallback Defaults) {
	if d.Timeout == 0 {
		d.Timeout = fallback.Timeout
	}
	if d.CPU == 0 {
		d.CPU = fallback.CPU
	}
	if d.Memory == "" {
		d.Memory = fallback.Memory
	}
	if d.Disk == "" {
		d.Disk = fallback.Disk
	}
	if d.VMTemplate == "" {
		d.VMTemplate = fallback.VMTemplate
	}
}
