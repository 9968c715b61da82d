//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// userLimits are the sandbox user namespace's /proc/sys/user budgets:
// what one sandbox may hold of kernel objects that are charged per user
// and cost kernel memory. The host's own defaults for one user, with
// watches and marks capped (the host's scale with its memory).
var userLimits = [...]struct {
	name string
	max  int
}{
	{"max_inotify_instances", 128},
	{"max_inotify_watches", 65536},
	{"max_fanotify_groups", 16},
	{"max_fanotify_marks", 65536},
}

// devNodes are the host devices bound into the sandbox's /dev.
var devNodes = [...]string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are the usual symbolic links of /dev.
var devLinks = [...]struct{ name, target string }{
	{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
}

// planner makes the plans of this backend's sandboxes from what New
// fixed: the jobs' file limit, the operator's tool directories and the
// seccomp filter.
type planner struct {
	noFile   int
	toolDirs []string
	seccomp  []byte
	// spareIdle is how long a kept sandbox's spare waits for a command
	// (plan.SpareIdle): spareIdle unless a test says otherwise.
	spareIdle time.Duration
}

// spareIdle is how long a kept sandbox's spare (the next command's
// process, forked ahead) waits for a command before it ends: as long as
// a command's idle shim waits for the next (SHIM_IDLE_MS). A kept
// sandbox that ran a command and then none for that long holds its
// keeper, its init and what its commands left, as bubblewrap would
// (issue 41, item 5); a command after that is forked as it comes.
const spareIdle = 30 * time.Second

// buildPlan is the plan of the command rec (with its environment env) in
// the sandbox of one command whose directory is dir and whose state is
// st. With netns, the shim will join a ready network namespace (its
// loopback up).
func (pl *planner) buildPlan(dir string, st sandboxState, rec execRecord, cmd sandbox.Command, netns bool) (*plan, error) {
	if st.NoFile == 0 {
		st.NoFile = pl.noFile // a sandbox made before it was recorded
	}
	ops, err := rootOps(dir, st, !netns, cmd.Inputs, pl.toolDirs)
	if err != nil {
		return nil, err
	}
	p := pl.commandPlan(dir, st, rec, cmd)
	p.Mode, p.Ops, p.HostIDBase, p.IDRange, p.Netns = modeSandbox, ops, st.hostBase(), slotSize, netns
	if st.Network != nil {
		p.Net = *st.Network
	}
	return p, nil
}

// commandPlan is what every plan of a command has: the command, its
// environment, its limits.
func (pl *planner) commandPlan(dir string, st sandboxState, rec execRecord, cmd sandbox.Command) *plan {
	// $DELEGATE_INPUTS last, over whatever Env says: the job finds its
	// inputs where they are.
	env := slices.DeleteFunc(slices.Clone(cmd.Env), func(e string) bool { return strings.HasPrefix(e, InputsEnv+"=") })
	// The standard PATH finds the tools this root has (tools_linux.go).
	if st.Template != "" {
		env = standardPath(env, filepath.Join(dir, dirTemplate), nil)
	} else {
		env = standardPath(env, "/", pl.toolDirs)
	}
	if len(cmd.Inputs) > 0 {
		env = append(env, InputsEnv+"="+InputsDir)
	}
	p := &plan{
		OutputLimit:   rec.OutputLimit,
		MaxEvents:     maxEventsBytes,
		MaxStatusLine: maxStatusLine,
		LatestEvery:   int64(latestEvery),
		FloodPause:    int64(floodPause),
		Cgroup:        st.Cgroup,
		JobID:         jobID,
		Args:          rec.Args,
		Env:           env,
		Dir:           rec.Dir,
		Seccomp:       pl.seccomp,
	}
	if cmd.Stdin != "" {
		p.Stdin = path.Join(InputsDir, cmd.Stdin)
	}
	if !rec.Deadline.IsZero() {
		p.Deadline = rec.Deadline.UnixNano()
	}
	return p
}

// keeperPlan is the plan of a kept sandbox's supervisor and init: the
// sandbox's root, made once, and its lifetime. It has no command: the
// commands come later, each with a plan of its own (execPlan).
func (pl *planner) keeperPlan(dir string, st sandboxState) (*plan, error) {
	if st.NoFile == 0 {
		st.NoFile = pl.noFile
	}
	// The network namespace bound at fileNetns has its loopback up.
	ops, err := rootOps(dir, st, false, nil, pl.toolDirs)
	if err != nil {
		return nil, err
	}
	p := &plan{
		Mode:          modeKeeper,
		MaxEvents:     maxEventsBytes,
		MaxStatusLine: maxStatusLine,
		Cgroup:        st.Cgroup,
		HostIDBase:    st.hostBase(),
		IDRange:       slotSize,
		JobID:         jobID,
		Ops:           ops,
		Netns:         true,
		SpareOps:      commandAheadOps(st),
		SpareIdle:     uint32(pl.spareIdle.Milliseconds()),
	}
	if !st.Expires.IsZero() {
		p.Until = st.Expires.UnixNano()
	}
	return p, nil
}

// execPlan is the plan of one command of a kept sandbox. Its steps are
// the ones the sandbox's init takes in the command's process between its
// fork and its exec, in the sandbox's root: a mount namespace of the
// command's own (a copy of init's) with a /run of its own, and the
// capability bounding set emptied (commandAheadOps: Ahead of them), then
// its status channel and its inputs in that /run, made read-only, and
// the seccomp filter.
func (pl *planner) execPlan(dir string, st sandboxState, rec execRecord, cmd sandbox.Command) *plan {
	p := pl.commandPlan(dir, st, rec, cmd)
	p.Mode, p.ExecID = modeCommand, rec.ID
	p.Channel = filepath.Join(execUp, dirChannel, rec.ID)
	ahead := commandAheadOps(st)
	ops := opList(slices.Clip(ahead))
	add := ops.add
	add(opBindKept, 0, "status channel", StatusFile, rec.ID)
	inputOps(add, InputsDir, cmd.Inputs)
	add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "make /run read-only", "", path.Dir(path.Dir(StatusFile)), "", "")
	add(opSeccomp, 0, "seccomp")
	p.Ahead = uint32(len(ahead))
	p.Ops = ops
	return p
}

