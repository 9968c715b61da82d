//go:build linux

package local

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Network egress (Spec.Network). The sandbox keeps its own network
// namespace; a user-mode network helper on the host, pasta (Debian package
// passt) or slirp4netns, serves a tap device in it and turns the job's
// connections into ordinary sockets of its own. Nothing is routed or
// NATed by the host's kernel and no interface is added to the host. What
// the helper would give the job of the host's loopback (127.0.0.1 on the
// host, where local-only services listen) is switched off by the options
// in netHelperArgs.

const (
	netToolPasta = "pasta"
	netToolSlirp = "slirp4netns"
)

// errNoNetTool is Create's answer on a host that has neither helper.
var errNoNetTool = errors.New("network egress needs a user-mode network helper, and neither is on this server's PATH: " +
	"install pasta (apt-get install passt) or slirp4netns (apt-get install slirp4netns) where delegate runs; no restart needed")

// The sandbox's side of the network is the same whichever helper serves
// it: slirp4netns's fixed layout, which pasta is told to copy, so that a
// job (and its resolv.conf) does not depend on which one the host has.
const (
	netIfname  = "tap0"
	netCIDR    = "10.0.2.0/24"
	netAddr    = "10.0.2.100"
	netPrefix  = "24"
	netGateway = "10.0.2.2" // the helpers' default route; by default also the host's loopback
	netDNS     = "10.0.2.3" // forwarded by the helper to the host's resolver
	netMTU     = "65520"
	// netResolvConf is bound over the sandbox's /etc/resolv.conf.
	netResolvConf = "# delegate sandbox: DNS through the user-mode network helper\nnameserver " + netDNS + "\n"
	// netReadyTimeout bounds the helper's set-up, normally milliseconds.
	netReadyTimeout = 10 * time.Second
)

// findNetTool picks the helper: force when set (tests run both), else
// pasta, else slirp4netns. It looks at each call, so installing a helper
// needs no server restart.
func findNetTool(force string, lookPath func(string) (string, error)) (netTool, error) {
	names := []string{netToolPasta, netToolSlirp}
	if force != "" {
		if force != netToolPasta && force != netToolSlirp {
			return netTool{}, fmt.Errorf("unknown network helper %q (want %s or %s)", force, netToolPasta, netToolSlirp)
		}
		names = []string{force}
	}
	for _, name := range names {
		p, err := lookPath(name)
		if err != nil {
			continue
		}
		if p, err = filepath.Abs(p); err != nil {
			continue
		}
		return netTool{Name: name, Path: p}, nil
	}
	if force != "" {
		pkg := force
		if force == netToolPasta {
			pkg = "passt"
		}
		return netTool{}, fmt.Errorf("network egress: %s is not on this server's PATH (apt-get install %s)", force, pkg)
	}
	return netTool{}, errNoNetTool
}

// netLookFor is how long Capabilities trusts its last look for a network
// helper. The engine asks for the capabilities several times per job, and
// a look stats two names in every PATH directory (~40 µs each time, when
// neither is installed); a helper installed is seen within this time,
// and Create, which starts one, always looks anew.
const netLookFor = 2 * time.Second

// networks gives sandboxes their network: the helper of those with
// network (pasta or slirp4netns, looked for on the server's PATH), and
// namespaces readied ahead for the others (netnsPool).
type networks struct {
	// force names the helper to use instead of the preferred one found
	// (tests run both); lookPath finds the helpers.
	force    string
	lookPath func(string) (string, error)
	// seen is the last look for a helper that Capabilities made.
	seen netLook
	pool *netnsPool
}

// tool is the helper a new sandbox with network gets (looked for anew).
func (n *networks) tool() (netTool, error) { return findNetTool(n.force, n.lookPath) }

// missing says why no helper can be had, nil when one can, from a
// recent look.
func (n *networks) missing() error { return n.seen.find(n.force, n.lookPath) }

// close stops readying namespaces (Backend.Close).
func (n *networks) close() error { return n.pool.close() }

// netLook is the last look for a network helper: whether one was found.
type netLook struct {
	mu    sync.Mutex
	at    time.Time
	force string
	err   error
}

