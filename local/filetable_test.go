//go:build linux

package local

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// runMapFiles is the "mapfiles" helper: it maps a page of args[0] and
// closes the file, again and again, until a mapping fails (the memory
// limit, or the process's map count); each mapping keeps a file of the
// host's table open with no descriptor. It says how many it holds, then
// holds them until killed.
func runMapFiles(args []string) int {
	var maps [][]byte
	var err error
	for {
		var fd int
		if fd, err = unix.Open(args[0], unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			break
		}
		var m []byte
		m, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
		unix.Close(fd)
		if err != nil {
			break
		}
		maps = append(maps, m)
	}
	// Room for the runtime to go on (its own mappings, its memory).
	for _, m := range maps[max(len(maps)-1024, 0):] {
		unix.Munmap(m)
	}
	maps = maps[:max(len(maps)-1024, 0)]
	fmt.Printf("mapped %d (%v)\n", len(maps), err)
	waitKilled()
	return 0
}

// fileNr is the host's count of open files (fs.file-nr's first field).
func fileNr(t testing.TB) int64 {
	data, err := os.ReadFile("/proc/sys/fs/file-nr")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mappedFileBytes is what one file a job maps and closes costs of its
// memory limit, at least: its struct file and the mapping's
// vm_area_struct (192 bytes each in this kernel's slabs, both charged to
// the job's memory cgroup), and the mapping's share of its tree. The
// README's security model ("Open files") gives the bound it makes.
const mappedFileBytes = 384

// TestMappedFilesBoundedByMemory: a file mapped and closed keeps an entry
// of the host's file table with no descriptor, which RLIMIT_NOFILE does
// not count; the job's memory limit does (its struct file and its
// mapping are charged to the job's memory cgroup): a job that maps files
// until it cannot holds at most its memory over mappedFileBytes of the
// table, and is OOM-killed there (issue 34, item 9).
func TestMappedFilesBoundedByMemory(t *testing.T) {
	b := newBackend(t, 0)
	spec := defaultSpec()
	spec.MemoryBytes = 64 << 20
	sb := create(t, b, spec)
	withHelper(t, sb)
	if err := sb.WriteFile(context.Background(), "/workspace/mapme", make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	before := fileNr(t)
	// Four processes: one stops at the kernel's map count (65,530), four
	// would pass the memory limit first.
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", "for i in 1 2 3 4; do /workspace/helper /workspace/mapme & done; wait"},
		Env: append([]string{testHelperEnv + "=mapfiles"}, testEnv...)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.state(sb.dir, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	// The four are done when each was OOM-killed or says it holds its
	// files (a helper stopped by its map count holds them until killed:
	// waiting for the job's end would wait for the deadline).
	var peak int64
	waitFor(2*time.Minute, func() bool {
		peak = max(peak, fileNr(t)-before)
		if _, err := os.Lstat(p.(*process).path(fileExit)); err == nil {
			return true
		}
		out, _ := os.ReadFile(p.(*process).path(fileOutput))
		kills, _ := st.Cgroup.oomKills()
		return kills+strings.Count(string(out), "mapped ") >= 4
	})
	p.Kill(context.Background())
	exit, _ := finish(t, p)
	bound := spec.MemoryBytes / mappedFileBytes
	t.Logf("the job held at most %d files of the host's table (memory %d MiB, %d bytes each at least; bound %d); its end %+v",
		peak, spec.MemoryBytes>>20, spec.MemoryBytes/max(peak, 1), bound, exit)
	if peak > bound {
		t.Errorf("a job of %d MiB held %d mapped files, more than its memory allows at %d bytes each (%d)", spec.MemoryBytes>>20, peak, mappedFileBytes, bound)
	}
	if peak < 10000 {
		t.Errorf("the job held only %d mapped files: the helper did not map", peak)
	}
}
