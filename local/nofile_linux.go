//go:build linux

package local

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// hostFileBudget reads the host's file table limit and memory.
func hostFileBudget(sandboxes int) (fileBudget, error) {
	f := fileBudget{Sandboxes: sandboxes}
	data, err := os.ReadFile("/proc/sys/fs/file-max")
	if err != nil {
		return f, fmt.Errorf("read fs.file-max: %w", err)
	}
	// LONG_MAX (systemd's) does not fit an int64 parse on every kernel's
	// spelling; anything that does not parse bounds nothing.
	if f.FileMax, err = strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err != nil || f.FileMax <= 0 {
		f.FileMax = 1<<63 - 1
	}
	mem, err := os.Open("/proc/meminfo")
	if err != nil {
		return f, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	defer mem.Close()
	sc := bufio.NewScanner(mem)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil || kib <= 0 {
				return f, fmt.Errorf("/proc/meminfo: MemTotal %q", rest)
			}
			f.MemDefault = kib / 10
			return f, nil
		}
	}
	return f, fmt.Errorf("/proc/meminfo has no MemTotal")
}

// serverNoFileHard is the server's own hard RLIMIT_NOFILE.
func serverNoFileHard() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	return rl.Max, nil
}
