//go:build linux

package local

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupLayout is where this server puts sandbox groups: one parent per
// controller (".../delegate" under the server's own group), found at
// startup. Sandboxes are "<parent>/<id>".
type cgroupLayout struct {
	Version int
	Memory  string
	CPU     string
	Pids    string
	// Freezer is where sandboxes are frozen when paused: cgroup v2's own
	// groups (cgroup.freeze), or v1's freezer hierarchy; "" when this
	// host has none (sandboxes cannot be paused).
	Freezer string
}

// serverLeaf is the cgroup v2 leaf the server moves itself into when its
// own group holds processes, because v2 forbids enabling controllers for
// children of a group that has processes of its own.
const serverLeaf = "delegate-server"

// procCgroup is one line of /proc/self/cgroup: "hier:controllers:path".
type procCgroup struct {
	Controllers []string // empty for the v2 line "0::/path"
	Path        string
}

func parseProcCgroup(data string) []procCgroup {
	var out []procCgroup
	for _, line := range strings.Split(data, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var ctrls []string
		if parts[1] != "" {
			ctrls = strings.Split(parts[1], ",")
		}
		out = append(out, procCgroup{Controllers: ctrls, Path: parts[2]})
	}
	return out
}

// groupDir maps a cgroup path of /proc/self/cgroup to a directory, given
// the mount of its hierarchy (whose root may be a sub-group, in containers).
func groupDir(m mountEntry, path string) (string, bool) {
	root := strings.TrimSuffix(m.Root, "/")
	if root != "" && path != root && !strings.HasPrefix(path, root+"/") {
		return "", false
	}
	return filepath.Join(m.MountPoint, strings.TrimPrefix(path, root)), true
}

