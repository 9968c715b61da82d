//go:build linux

package local

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SupervisorMemory measures the supervisors of this backend's sandboxes
// that are running now (see the type). `delegate bench` prints it.
func (b *Backend) SupervisorMemory() (SupervisorMemory, error) {
	var m SupervisorMemory
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return m, fmt.Errorf("supervisor memory: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || !idPattern.MatchString(e.Name()) {
			continue
		}
		// A sandbox of one command has its shim in its own directory; a
		// kept sandbox has one per command, under execs/ (a command that
		// ended with nothing left in the background has none).
		dirs := []string{filepath.Join(b.dir, e.Name())}
		if execs, err := os.ReadDir(filepath.Join(dirs[0], dirExecs)); err == nil {
			for _, x := range execs {
				dirs = append(dirs, filepath.Join(dirs[0], dirExecs, x.Name()))
			}
		}
		counted := false
		for _, dir := range dirs {
			shim, alive := shimAlive(dir)
			if !alive {
				continue
			}
			pids := []int{shim}
			// init, if it is still the shim's child (pids are reused).
			if pid, err := readPID(filepath.Join(dir, fileInitPID)); err == nil && parentOf(pid) == shim {
				pids = append(pids, pid)
			}
			for _, pid := range pids {
				u, err := procPSS(pid)
				if err != nil {
					continue // it just ended
				}
				m.PSS += u.pss
				m.PSSAnon += u.anon
				m.PSSFile += u.file
				m.Processes++
				counted = true
			}
		}
		if counted {
			m.Sandboxes++
		}
	}
	return m, nil
}

type pssUse struct{ pss, anon, file int64 }

// procPSS reads a process's proportional set size, in bytes.
func procPSS(pid int) (pssUse, error) {
	var u pssUse
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return u, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Pss":
			u.pss = kb << 10
		case "Pss_Anon":
			u.anon = kb << 10
		case "Pss_File":
			u.file = kb << 10
		}
	}
	return u, sc.Err()
}

// parentOf is the parent pid of pid, 0 if unknown.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// "pid (comm) S ppid ...": comm may contain anything.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