// find returns findNetTool's error, from the last look if it is recent
// and was for the same helper.
func (l *netLook) find(force string, lookPath func(string) (string, error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); l.at.IsZero() || l.force != force || now.Sub(l.at) >= netLookFor {
		_, l.err = findNetTool(force, lookPath)
		l.at, l.force = now, force
	}
	return l.err
}

// netHelperArgs is the helper's command line for the sandbox whose pid 1
// is initPID on the host. pasta finds the sandbox's user namespace open
// on its descriptor 3, and on 4 the file where it reports that it is
// ready. The line names no path of the host's: the job sees the helper,
// which runs in its pid namespace (startNetHelper).
func netHelperArgs(tool netTool, initPID int) []string {
	target := strconv.Itoa(initPID)
	if tool.Name == netToolPasta {
		return []string{tool.Path,
			"--foreground", "--quiet",
			// pasta enters the sandbox's user namespace, which root may:
			// "nobody", pasta's default when started as root, could not.
			// Once inside it holds no privilege over the host, and it
			// confines itself (empty filesystem, seccomp).
			"--runas", "0",
			// The user namespace, opened by the shim: pasta, which drops
			// CAP_SYS_PTRACE first, could not open /proc/<init>/ns/user
			// of a sandbox whose user namespace is not root's (uids.go).
			"--userns", "/proc/self/fd/3",
			"--ipv4-only",
			"--config-net", "--ns-ifname", netIfname, "--address", netAddr, "--netmask", netPrefix,
			"--gateway", netGateway, "--mtu", netMTU, "--no-dhcp",
			// By default pasta hands the job the host's loopback twice: the
			// gateway address is translated to the host's 127.0.0.1
			// (--no-map-gw stops that), and every port the host listens on
			// is mirrored on the sandbox's own 127.0.0.1 and forwarded to
			// the host's (--tcp-ns and --udp-ns none stop that).
			"--no-map-gw", "--tcp-ns", "none", "--udp-ns", "none",
			// Nor is anything of the sandbox published on the host's
			// addresses: by default every port the job listens on would be.
			"--tcp-ports", "none", "--udp-ports", "none",
			"--dns-forward", netDNS,
			// Written once the namespace is configured: the ready signal.
			"--pid", "/proc/self/fd/4",
			target}
	}
	return []string{tool.Path,
		"--configure", "--mtu=" + netMTU, "--cidr=" + netCIDR,
		// Without it the gateway address is the host's 127.0.0.1.
		"--disable-host-loopback",
		// slirp4netns runs as root: it confines itself to an empty
		// filesystem, CAP_NET_BIND_SERVICE alone and a seccomp filter.
		"--enable-sandbox", "--enable-seccomp",
		// fd 3: "1" once configured. fd 4: it quits when that closes.
		"--ready-fd=3", "--exit-fd=4",
		target, netIfname}
}

// netHelper is a running helper, a child of the shim.
type netHelper struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait has returned
	waitErr error         // cmd.Wait's result, set before exited is closed
	exitW   *os.File      // slirp4netns's exit-fd; nil for pasta
	log     *tailWriter
}

