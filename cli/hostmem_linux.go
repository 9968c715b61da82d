package cli

import (
	"os"
	"strconv"
	"strings"
)

// hostMemory is this host's memory in bytes (MemTotal), 0 if unknown.
func hostMemory() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil && kib > 0 {
				return kib << 10
			}
		}
	}
	return 0
}