// commandAheadOps are the first steps of every command of a kept sandbox
// (execPlan), which do not depend on the command: a mount namespace of
// its own, a /run of its own that covers init's (whose channels
// directory is kept open, for the command's channel; and the trust
// bundle, bound in again read-only), and the capability bounding set
// emptied (which leaves the capabilities the next steps use). A spare
// takes them before its command comes (SpareOps), off the command's
// way: 0.1 ms of its start.
func commandAheadOps(st sandboxState) []op {
	var ops opList
	add := ops.add
	run := path.Dir(path.Dir(StatusFile))
	trust := st.Proxy != nil && st.Proxy.Trust
	add(opUnshare, unix.CLONE_NEWNS, "mount namespace")
	// The channels, in init's /run/channels, stay reachable while a /run
	// of the command's own covers them, and so does the trust bundle of
	// a sandbox with one.
	add(opKeepPath, 0, "status channel", path.Join(run, keptChannels))
	if trust {
		add(opKeepPath, 1, "trust bundle", TrustFile)
	}
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mount /run", "tmpfs", run, "tmpfs", "mode=0755,size=16k,nr_inodes=16")
	add(opMkdir, 0o755, "status channel", path.Dir(StatusFile))
	add(opTouch, 0, "status channel", StatusFile)
	if trust {
		add(opMkdir, 0o755, "trust bundle", path.Dir(TrustFile))
		add(opTouch, 0, "trust bundle", TrustFile)
		add(opBindKept, 1, "trust bundle", TrustFile)
		add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "trust bundle: read-only", "", TrustFile, "", "")
	}
	add(opDropBounding, 0, "drop the capability bounding set")
	return ops
}

// opList collects steps: its add is how rootOps, commandAheadOps,
// execPlan and inputOps write them.
type opList []op

func (l *opList) add(code opCode, n uint64, label string, s ...string) {
	o := op{code: code, n: n, label: label}
	copy(o.s[:], s)
	*l = append(*l, o)
}