// startNetHelper attaches a helper to the network namespace of init
// (host pid initPID) and returns once that network is configured, with
// the helper recorded in fileNetHelper and placed in the sandbox's
// cgroups. The shim calls it before it lets init go, so the job never
// starts without its network. Paths are relative to the sandbox directory,
// the current directory.
func startNetHelper(tool netTool, initPID int, cg cgroupSet) (*netHelper, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("sandbox directory: %w", err)
	}
	pidFile := filepath.Join(wd, fileNetReady)
	log := &tailWriter{w: os.Stderr} // the shim's log
	h := &netHelper{exited: make(chan struct{}), log: log}
	h.cmd = &exec.Cmd{
		Path:   tool.Path,
		Args:   netHelperArgs(tool, initPID),
		Env:    helperEnv(false),
		Stdout: log,
		Stderr: log,
		// Nobody would stop a helper whose shim is gone: it runs in the
		// sandbox's pid namespace, whose end (init's, which ends with the
		// shim) is the helper's too (startInPIDNamespace). (No
		// Pdeathsig: Go's child would kill itself at once, its parent
		// being outside its pid namespace.)
		SysProcAttr: &syscall.SysProcAttr{
			// A mount namespace of its own, every mount in it made private
			// (recursively) before the helper runs: Go's fork does the
			// MS_REC|MS_PRIVATE remount of "/" for CLONE_NEWNS in
			// Unshareflags. The helpers run as root and confine themselves
			// by remounting and unmounting; slirp4netns --enable-sandbox
			// makes "/" private without MS_REC, pivots and detaches the
			// old root, and on a host whose "/" is shared (systemd's) that
			// detach propagated to the host: /sys/fs/cgroup, /dev/shm,
			// /run/netns/* and the rest vanished from it
			// (TestNetHelperLeavesHostMountsAlone).
			Unshareflags: syscall.CLONE_NEWNS,
		},
	}
	var readyR *os.File
	var childEnds []*os.File
	if tool.Name == netToolSlirp {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("ready-fd pipe: %w", err)
		}
		exitR, exitW, err := os.Pipe()
		if err != nil {
			r.Close()
			w.Close()
			return nil, fmt.Errorf("exit-fd pipe: %w", err)
		}
		readyR, h.exitW = r, exitW
		childEnds = []*os.File{w, exitR}
		h.cmd.ExtraFiles = childEnds
	} else {
		userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", initPID))
		if err != nil {
			return nil, fmt.Errorf("open the sandbox's user namespace: %w", err)
		}
		pf, err := os.OpenFile(pidFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			userns.Close()
			return nil, fmt.Errorf("ready file: %w", err)
		}
		childEnds = []*os.File{userns, pf}
		h.cmd.ExtraFiles = childEnds
	}
	startErr := startInPIDNamespace(h.cmd, initPID)
	for _, f := range childEnds {
		f.Close()
	}
	if startErr != nil {
		if readyR != nil {
			readyR.Close()
			h.exitW.Close()
		}
		return nil, fmt.Errorf("start %s: %w", tool.Name, startErr)
	}
	pid := h.cmd.Process.Pid
	// Recorded before anything can reap it (Wait is not called yet), so
	// that its start time can be read: Kill and Destroy, of this server or
	// of a later one, find it by this record.
	recErr := recordNetHelper(filepath.Join(wd, fileNetHelper), tool.Name, pid)
	go func() {
		h.waitErr = h.cmd.Wait()
		close(h.exited)
	}()
	if recErr != nil {
		if readyR != nil {
			readyR.Close()
		}
		h.stop()
		return nil, fmt.Errorf("record the %s process: %w", tool.Name, recErr)
	}
	if err := h.waitReady(readyR, pidFile); err != nil {
		h.stop()
		return nil, fmt.Errorf("%s could not set up the sandbox's network: %w%s", tool.Name, err, log.summary())
	}
	// In the sandbox's cgroups, the helper is ended by everything that
	// ends the sandbox (Kill, Destroy, the deadline, of any server), and
	// what it does for the job counts against the job's limits. Only now:
	// its own start-up memory stays charged to the shim, not to the job.
	if err := cg.addProc(pid); err != nil {
		h.stop()
		return nil, fmt.Errorf("place %s in the sandbox's cgroups: %w", tool.Name, err)
	}
	return h, nil
}

// waitReady waits until the helper has configured the sandbox's network,
// or has failed, or netReadyTimeout has passed.
func (h *netHelper) waitReady(readyR *os.File, pidFile string) error {
	deadline := time.Now().Add(netReadyTimeout)
	if readyR != nil {
		// slirp4netns writes "1" once the tap device is up and
		// configured; EOF means it died first.
		defer readyR.Close()
		if err := readyR.SetReadDeadline(deadline); err != nil {
			return fmt.Errorf("ready-fd: %w", err)
		}
		var b [1]byte
		_, err := readyR.Read(b[:])
		if err == nil {
			return nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("not ready after %v", netReadyTimeout)
		}
		select {
		case <-h.exited:
			return fmt.Errorf("it exited (%v)", h.waitErr)
		case <-time.After(time.Until(deadline)):
			return errors.New("it closed its ready-fd without being ready")
		}
	}
	// pasta writes its pid file after it has configured the namespace,
	// right before it starts forwarding: its pid in the sandbox's pid
	// namespace, where it runs.
	nsPID, err := nsPID(h.cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("its pid in the sandbox: %w", err)
	}
	want := strconv.Itoa(nsPID)
	for {
		if data, err := os.ReadFile(pidFile); err == nil && strings.TrimSpace(string(data)) == want {
			return nil
		}
		select {
		case <-h.exited:
			return fmt.Errorf("it exited (%v)", h.waitErr)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", netReadyTimeout)
		}
	}
}

