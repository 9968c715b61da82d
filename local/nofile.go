package local

import (
	"fmt"
	"math"
)

// The host's file table is shared by every process on it: past
// fs.file-max open files, unprivileged processes of the host get ENFILE
// (an unprivileged `cat /etc/hostname` fails, and no sandbox starts). A
// job holds at most PidsMax processes, each with at most RLIMIT_NOFILE
// descriptors, and delegate chooses the two so that the sandboxes it may
// hold at once (Config.Sandboxes: jobs running at once and sandboxes kept
// after their jobs) cannot together take more than half the table:
//
//	sandboxes × pids × nofile ≤ min(fs.file-max, memory default) / 2
//
// The memory default is what the kernel itself sets fs.file-max to, one
// file per 10 KiB of memory: systemd raises fs.file-max to LONG_MAX,
// which bounds nothing, while the kernel's memory for files does not grow
// with it. The per-sandbox share goes to nofile first (DefaultNoFile at
// most, minNoFile at least, never above the server's own hard limit),
// then, if even minNoFile is too many, pids come down (to minPids at
// least). What an operator sets (Config.PidsMax, Config.NoFile) is taken
// as it is.
//
// Descriptors are not all: a file mapped and then closed holds an entry
// with none. Its struct file and its mapping are charged to the job's
// memory cgroup (384 bytes at least, mappedFileBytes in the tests), so
// the memory limit bounds those, at memory/384 per sandbox: a bound no
// memory limit makes small next to the table, which docs/security.md's
// security model gives in numbers, with the fix (fs.file-max).
const (
	// DefaultPidsMax is the processes and threads of one sandbox when the
	// file budget allows them.
	DefaultPidsMax = 512
	// DefaultNoFile is the usual soft RLIMIT_NOFILE, a job's when the
	// file budget allows it.
	DefaultNoFile = 1024
	minNoFile     = 256
	minPids       = 64
	// DefaultSandboxes is the file budget's share count when
	// Config.Sandboxes is 0: delegate.DefaultMaxConcurrent running and
	// as many kept.
	DefaultSandboxes = 8
	// KeptSandboxes is what cmd/delegate adds to the jobs running at once
	// for Config.Sandboxes: kept (persistent) sandboxes hold files too.
	KeptSandboxes = 4
)

// fileBudget is the host's file table as the job limits see it.
type fileBudget struct {
	FileMax    int64 // fs.file-max
	MemDefault int64 // MemTotal in KiB / 10, the kernel's own default
	Sandboxes  int
}

// perSandbox is one sandbox's share: half the smaller of the two, over
// the sandboxes.
func (f fileBudget) perSandbox() int64 {
	return min(f.FileMax, f.MemDefault) / 2 / int64(max(f.Sandboxes, 1))
}

// jobLimits chooses pids and nofile (see above): pids and nofile are the
// operator's (0: choose), hard is the server's own RLIMIT_NOFILE hard
// limit. over reports a choice whose product exceeds the share (the
// minimums, or the operator's values, do not fit).
func jobLimits(f fileBudget, pids, nofile int, hard uint64) (gotPids, gotNoFile int, over bool, err error) {
	if pids < 0 {
		return 0, 0, false, fmt.Errorf("PidsMax %d (DELEGATE_PIDS_MAX) is negative", pids)
	}
	if nofile < 0 {
		return 0, 0, false, fmt.Errorf("NoFile %d (DELEGATE_NOFILE) is negative", nofile)
	}
	ceiling := int(min(hard, math.MaxInt32))
	if nofile > ceiling {
		return 0, 0, false, fmt.Errorf("NoFile %d (DELEGATE_NOFILE) is above this server's own open-file limit, %d (its hard RLIMIT_NOFILE): a job never gets more than the server", nofile, hard)
	}
	share := f.perSandbox()
	gotPids, gotNoFile = pids, nofile
	if gotPids == 0 {
		gotPids = DefaultPidsMax
	}
	if gotNoFile == 0 {
		gotNoFile = int(min(max(share/int64(gotPids), minNoFile), DefaultNoFile, int64(ceiling)))
	}
	if pids == 0 && int64(gotPids)*int64(gotNoFile) > share {
		gotPids = int(max(share/int64(gotNoFile), minPids))
	}
	return gotPids, gotNoFile, int64(gotPids)*int64(gotNoFile) > share, nil
}