// keptChannels is where, under /run, a kept sandbox's init has its
// commands' status channels (the sandbox directory's dirChannel).
const keptChannels = "channels"

// keptSlots is how many paths opKeepPath keeps at once (its n).
const keptSlots = 2

// rootOps are init's steps: the job's root filesystem under dirRootfs,
// built from the host's hostViewDirs or from the template, with the
// command's inputs, made the root, then the restrictions that also bind
// init itself (and loopback up in a network namespace init makes).
// Entries of the host or the template are looked at now, by the server,
// which sees what init will see before its pivot. The ops' paths are
// relative to the sandbox directory dir, the shim's working directory.
//
// A kept sandbox's init (st.Init) gets the same root without a command's
// parts: its commands' status channels are at /run/channels, and each
// command takes its inputs and the seccomp filter on its own (execPlan).
func rootOps(dir string, st sandboxState, loopback bool, inputs map[string][]byte, toolDirs []string) ([]op, error) {
	var ops opList
	add := ops.add
	root := dirRootfs
	at := func(p ...string) string { return filepath.Join(append([]string{root}, p...)...) }

	// A cgroup namespace rooted at the sandbox's own group (init has been
	// placed there) hides the host's cgroup paths.
	add(opUnshareCgroup, 0, "cgroup namespace")
	// Nothing we mount may propagate back to the host.
	add(opMount, unix.MS_REC|unix.MS_PRIVATE, "make mounts private", "", "/", "", "")
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV, "mount root tmpfs", "tmpfs", root, "tmpfs", "mode=0755,size=1m,nr_inodes=4096")

	// Symbolic links as the same links (Debian's /bin → usr/bin),
	// directories and files as read-only binds.
	srcDir, names := "/", hostViewDirs[:]
	if st.Template != "" {
		srcDir, names = dirTemplate, nil
		ents, err := os.ReadDir(filepath.Join(dir, dirTemplate))
		if err != nil {
			return nil, fmt.Errorf("read template: %w", err)
		}
		for _, e := range ents {
			if !slices.Contains(templateSkip[:], e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	have := map[string]bool{}
	for _, name := range names {
		src := filepath.Join(srcDir, name) // as init sees it, before its pivot
		here := src                        // as the server sees it
		if srcDir != "/" {
			here = filepath.Join(dir, src)
		}
		fi, err := os.Lstat(here)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("populate root: %w", err)
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(here)
			if err != nil {
				return nil, fmt.Errorf("populate root: %w", err)
			}
			add(opSymlink, 0, "populate root: link /"+name, target, at(name))
		case fi.IsDir():
			add(opMkdir, 0o755, "populate root: create /"+name, at(name))
			add(opMount, unix.MS_BIND|unix.MS_REC, "populate root: bind "+src, src, at(name))
			add(opReadOnly, 0, "populate root: make /"+name+" read-only", at(name))
		case fi.Mode().IsRegular():
			add(opTouch, 0, "populate root: create /"+name, at(name))
			add(opMount, unix.MS_BIND|unix.MS_REC, "populate root: bind "+src, src, at(name))
			add(opReadOnly, 0, "populate root: make /"+name+" read-only", at(name))
		default:
			continue // devices, sockets, fifos of a template: not ours to give
		}
		have[name] = true
	}
	if st.Template == "" {
		// The host view: the job's own users, and the operator's tools.
		if have["etc"] {
			accountOps(dir, add, at)
		}
		toolDirOps(toolDirs, add, at)
	}
	if st.Network != nil {
		add(opResolvConf, 0, "network", root, netResolvConf)
	} else if st.Proxy != nil {
		add(opResolvConf, 0, "network", root, proxyResolvConf)
	}
	// Empty /root and /home (read-only, like the rest of the root): programs
	// expect them, and they show that nothing of the host's is there. The
	// others are mount points. (Mount points' own modes do not show.)
	for _, name := range []string{"root", "home", "workspace", "tmp", "proc", "dev"} {
		if !have[name] {
			add(opMkdir, 0o755, "create /"+name, at(name))
		}
	}
	add(opMount, unix.MS_BIND|unix.MS_REC, "bind /workspace", dirWorkspace, at("workspace"))
	if st.Var {
		// Over a template's /var, if it has one (bound read-only above).
		if !have["var"] {
			add(opMkdir, 0o755, "create /var", at("var"))
		}
		add(opMount, unix.MS_BIND, "bind /var", dirVar, at("var"))
	}
	if len(st.Caches) > 0 && perCommand(st) {
		// A kept sandbox's caches are its commands' (cachecmd_linux.go):
		// mount points the server mounts them on for each command's run,
		// on a read-only tmpfs shared with the commands' mount
		// namespaces, copies of init's, so that those mounts reach them.
		add(opMkdir, 0o755, "create /cache", at("cache"))
		add(opMount, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "caches' mount points", "tmpfs", at("cache"), "tmpfs",
			fmt.Sprintf("mode=0755,size=4k,nr_inodes=%d", len(st.Caches)+4))
		for _, c := range st.Caches {
			add(opMkdir, 0o755, "create /cache/"+c.Name, at("cache", c.Name))
		}
		add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "caches' mount points: read-only", "", at("cache"), "", "")
		add(opMount, unix.MS_SHARED, "caches' mount points: shared with the commands", "", at("cache"), "", "")
	} else if len(st.Caches) > 0 {
		// The caches, bound into the sandbox directory by Create.
		add(opMkdir, 0o755, "create /cache", at("cache"))
		for _, c := range st.Caches {
			add(opMkdir, 0o755, "create /cache/"+c.Name, at("cache", c.Name))
			add(opMount, unix.MS_BIND, "bind /cache/"+c.Name, filepath.Join(dirCaches, c.Name), at("cache", c.Name))
		}
	}
	statusDir := filepath.Dir(StatusFile)
	if st.Init {
		// The commands' status channels: each command binds its own at
		// StatusFile (execPlan).
		add(opMkdir, 0o755, "status channels", at(filepath.Dir(statusDir)))
		add(opMkdir, 0o755, "status channels", at(filepath.Dir(statusDir), keptChannels))
		add(opMount, unix.MS_BIND, "status channels", dirChannel, at(filepath.Dir(statusDir), keptChannels))
	} else if _, err := os.Lstat(filepath.Join(dir, fileStatusFIFO)); err == nil {
		// The status channel at StatusFile, bound before the root is
		// made read-only.
		add(opMkdir, 0o755, "status channel", at(filepath.Dir(statusDir)))
		add(opMkdir, 0o755, "status channel", at(statusDir))
		add(opTouch, 0, "status channel", at(StatusFile))
		add(opMount, unix.MS_BIND, "status channel", fileStatusFIFO, at(StatusFile))
	}
	if st.Proxy != nil && st.Proxy.Trust {
		// The trust bundle (the system roots and the job's CA), bound
		// read-only from the sandbox directory.
		add(opMkdir, 0o755, "trust bundle", at(filepath.Dir(filepath.Dir(TrustFile))))
		add(opMkdir, 0o755, "trust bundle", at(filepath.Dir(TrustFile)))
		add(opTouch, 0, "trust bundle", at(TrustFile))
		add(opMount, unix.MS_BIND, "trust bundle", fileTrust, at(TrustFile))
		add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "trust bundle: read-only", "", at(TrustFile), "", "")
	}
	if len(inputs) > 0 {
		add(opMkdir, 0o755, "inputs", at(filepath.Dir(filepath.Dir(InputsDir))))
		add(opMkdir, 0o755, "inputs", at(filepath.Dir(InputsDir)))
		inputOps(add, at(InputsDir), inputs)
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%d", min(st.DiskBytes, maxTmpBytes))
	if st.TmpBytes > 0 {
		// A VM's /tmp as its Linux has it (Spec.TmpBytes), and its
		// /dev/shm (a tmpfs of half the memory, the kernel's default).
		tmpOpts = fmt.Sprintf("mode=1777,size=%d,nr_inodes=1m", st.TmpBytes)
	}
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV, "mount /tmp", "tmpfs", at("tmp"), "tmpfs", tmpOpts)
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mount /proc", "proc", at("proc"), "proc", "")
	// The sandbox's own budgets of per-user kernel objects, lowered from
	// the unlimited a new user namespace starts with (what the sandbox
	// holds is also charged to its host uid, uids.go).
	for _, l := range userLimits {
		add(opSysctl, 0, "limit "+l.name, at("proc/sys/user", l.name), strconv.Itoa(l.max))
	}

	// A minimal /dev: a few harmless host devices bound in (a device node
	// made on our own tmpfs would not open: user-namespace mounts are
	// nodev), the usual links, and a private /dev/shm.
	add(opMount, unix.MS_NOSUID|unix.MS_NOEXEC, "mount /dev", "tmpfs", at("dev"), "tmpfs", "mode=0755,size=64k,nr_inodes=64")
	for _, n := range devNodes {
		add(opTouch, 0, "create /dev/"+n, at("dev", n))
		add(opMount, unix.MS_BIND, "bind /dev/"+n, "/dev/"+n, at("dev", n))
	}
	for _, l := range devLinks {
		add(opSymlink, 0, "create /dev/"+l.name, l.target, at("dev", l.name))
	}
	add(opMkdir, 0o755, "create /dev/shm", at("dev", "shm"))
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV, "mount /dev/shm", "tmpfs", at("dev", "shm"), "tmpfs", tmpOpts)
	add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "make /dev read-only", "", at("dev"), "", "")
	add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "make root read-only", "", root, "", "")
	add(opPivot, 0, "pivot_root", root)

	add(opHostname, 0, "set hostname", "sandbox")
	// Jobs often talk to themselves over 127.0.0.1 (test servers, language
	// servers); this loopback is the sandbox's own.
	if loopback {
		add(opLoopback, 0, "loopback")
	}
	// No core files in the sandbox. This does not keep a crash from
	// reaching a core_pattern pipe helper ("|/usr/lib/systemd/...",
	// apport) on the host: the kernel ignores RLIMIT_CORE for pipes
	// unless it is 1, and a job may lower its soft limit to 0 again. A
	// host that runs hostile jobs keeps core_pattern a plain file name.
	add(opNoCoreDumps, 0, "set RLIMIT_CORE")
	// The job's share of the host's file table (nofile.go).
	add(opNoFile, uint64(st.NoFile), "set RLIMIT_NOFILE")
	if !st.Init {
		// A kept sandbox's init needs mount and unshare for each command
		// (and the Go helpers' command is executed as root, with every
		// capability of the bounding set): each command drops them
		// itself (execPlan).
		add(opDropBounding, 0, "drop the capability bounding set")
		add(opSeccomp, 0, "seccomp")
	}
	return ops, nil
}