// detectCgroups finds the server's own groups for memory, cpu and pids:
// cgroup v2 when a unified hierarchy offers all three, else cgroup v1.
// readFile is os.ReadFile except in tests.
func detectCgroups(mounts []mountEntry, self []procCgroup, readFile func(string) ([]byte, error)) (cgroupLayout, error) {
	want := []string{"memory", "cpu", "pids"}
	for _, m := range mounts {
		if m.FSType != "cgroup2" {
			continue
		}
		data, err := readFile(filepath.Join(m.MountPoint, "cgroup.controllers"))
		if err != nil {
			continue
		}
		have := strings.Fields(string(data))
		if !hasOption(have, "memory") || !hasOption(have, "cpu") || !hasOption(have, "pids") {
			continue // a hybrid host's nearly empty unified hierarchy
		}
		for _, pc := range self {
			if len(pc.Controllers) != 0 {
				continue
			}
			dir, ok := groupDir(m, pc.Path)
			if !ok {
				continue
			}
			if filepath.Base(dir) == serverLeaf {
				dir = filepath.Dir(dir)
			}
			return cgroupLayout{Version: 2, Memory: dir, CPU: dir, Pids: dir, Freezer: dir}, nil
		}
	}

	dirs := map[string]string{}
	var missing []string
	for _, c := range want {
		for _, m := range mounts {
			if m.FSType != "cgroup" || !hasOption(m.SuperOptions, c) {
				continue
			}
			for _, pc := range self {
				if !hasOption(pc.Controllers, c) {
					continue
				}
				if dir, ok := groupDir(m, pc.Path); ok {
					dirs[c] = dir
				}
			}
		}
		if dirs[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return cgroupLayout{}, fmt.Errorf("no usable cgroup controllers: %s not found in cgroup v2 (with all of memory, cpu, pids) nor in a cgroup v1 hierarchy", strings.Join(missing, ", "))
	}
	l := cgroupLayout{Version: 1, Memory: dirs["memory"], CPU: dirs["cpu"], Pids: dirs["pids"]}
	// The freezer is optional: without it sandboxes are not paused.
	for _, m := range mounts {
		if m.FSType != "cgroup" || !hasOption(m.SuperOptions, "freezer") {
			continue
		}
		for _, pc := range self {
			if hasOption(pc.Controllers, "freezer") {
				if dir, ok := groupDir(m, pc.Path); ok {
					l.Freezer = dir
				}
			}
		}
	}
	return l, nil
}

// hostCgroups detects the layout from this process's view of the system
// and prepares the parents of sandbox groups.
func hostCgroups() (cgroupLayout, error) {
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	mounts, err := parseMountinfo(mi)
	mi.Close()
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	own, err := detectCgroups(mounts, parseProcCgroup(string(self)), os.ReadFile)
	if err != nil {
		return cgroupLayout{}, err
	}
	if own.Version == 2 {
		return prepareV2(own.Memory)
	}
	l := cgroupLayout{Version: 1}
	for _, p := range []struct {
		own string
		dst *string
	}{{own.Memory, &l.Memory}, {own.CPU, &l.CPU}, {own.Pids, &l.Pids}} {
		*p.dst = filepath.Join(p.own, "delegate")
		if err := os.MkdirAll(*p.dst, 0o755); err != nil {
			return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
		}
	}
	if own.Freezer != "" {
		l.Freezer = filepath.Join(own.Freezer, "delegate")
		if err := os.MkdirAll(l.Freezer, 0o755); err != nil {
			l.Freezer = "" // not fatal: sandboxes are not paused
		}
	}
	return l, nil
}

// prepareV2 makes own/delegate a group whose children get memory, cpu and
// pids. Enabling controllers for children of own is refused (EBUSY) while
// own holds processes, so the server then moves itself into a leaf.
func prepareV2(own string) (cgroupLayout, error) {
	enable := func(dir string) error {
		return writeCgroupFile(dir, "cgroup.subtree_control", "+memory +cpu +pids")
	}
	if err := enable(own); err != nil {
		if !errors.Is(err, syscall.EBUSY) {
			return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
		}
		leaf := filepath.Join(own, serverLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
		}
		if err := writeCgroupFile(leaf, "cgroup.procs", "0"); err != nil {
			return cgroupLayout{}, fmt.Errorf("cgroups: move the server out of %s: %w", own, err)
		}
		if err := enable(own); err != nil {
			return cgroupLayout{}, fmt.Errorf("cgroups: %s holds other processes; run delegate in a cgroup of its own (systemd: Delegate=yes): %w", own, err)
		}
	}
	parent := filepath.Join(own, "delegate")
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	if err := enable(parent); err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	return cgroupLayout{Version: 2, Memory: parent, CPU: parent, Pids: parent, Freezer: parent}, nil
}

// limits are what a sandbox's groups enforce.
type limits struct {
	MemoryBytes int64
	CPU         float64 // cores; 0 means no cpu quota
	PidsMax     int
}

// cfsPeriod is the cpu bandwidth period in microseconds; the quota is
// cores times this.
const cfsPeriod = 100000

func cpuQuota(cores float64) int64 {
	q := int64(math.Round(cores * cfsPeriod))
	return max(q, 1000) // the kernel's minimum quota is 1ms
}

// names returns the sandbox's groups under the layout, not yet created.
func (l cgroupLayout) names(id string) cgroupSet {
	c := cgroupSet{
		Version: l.Version,
		Memory:  filepath.Join(l.Memory, id),
		CPU:     filepath.Join(l.CPU, id),
		Pids:    filepath.Join(l.Pids, id),
	}
	if l.Freezer != "" {
		c.Freezer = filepath.Join(l.Freezer, id)
	}
	return c
}

// create makes the groups and writes the limits. On error the caller
// removes what exists (remove copes with a partial set).
func (c cgroupSet) create(lim limits) error {
	for _, d := range c.dirs() {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	if c.Version == 1 && c.Freezer != "" {
		if err := os.Mkdir(c.Freezer, 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	type setting struct {
		dir, file, value string
		optional         bool // absent when the kernel lacks swap accounting
	}
	var s []setting
	mem := strconv.FormatInt(lim.MemoryBytes, 10)
	pids := strconv.Itoa(lim.PidsMax)
	if c.Version == 2 {
		s = append(s,
			setting{c.Memory, "memory.max", mem, false},
			setting{c.Memory, "memory.swap.max", "0", true},
			setting{c.Pids, "pids.max", pids, false})
		if lim.CPU > 0 {
			s = append(s, setting{c.CPU, "cpu.max", fmt.Sprintf("%d %d", cpuQuota(lim.CPU), cfsPeriod), false})
		}
	} else {
		// memsw after memory: the kernel requires memsw >= memory, and
		// setting it stops swap from bypassing the limit.
		s = append(s,
			setting{c.Memory, "memory.limit_in_bytes", mem, false},
			setting{c.Memory, "memory.memsw.limit_in_bytes", mem, true},
			setting{c.Pids, "pids.max", pids, false})
		if lim.CPU > 0 {
			s = append(s,
				setting{c.CPU, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod), false},
				setting{c.CPU, "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(lim.CPU), 10), false})
		}
	}
	for _, x := range s {
		err := writeCgroupFile(x.dir, x.file, x.value)
		if err != nil && !(x.optional && errors.Is(err, os.ErrNotExist)) {
			return err
		}
	}
	return nil
}

func writeCgroupFile(dir, name, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// addProc moves pid into every group of the set.
func (c cgroupSet) addProc(pid int) error {
	for _, d := range c.dirs() {
		if err := writeCgroupFile(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// procs lists the pids in any of the groups or the groups below them (a
// kept sandbox's commands' groups); groups that no longer exist are
// empty.
func (c cgroupSet) procs() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, d := range c.dirs() {
		pids, err := cgroupTreeProcs(d)
		for _, pid := range pids {
			if !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// cgroupTreeProcs lists the processes of the group at dir and of every
// group below it (cgroup.procs lists a group's own only, in v1 and v2).
func cgroupTreeProcs(dir string) ([]int, error) {
	out, err := cgroupProcs(dir)
	if err != nil {
		return out, err
	}
	for _, sub := range subgroups(dir) {
		pids, err := cgroupTreeProcs(sub)
		out = append(out, pids...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// subgroups lists the groups directly below dir (none if it is gone).
func subgroups(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// groupsBelow lists every group below dir, each after the groups below it.
func groupsBelow(dir string) []string {
	var out []string
	for _, sub := range subgroups(dir) {
		out = append(append(out, groupsBelow(sub)...), sub)
	}
	return out
}

// commandGroup is the group of one command of a kept sandbox, below the
// sandbox's (in v1, in the pids hierarchy only: the limits stay the
// sandbox's, and one hierarchy is all it takes to find and kill the
// command's processes). No controller is enabled below the sandbox's
// group (cgroup v2 allows processes, init's, beside child groups then):
// what the command uses counts against the sandbox's limits.
func (c cgroupSet) commandGroup(execID string) string {
	return filepath.Join(c.Pids, execID)
}

// killGroup SIGKILLs every process in the group at dir and below it, until
// none is left or timeout: v2 has cgroup.kill (atomic, forks included);
// v1 (or a kernel before 5.14) is killed round after round, each round
// catching what forked meanwhile. It returns the processes still there.
func killGroup(dir string, version int, timeout time.Duration) []int {
	if version == 2 {
		writeCgroupFile(dir, "cgroup.kill", "1")
	}
	var pids []int
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Millisecond) {
		pids, _ = cgroupTreeProcs(dir)
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// oomKills returns how many processes the kernel OOM-killed in the
// memory group (v1 memory.oom_control, v2 memory.events).
func (c cgroupSet) oomKills() (int, error) {
	file := "memory.oom_control"
	if c.Version == 2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(c.Memory, file))
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k == "oom_kill" {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, sc.Err()
}

// kill SIGKILLs every process in the groups (v2: cgroup.kill, atomic).
func (c cgroupSet) kill() error {
	if c.Version == 2 {
		err := writeCgroupFile(c.Memory, "cgroup.kill", "1")
		if err == nil || (errors.Is(err, os.ErrNotExist) && !dirExists(c.Memory)) {
			return nil
		}
		// Kernels before 5.14 have no cgroup.kill: fall through.
	}
	pids, err := c.procs()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return err
}

// waitEmpty kills and waits until no process is left, up to timeout.
func (c cgroupSet) waitEmpty(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := c.procs()
		if err == nil && len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: processes %v still alive after %v", pids, timeout)
		}
		c.kill()
		time.Sleep(10 * time.Millisecond)
	}
}

// remove deletes the groups. The kernel refuses (EBUSY) while dying
// processes are still being drained, so it retries for a while.
func (c cgroupSet) remove(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var errs []error
	dirs := c.dirs()
	if c.Version == 1 && c.Freezer != "" {
		// Thawed first: a frozen group's tasks never exit, so it would
		// never be empty.
		writeCgroupFile(c.Freezer, "freezer.state", "THAWED")
		dirs = append(dirs, c.Freezer)
	}
	// The groups below first, deepest first (a kept sandbox's commands'):
	// a group with groups in it cannot be removed.
	var below []string
	for _, d := range dirs {
		below = append(below, groupsBelow(d)...)
	}
	dirs = append(below, dirs...)
	for _, d := range dirs {
		for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
				break
			}
			time.Sleep(delay)
		}
	}
	return errors.Join(errs...)
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// freeze stops every process of the sandbox where it is (their memory
// stays): cgroup v2 freezes the group itself; v1 freezes the sandbox's
// freezer group and moves every process of its pids group into it (a
// task that joins a frozen group is frozen), again until none is left
// out (one may fork while it is moved).
func (c cgroupSet) freeze(timeout time.Duration) error {
	if c.Freezer == "" {
		return errors.New("cgroup: this host has no freezer (cgroup v2, or v1's freezer hierarchy)")
	}
	if c.Version == 2 {
		if err := writeCgroupFile(c.Freezer, "cgroup.freeze", "1"); err != nil {
			return err
		}
		return waitCgroupValue(c.Freezer, "cgroup.events", "frozen 1", timeout)
	}
	if err := writeCgroupFile(c.Freezer, "freezer.state", "FROZEN"); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		pids, err := cgroupTreeProcs(c.Pids) // a kept sandbox's commands' groups too
		if err != nil {
			return err
		}
		frozen, err := cgroupProcs(c.Freezer)
		if err != nil {
			return err
		}
		in := map[int]bool{}
		for _, p := range frozen {
			in[p] = true
		}
		moved := 0
		for _, p := range pids {
			if !in[p] {
				// A process that exited meanwhile cannot be moved: no matter.
				if writeCgroupFile(c.Freezer, "cgroup.procs", strconv.Itoa(p)) == nil {
					moved++
				}
			}
		}
		if moved == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: processes of %s kept appearing while it was frozen", c.Pids)
		}
	}
	// The kernel tries to freeze each process once, when FROZEN is written
	// or when the process arrives: one that was running just then and has
	// gone to sleep since in the kernel, where it freezes only if asked
	// again (a shell's vfork waiting for its child, which is frozen
	// already), keeps the group FREEZING. Each write asks again.
	for {
		err := waitCgroupValue(c.Freezer, "freezer.state", "FROZEN", 20*time.Millisecond)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		if err := writeCgroupFile(c.Freezer, "freezer.state", "FROZEN"); err != nil {
			return err
		}
	}
}

// thaw lets a frozen sandbox's processes go on.
func (c cgroupSet) thaw() error {
	switch {
	case c.Freezer == "":
		return nil
	case c.Version == 2:
		return writeCgroupFile(c.Freezer, "cgroup.freeze", "0")
	}
	return writeCgroupFile(c.Freezer, "freezer.state", "THAWED")
}

// cgroupProcs lists the processes of one group (none if it is gone).
func cgroupProcs(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
		// Gone, or being removed (a kept sandbox's command's group, which
		// its shim removes once empty, between the listing and the read).
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// waitCgroupValue waits until the file in dir holds want (a whole line,
// or the whole content).
func waitCgroupValue(dir, file, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if strings.TrimSpace(line) == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: %s/%s is %q, not %q after %s", dir, file, strings.TrimSpace(string(data)), want, timeout)
		}
		time.Sleep(delay)
	}
}

// frozen reports whether the sandbox is frozen (paused).
func (c cgroupSet) frozen() bool {
	if c.Freezer == "" {
		return false
	}
	file, want := "freezer.state", "FROZEN"
	if c.Version == 2 {
		file, want = "cgroup.freeze", "1"
	}
	data, err := os.ReadFile(filepath.Join(c.Freezer, file))
	return err == nil && strings.TrimSpace(string(data)) == want
}

// waitGone waits a while for a process to leave the sandbox's groups.
func (c cgroupSet) waitGone(pid int, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		pids, _ := c.procs()
		if !slices.Contains(pids, pid) {
			return
		}
	}
}