// stop ends the helper and reaps it. Only the shim's main goroutine calls
// it.
func (h *netHelper) stop() {
	if h.exitW != nil {
		h.exitW.Close()
		h.exitW = nil
	}
	h.cmd.Process.Kill()
	<-h.exited
}

// tailWriter passes a helper's messages on to the shim's log and keeps
// the last ones, to explain a failure in the job's output.
type tailWriter struct {
	w   io.Writer
	mu  sync.Mutex
	buf []byte
}

const tailMax = 2048

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.w.Write(p)
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailMax:]...)
	}
	return len(p), nil
}

// summary is ": " and the helper's last messages on one line, or "".
func (t *tailWriter) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(string(t.buf), "\n") {
		l = strings.TrimSpace(l)
		// pasta's complaint that it has no syslog to write to, before
		// each message it also prints.
		if l == "" || (strings.HasPrefix(l, "Failed to send") && strings.HasSuffix(l, "to syslog")) {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return ""
	}
	return ": " + strings.Join(lines, "; ")
}

// netHelperRecord (fileNetHelper) names the helper process for Kill and
// Destroy, also those of a restarted server. A pid alone may name another
// process by the time it is read; a pid and its start time cannot.
type netHelperRecord struct {
	Tool  string `json:"tool"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // clock ticks after boot, /proc/<pid>/stat field 22
}

func recordNetHelper(file, tool string, pid int) error {
	start, _, err := procStart(pid)
	if err != nil {
		return err
	}
	return writeJSONAtomic(file, netHelperRecord{Tool: tool, PID: pid, Start: start})
}

// procStart returns a process's start time and whether it is a zombie.
func procStart(pid int) (start uint64, zombie bool, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false, err
	}
	// "pid (comm) S ...": comm may contain anything, so count fields from
	// after the last parenthesis, where field 3 (the state) begins.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, false, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return start, f[0] == "Z" || f[0] == "X", nil
}

// netHelperAlive reports whether the helper recorded in the sandbox
// directory dir still runs; a zombie does not.
func netHelperAlive(dir string) (pid int, alive bool) {
	var rec netHelperRecord
	if err := readJSON(filepath.Join(dir, fileNetHelper), &rec); err != nil || rec.PID <= 0 {
		return 0, false
	}
	start, zombie, err := procStart(rec.PID)
	return rec.PID, err == nil && !zombie && start == rec.Start
}

// killNetHelper SIGKILLs the helper recorded in dir, if it still runs. It
// is normally in the sandbox's cgroups and dies with them; this also
// covers one that is not (yet) there.
func killNetHelper(dir string) {
	if pid, alive := netHelperAlive(dir); alive {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// waitNetHelperGone kills the helper recorded in dir until it is gone, up
// to timeout: its record goes with the directory, so Destroy must not
// remove that while the helper lives.
func waitNetHelperGone(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pid, alive := netHelperAlive(dir)
		if !alive {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("network helper (pid %d) still alive after %v", pid, timeout)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		time.Sleep(10 * time.Millisecond)
	}
}

// errNoResolvConf: the sandbox's root has no /etc/resolv.conf to replace.
var errNoResolvConf = errors.New("network: the sandbox's root has no /etc/resolv.conf to point at the DNS forwarder " + netDNS + "; names will not resolve, addresses work")

// bindResolvConf points the sandbox's /etc/resolv.conf at the helper's
// DNS forwarder. /etc is a read-only view of the host's (or the
// template's), so a file of our own is bound over that one entry; the
// host's resolvers it named are often on the host's loopback, which the
// job cannot reach. init runs it before the pivot, with root (relative to
// the current directory) the new root, still writable; content is the
// file's (netResolvConf).
func bindResolvConf(root, content string) error {
	// The file is made on the root's own tmpfs and unlinked once bound:
	// the mount keeps it, and nothing of the sandbox directory (nor a
	// second copy) shows in the sandbox.
	src := filepath.Join(root, ".resolv.conf")
	if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	defer os.Remove(src)
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	defer unix.Close(rootFD)
	// Resolved as the job would (symbolic links stay inside the root), but
	// the last component is not followed: a link to a file the sandbox
	// does not have (systemd-resolved's /run/systemd/resolve/...) is itself
	// mounted over, and lookups of /etc/resolv.conf find our file.
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(rootFD, "etc/resolv.conf", how)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return errNoResolvConf
	}
	if err != nil {
		return fmt.Errorf("open /etc/resolv.conf: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat /etc/resolv.conf: %w", err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFLNK {
		return fmt.Errorf("/etc/resolv.conf in the sandbox's root is neither a file nor a symbolic link (mode %o)", st.Mode)
	}
	// Through the descriptor: the path was checked once, and is not
	// resolved again against the host's root, which init still has.
	if err := unix.Mount(src, fmt.Sprintf("/proc/self/fd/%d", fd), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind resolv.conf: %w", err)
	}
	// Read-only like the rest of /etc; the same lookup now ends in the
	// new mount.
	top, err := unix.Openat2(rootFD, "etc/resolv.conf", how)
	if err != nil {
		return fmt.Errorf("open the bound resolv.conf: %w", err)
	}
	defer unix.Close(top)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	err = unix.MountSetattr(top, "", unix.AT_EMPTY_PATH, &attr)
	if errors.Is(err, unix.ENOSYS) {
		// Before mount_setattr (5.12): a remount, keeping the flags the
		// kernel locks in a user namespace, as readOnlyRecursive does.
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(top, &sfs); err != nil {
			return fmt.Errorf("make resolv.conf read-only: %w", err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		for _, f := range []struct{ st, ms int64 }{
			{unix.ST_NOATIME, unix.MS_NOATIME},
			{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
			{unix.ST_RELATIME, unix.MS_RELATIME},
		} {
			if sfs.Flags&f.st != 0 {
				flags |= uintptr(f.ms)
			}
		}
		err = unix.Mount("", fmt.Sprintf("/proc/self/fd/%d", top), "", flags, "")
	}
	if err != nil {
		return fmt.Errorf("make resolv.conf read-only: %w", err)
	}
	return nil
}

// startInPIDNamespace starts cmd in the pid namespace of the sandbox
// whose init is host pid initPID. A network helper runs there so that it
// ends with the sandbox, however the sandbox ends: when its init exits
// (the job's end, Kill, or the death of its shim, which takes init with
// it), the kernel kills every process of the namespace. Its shim's death
// signal does not cover it: pasta enters the sandbox's user namespace,
// which is not root's (uids.go), and the kernel clears a parent-death
// signal on such a change of credentials. Only this thread's children
// go there, and only for this start (the shim's thread is locked).
func startInPIDNamespace(cmd *exec.Cmd, initPID int) error {
	own, err := os.Open("/proc/thread-self/ns/pid")
	if err != nil {
		return fmt.Errorf("pid namespace: %w", err)
	}
	defer own.Close()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/pid", initPID))
	if err != nil {
		return fmt.Errorf("the sandbox's pid namespace: %w", err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("enter the sandbox's pid namespace: %w", err)
	}
	startErr := cmd.Start()
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWPID); err != nil {
		if startErr == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return fmt.Errorf("leave the sandbox's pid namespace: %w", err)
	}
	return startErr
}

// nsPID is the pid of host process pid in its own pid namespace (the
// last of the NSpid line of its status).
func nsPID(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.Atoi(f[len(f)-1])
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no NSpid", pid)
}