// inputOps are the steps that give a command its inputs at inDir (whose
// parent exists): a tmpfs of its own (in the command's mount namespace),
// owned by the job's user and readable by it alone, written by init and
// then made read-only. Their bytes came in the plan, in memory; they
// never touch the host's disk nor any argument list.
func inputOps(add func(code opCode, n uint64, label string, s ...string), inDir string, inputs map[string][]byte) {
	if len(inputs) == 0 {
		return
	}
	add(opMkdir, 0o755, "inputs", inDir)
	var size int64 = 4096
	for _, data := range inputs {
		size += (int64(len(data)) + 4095) &^ 4095
	}
	opts := fmt.Sprintf("mode=0500,uid=%d,gid=%d,size=%d,nr_inodes=%d", jobID, jobID, size, len(inputs)+2)
	add(opMount, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "inputs: mount", "tmpfs", inDir, "tmpfs", opts)
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		add(opInput, jobID, "inputs: write "+name, filepath.Join(inDir, name), string(inputs[name]))
	}
	add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "inputs: make read-only", "", inDir, "", "")
}

// runOps carries out init's steps (the Go helper's way; plan_linux.c
// has the same for the C one). prog is the plan's seccomp filter.
func runOps(ops []op, prog []byte) error {
	kept := [keptSlots]int{-1, -1} // opKeepPath's descriptors
	defer func() {
		for _, fd := range kept {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	for _, o := range ops {
		if err := runOp(o, prog, &kept); err != nil {
			return fmt.Errorf("%s: %w", o.label, err)
		}
	}
	return nil
}

func runOp(o op, prog []byte, kept *[keptSlots]int) error {
	switch o.code {
	case opUnshare:
		return unix.Unshare(int(o.n))
	case opKeepPath, opBindKept:
		if o.n >= keptSlots {
			return fmt.Errorf("slot %d of %d", o.n, keptSlots)
		}
		slot := &kept[o.n]
		if o.code == opKeepPath {
			if *slot >= 0 {
				unix.Close(*slot)
			}
			fd, err := unix.Open(o.s[0], unix.O_PATH|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			*slot = fd
			return nil
		}
		if *slot < 0 {
			return errors.New("nothing kept to bind")
		}
		from := *slot
		defer func() {
			unix.Close(*slot)
			*slot = -1
		}()
		if o.s[1] != "" {
			fd, err := unix.Openat(*slot, o.s[1], unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			from = fd
		}
		return unix.Mount(fmt.Sprintf("/proc/self/fd/%d", from), o.s[0], "", unix.MS_BIND, "")
	case opMount:
		return unix.Mount(o.s[0], o.s[1], o.s[2], uintptr(o.n), o.s[3])
	case opMkdir:
		if err := unix.Mkdir(o.s[0], uint32(o.n)); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		return nil
	case opTouch:
		return touch(o.s[0])
	case opSymlink:
		return unix.Symlink(o.s[0], o.s[1])
	case opReadOnly:
		return readOnlyRecursive(o.s[0])
	case opPivot:
		return pivot(o.s[0])
	case opUnshareCgroup:
		_ = unix.Unshare(unix.CLONE_NEWCGROUP) // cosmetic: not a reason to fail
		return nil
	case opHostname:
		return unix.Sethostname([]byte(o.s[0]))
	case opLoopback:
		return loopbackUp()
	case opNoCoreDumps:
		return unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	case opNoFile:
		return unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: o.n, Max: o.n})
	case opDropBounding:
		return dropBoundingSet()
	case opSeccomp:
		return installSeccomp(prog)
	case opInput:
		return writeInput(o.s[0], o.s[1], int(o.n))
	case opSysctl:
		f, err := os.OpenFile(o.s[0], os.O_WRONLY, 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil // an older kernel: one budget fewer
		}
		if err != nil {
			return err
		}
		_, err = f.WriteString(o.s[1])
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	case opResolvConf:
		err := bindResolvConf(o.s[0], o.s[1])
		if errors.Is(err, errNoResolvConf) {
			// Not fatal: the job may only need addresses.
			fmt.Fprintf(os.Stderr, "%s%v\n", setupPrefix, err)
			return nil
		}
		return err
	}
	return fmt.Errorf("unknown step %d", o.code)
}

// writeInput creates the input file p, which must not exist yet, with
// data, readable by its owner uid alone.
func writeInput(p, data string, uid int) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	_, err = io.WriteString(f, data)
	if err == nil {
		err = f.Chown(uid, uid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// touch creates the empty file p if it is missing.
func touch(p string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// seccompBytes is the filter as the plan carries it (struct sock_filter
// is 8 bytes, the same in Go and C).
func seccompBytes(prog []unix.SockFilter) []byte {
	if len(prog) == 0 {
		return nil
	}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(prog)*int(unsafe.Sizeof(prog[0])))...)
}

// seccompFilter is the reverse of seccompBytes.
func seccompFilter(b []byte) ([]unix.SockFilter, error) {
	size := int(unsafe.Sizeof(unix.SockFilter{}))
	if len(b) == 0 || len(b)%size != 0 || len(b)/size > 0xffff {
		return nil, fmt.Errorf("seccomp: a filter of %d bytes", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/size)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(b)), b)
	return prog, nil
}

// deadlineTime is the plan's deadline as a time (zero: none).
func (p *plan) deadlineTime() time.Time {
	if p.Deadline == 0 {
		return time.Time{}
	}
	return time.Unix(0, p.Deadline)
}
