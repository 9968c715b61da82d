package cli

import "syscall"

// hostMemory is this host's memory in bytes (/proc/meminfo's MemTotal:
// the kernel's totalram pages, which sysinfo(2) gives without the ~50
// lines of text the kernel writes for /proc/meminfo, on every CLI start),
// 0 if unknown.
func hostMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 0
	}
	unit := int64(si.Unit)
	if unit == 0 {
		unit = 1
	}
	return int64(si.Totalram) * unit
}
