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

// buildPlan is the plan of the command rec (with its environment env) in
// the sandbox whose directory is dir and whose state is st, whose shim
// works in execDir (dir itself, or for one command of many its own
// directory). With netns, the shim will join a ready network namespace
// (its loopback up).
func (b *Backend) buildPlan(dir, execDir string, st sandboxState, rec execRecord, cmd sandbox.Command, netns bool) (*plan, error) {
	if st.NoFile == 0 {
		st.NoFile = b.noFile // a sandbox made before it was recorded
	}
	ops, err := rootOps(dir, execDir, st, !netns, cmd.Inputs, b.toolDirs)
	if err != nil {
		return nil, err
	}
	// $DELEGATE_INPUTS last, over whatever Env says: the job finds its
	// inputs where they are.
	env := slices.DeleteFunc(slices.Clone(cmd.Env), func(e string) bool { return strings.HasPrefix(e, InputsEnv+"=") })
	// The standard PATH finds the tools this root has (tools_linux.go).
	if st.Template != "" {
		env = standardPath(env, filepath.Join(dir, dirTemplate), nil)
	} else {
		env = standardPath(env, "/", b.toolDirs)
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
		HostIDBase:    st.hostBase(),
		IDRange:       slotSize,
		JobID:         jobID,
		Args:          rec.Args,
		Env:           env,
		Dir:           rec.Dir,
		Seccomp:       b.seccomp,
		Ops:           ops,
		Netns:         netns,
		Linger:        st.Multi,
	}
	if st.Multi && !st.Expires.IsZero() {
		p.LingerUntil = st.Expires.UnixNano()
	}
	if cmd.Stdin != "" {
		p.Stdin = path.Join(InputsDir, cmd.Stdin)
	}
	if !rec.Deadline.IsZero() {
		p.Deadline = rec.Deadline.UnixNano()
	}
	if st.Network != nil {
		p.Net = *st.Network
	}
	return p, nil
}

// rootOps are init's steps: the job's root filesystem under dirRootfs,
// built from the host's hostViewDirs or from the template, with the
// command's inputs, made the root, then the restrictions that also bind
// init itself (and loopback up in a network namespace init makes).
// Entries of the host or the template are looked at now, by the server,
// which sees what init will see before its pivot.
//
// The ops' paths are relative to the shim's working directory, execDir:
// the sandbox directory's entries are reached through up (execUp from a
// command's own directory).
func rootOps(dir, execDir string, st sandboxState, loopback bool, inputs map[string][]byte, toolDirs []string) ([]op, error) {
	up := ""
	if execDir != dir {
		up = execUp
	}
	var ops []op
	add := func(code opCode, n uint64, label string, s ...string) {
		o := op{code: code, n: n, label: label}
		copy(o.s[:], s)
		ops = append(ops, o)
	}
	root := filepath.Join(up, dirRootfs)
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
		srcDir, names = filepath.Join(up, dirTemplate), nil
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
			here = filepath.Join(execDir, src)
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
			accountOps(execDir, add, at)
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
	add(opMount, unix.MS_BIND|unix.MS_REC, "bind /workspace", filepath.Join(up, dirWorkspace), at("workspace"))
	if len(st.Caches) > 0 {
		// The caches, bound into the sandbox directory by Create.
		add(opMkdir, 0o755, "create /cache", at("cache"))
		for _, c := range st.Caches {
			add(opMkdir, 0o755, "create /cache/"+c.Name, at("cache", c.Name))
			add(opMount, unix.MS_BIND, "bind /cache/"+c.Name, filepath.Join(up, dirCaches, c.Name), at("cache", c.Name))
		}
	}
	if _, err := os.Lstat(filepath.Join(execDir, fileStatusFIFO)); err == nil {
		// The status channel at StatusFile, bound before the root is
		// made read-only.
		statusDir := filepath.Dir(StatusFile)
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
		add(opMount, unix.MS_BIND, "trust bundle", filepath.Join(up, fileTrust), at(TrustFile))
		add(opMount, unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "trust bundle: read-only", "", at(TrustFile), "", "")
	}
	if len(inputs) > 0 {
		// The command's inputs: a tmpfs of its own (this mount namespace
		// is the command's), owned by the job's user and readable by it
		// alone, written by init and then made read-only. Their bytes
		// came in the plan, in memory; they never touch the host's disk
		// nor any argument list.
		inDir := at(InputsDir)
		add(opMkdir, 0o755, "inputs", at(filepath.Dir(filepath.Dir(InputsDir))))
		add(opMkdir, 0o755, "inputs", at(filepath.Dir(InputsDir)))
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
	tmpOpts := fmt.Sprintf("mode=1777,size=%d", min(st.DiskBytes, maxTmpBytes))
	if st.Multi {
		// The sandbox's /tmp, which its commands share.
		add(opMount, unix.MS_BIND, "bind /tmp", filepath.Join(up, dirTmp), at("tmp"))
	} else {
		add(opMount, unix.MS_NOSUID|unix.MS_NODEV, "mount /tmp", "tmpfs", at("tmp"), "tmpfs", tmpOpts)
	}
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
	add(opDropBounding, 0, "drop the capability bounding set")
	add(opSeccomp, 0, "seccomp")
	return ops, nil
}

// runOps carries out init's steps (the Go helper's way; helper_linux.c
// has the same for the C one). prog is the plan's seccomp filter.
func runOps(ops []op, prog []byte) error {
	for _, o := range ops {
		if err := runOp(o, prog); err != nil {
			return fmt.Errorf("%s: %w", o.label, err)
		}
	}
	return nil
}

func runOp(o op, prog []byte) error {
	switch o.code {
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
