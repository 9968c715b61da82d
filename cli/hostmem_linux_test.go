package cli

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestHostMemory: sysinfo(2)'s total is /proc/meminfo's MemTotal, which
// hostMemory read before (the maxima it sets must not move).
func TestHostMemory(t *testing.T) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("MemTotal %q: %v", rest, err)
			}
			want = kib << 10
		}
	}
	if want == 0 {
		t.Fatal("/proc/meminfo has no MemTotal")
	}
	if got := hostMemory(); got != want {
		t.Errorf("hostMemory() = %d, /proc/meminfo's MemTotal is %d", got, want)
	}
}
