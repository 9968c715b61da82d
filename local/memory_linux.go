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
		if !e.IsDir() || !idPattern().MatchString(e.Name()) {
			continue
		}
		// A sandbox of one command has its shim and init in its own
		// directory; a kept sandbox has its keeper and init there, and a
		// shim per command under execs/ while the command runs (or what
		// it left in the background holds its output, or it waits for
		// the next command), and the C init's spare, a fork of it waiting
		// for the next command in the sandbox's cgroup.
		dirs := []string{filepath.Join(b.dir, e.Name())}
		if execs, err := os.ReadDir(filepath.Join(dirs[0], dirExecs)); err == nil {
			for _, x := range execs {
				dirs = append(dirs, filepath.Join(dirs[0], dirExecs, x.Name()))
			}
		}
		counted := false
		seen := map[int]bool{}
		for _, dir := range dirs {
			shim, alive := shimAlive(dir)
			// A shim supervises one command after another (shim_idle in
			// command_linux.c): the directories of its earlier commands
			// name it too.
			if !alive || seen[shim] {
				continue
			}
			seen[shim] = true
			pids := []int{shim}
			// init, if it is still the shim's child (pids are reused).
			if pid, err := readPID(filepath.Join(dir, fileInitPID)); err == nil && parentOf(pid) == shim {
				pids = append(pids, pid)
				pids = append(pids, spares(dir, pid)...)
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

// spares lists the spares of the kept sandbox in dir whose init is
// initPID: the processes of its pids group's spare-N groups that are
// init's children.
func spares(dir string, initPID int) []int {
	var st sandboxState
	if readJSON(filepath.Join(dir, fileState), &st) != nil || !st.Init || st.Cgroup.Pids == "" {
		return nil
	}
	groups, _ := filepath.Glob(filepath.Join(st.Cgroup.Pids, "spare-*"))
	var out []int
	for _, g := range groups {
		pids, _ := cgroupProcs(g)
		for _, pid := range pids {
			if parentOf(pid) == initPID {
				out = append(out, pid)
			}
		}
	}
	return out
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
