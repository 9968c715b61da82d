//go:build linux

package local

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// Backend creates sandboxes on this host. It is safe for concurrent use.
//
// It makes, recovers, lists and destroys sandboxes; the rest is in
// parts of one job each, made by New: the sandboxes' host uids (slots,
// uids.go), what may be a root filesystem (roots, template_linux.go),
// their plans (planner, plan_linux.go), their supervisors (shims,
// shims_linux.go), their network (networks, net_linux.go), their caches
// (caches, cache_linux.go), the egress proxy's listeners (proxies,
// egress_linux.go), and what this server holds of them in memory
// (liveSet, live_linux.go).
type Backend struct {
	dir     string
	pidsMax int
	noFile  int
	log     *slog.Logger
	cg      cgroupLayout

	slots   *uidRegistry // each sandbox's slot of host ids, claimed in the host's registry
	roots   *roots
	plans   *planner
	shims   *shims
	nets    *networks
	caches  *caches
	proxies *proxies
	live    *liveSet
	layers  *layerStore // checkpoints and their layers (layers_linux.go)
	// oneShot: Config.OneShot (no next command's directory made ahead).
	oneShot bool
}

var _ sandbox.Backend = (*Backend)(nil)

// Timeouts of Destroy's steps; the kernel is normally done in
// milliseconds, these only bound a misbehaving host.
const (
	drainTimeout   = 5 * time.Second
	shimGrace      = 10 * time.Second // a shim that has not written its pid by then never started
	probeTimeout   = 15 * time.Second
	needRootReason = "the local backend needs root (for user-namespace uid ranges and cgroup limits); run as root or use DELEGATE_BACKEND=proxmox"
)

// New returns a Backend after checking (Check) that this host can run it.
func New(cfg Config) (*Backend, error) {
	if cfg.Dir == "" {
		return nil, errors.New("local backend: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	self := cfg.SelfExe
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("local backend: find own executable: %w", err)
		}
	}
	if self, err = filepath.Abs(self); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	budget, err := hostFileBudget(cmp.Or(cfg.Sandboxes, DefaultSandboxes))
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	hard, err := serverNoFileHard()
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	pids, nofile, over, err := jobLimits(budget, cfg.PidsMax, cfg.NoFile, hard)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if over {
		log.Warn("the job limits let the sandboxes together hold more than half of the host's file table",
			"pids", pids, "nofile", nofile, "sandboxes", budget.Sandboxes, "fileMax", budget.FileMax, "memoryDefault", budget.MemDefault)
	}
	cacheDir := ""
	if cfg.CacheDir != "" {
		if cacheDir, err = filepath.Abs(cfg.CacheDir); err != nil {
			return nil, fmt.Errorf("local backend: CacheDir: %w", err)
		}
		if err := os.MkdirAll(cacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("local backend: CacheDir: %w", err)
		}
	}
	rootfsDir := ""
	if cfg.RootfsDir != "" {
		if rootfsDir, err = filepath.Abs(cfg.RootfsDir); err != nil {
			return nil, fmt.Errorf("local backend: RootfsDir: %w", err)
		}
	}
	uids, err := parseUIDRange(cmp.Or(cfg.UIDs, DefaultUIDs))
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if err := checkHostIDs(uids, ""); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if p := cfg.DefaultTemplate; strings.HasPrefix(p, "/") && filepath.Clean(p) != p {
		return nil, fmt.Errorf("local backend: DefaultTemplate %q must be a clean absolute path", p)
	}
	cg, err := checkHost(self)
	if err != nil {
		return nil, err
	}
	prog, err := seccompProgram()
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	// The sandboxes' records are the server's alone, whatever the umask
	// or whoever made the directory.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	// Mounts are found again by their path in /proc/self/mountinfo, which
	// shows it without symlinks.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	// The probe, unless it passed before under the same key.
	key, keyErr := probeKey(self, uids)
	if keyErr != nil || !probedBefore(probeRecordDir, key) {
		if err := probeHelpers(self, uids); err != nil {
			return nil, err
		}
		if keyErr == nil {
			if err := recordProbe(probeRecordDir, key); err != nil {
				log.Warn("could not record the sandbox probe's result: the next start probes again", "err", err)
			}
		}
	}
	rs := &roots{rootfsDir: rootfsDir, defaultTemplate: cfg.DefaultTemplate, sandboxes: dir, uids: uids}
	if err := rs.checkToolDirs(cfg.ToolDirs); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if rootfsDir != "" {
		real := rootfsDir
		if r, err := filepath.EvalSymlinks(real); err == nil {
			real = r
		}
		if reason := rs.forbiddenRoot(real); reason != "" {
			return nil, fmt.Errorf("local backend: RootfsDir %s %s", rootfsDir, reason)
		}
	}
	plans := &planner{noFile: nofile, toolDirs: slices.Clone(cfg.ToolDirs), seccomp: seccompBytes(prog), spareIdle: spareIdle}
	b := &Backend{
		dir: dir, pidsMax: pids, noFile: nofile, log: log, cg: cg,
		slots:   &uidRegistry{dir: uidRegistryDir, r: uids},
		roots:   rs,
		plans:   plans,
		shims:   &shims{selfExe: self, plans: plans},
		nets:    &networks{lookPath: exec.LookPath, pool: newNetnsPool(log)},
		caches:  &caches{dir: cacheDir, max: cmp.Or(cfg.CacheMaxBytes, DefaultCacheMaxBytes), sandboxes: dir, log: log},
		proxies: &proxies{server: cfg.Egress, callback: cfg.EgressCallbackPort, log: log, served: map[string]*servedSandbox{}},
		live:    newLiveSet(),
		layers:  &layerStore{dir: filepath.Join(dir, dirLayers), sandboxes: dir, self: self, log: log},
		oneShot: cfg.OneShot,
	}
	b.caches.ended = func(id string) bool { return b.ended(id, filepath.Join(dir, id)) }
	log.Debug("local backend ready", "dir", dir, "cgroup", cg.Version, "selfExe", self, "uids", uids.String(),
		"pids", pids, "nofile", nofile, "sandboxes", budget.Sandboxes, "fileMax", budget.FileMax, "memoryFileDefault", budget.MemDefault)
	return b, nil
}

// Check reports why this host cannot run the backend, or nil. It runs a
// probe sandbox (SelfExe must be a program that links this package) and
// prepares the parent cgroups
// of sandboxes, so it has the same side effects as New.
func (b *Backend) Check() error {
	if _, err := checkHost(b.shims.selfExe); err != nil {
		return err
	}
	return probeHelpers(b.shims.selfExe, b.slots.r)
}

// checkHost is Check's, for New too: the host's cgroups, once it has
// checked what the kernel must offer and what SelfExe must be.
// probeHelpers proves the rest.
func checkHost(selfExe string) (cgroupLayout, error) {
	if os.Geteuid() != 0 {
		return cgroupLayout{}, errors.New(needRootReason)
	}
	if err := seccompSupported(); err != nil {
		return cgroupLayout{}, err
	}
	if data, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(data)) == "0" {
		return cgroupLayout{}, errors.New("the local backend needs user namespaces, which are disabled here (sysctl user.max_user_namespaces = 0)")
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("the local backend needs openat2 (Linux 5.6 or later) to handle sandbox files safely: %w", err)
	}
	unix.Close(fd)
	cg, err := hostCgroups()
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("the local backend cannot enforce limits: %w", err)
	}
	st, err := os.Stat(selfExe)
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("local backend: SelfExe: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o001 == 0 {
		return cgroupLayout{}, fmt.Errorf("local backend: SelfExe %s must be a file executable by all users (mode o+x): the sandbox init runs it as an unprivileged uid", selfExe)
	}
	return cg, nil
}

// probeHelpers proves that a sandbox can be made: a probe of selfExe's
// helpers in namespaces owned by the first of uids.
func probeHelpers(selfExe string, uids uidRange) error {
	// Prove that SelfExe re-executes into the helpers (the Go ones and,
	// when built in, the C ones) and that the kernel lets us create the
	// namespaces, now rather than at the first job.
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	probes := []bool{false}
	if haveCHelper {
		probes = []bool{true, false}
	}
	for _, c := range probes {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, selfExe, shimCommand, probeArg, strconv.FormatUint(uint64(uids.first), 10))
		cmd.Env = helperEnv(c)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || string(out) != "ok\n" {
			which := "Go"
			if c {
				which = "C"
			}
			return fmt.Errorf("local backend: the sandbox probe (%s helpers) failed (is SelfExe a program that links the local package? can this kernel create user namespaces?): %v: %s",
				which, err, strings.TrimSpace(stderr.String()+string(out)))
		}
	}
	return nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "local" }

// Close implements sandbox.Backend: each sandbox's shim is a process of
// its own, detached, that goes on; what the backend holds in the server's
// process is the egress proxy's listeners, which the next server opens
// again when it recovers the sandboxes, and the network namespaces made
// ahead of need. It returns what failed to close.
func (b *Backend) Close() error {
	return errors.Join(b.proxies.close(), b.nets.close())
}

// Capabilities implements sandbox.Backend. Everything listed is enforced:
// New fails on a host where it could not be. NetworkEgress depends on a
// network helper being installed, looked for at most netLookFor ago.
func (b *Backend) Capabilities() sandbox.Capabilities {
	netErr := b.nets.missing()
	egress := b.proxies.server != nil
	var netMissing string
	if netErr != nil && !egress {
		netMissing = netErr.Error()
	}
	return sandbox.Capabilities{
		FilesystemIsolation:  true,
		NetworkIsolation:     true,
		NetworkEgress:        netErr == nil || egress,
		NetworkEgressMissing: netMissing,
		CPULimit:             true,
		MemoryLimit:          true,
		PidsLimit:            true,
		DiskLimit:            true,
		Recover:              true,
		Templates:            true,
		// The shim watches the job's process for as long as it runs.
		Supervised: true,
		StatusFile: StatusFile,
		InputsDir:  InputsDir,
		// Sandboxes made with Spec.MultiExec (and no network) run many
		// commands.
		MultiExec: true,
		// The cgroup freezer (v2, or v1's freezer hierarchy).
		Pause:      b.cg.Freezer != "",
		Caches:     b.caches.dir != "",
		Workspaces: true,
		// Sandboxes whose only road out is the proxy's listeners, with a
		// trust bundle of their own.
		EgressProxy: egress,
		EgressTrust: egress,
		// Kept sandboxes' files, as overlay layers (layers_linux.go).
		Checkpoint:              true,
		CheckpointMemoryMissing: checkpointMemoryMissing,
	}
}

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var net *netTool
	var proxy *proxyState
	switch {
	case spec.Network && spec.Egress != nil:
		if b.proxies.server == nil {
			return nil, fmt.Errorf("local backend: %w", errNoEgressProxy)
		}
		if spec.Egress.Token == "" {
			return nil, errors.New("local backend: Spec.Egress has no token")
		}
		proxy = &proxyState{Token: spec.Egress.Token, Callback: b.proxies.callbackPort(), Trust: len(spec.Egress.CACert) > 0}
	case spec.Network:
		tool, err := b.nets.tool()
		if err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
		net = &tool
	}
	if spec.MultiExec && net != nil {
		return nil, errors.New("local backend: a sandbox that runs many commands has no network through a network helper (it serves one command); its network goes through the egress proxy (Spec.Egress) or nowhere")
	}
	if spec.From != "" {
		if !spec.MultiExec {
			return nil, errors.New("local backend: a sandbox made from a checkpoint (Spec.From) is a kept one (Spec.MultiExec)")
		}
		if err := checkCheckpointID(spec.From); err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
	}
	if spec.MemoryBytes <= 0 {
		return nil, fmt.Errorf("local backend: memory limit must be positive (got %d bytes)", spec.MemoryBytes)
	}
	if spec.DiskBytes <= 0 {
		return nil, fmt.Errorf("local backend: disk size must be positive (got %d bytes)", spec.DiskBytes)
	}
	if spec.CPU < 0 || math.IsNaN(spec.CPU) || math.IsInf(spec.CPU, 0) {
		return nil, fmt.Errorf("local backend: cpu must be a positive number of cores or 0 for no limit (got %v)", spec.CPU)
	}
	tpl := -1 // the template's root filesystem, open
	if spec.Template != "" {
		fd, err := b.roots.openTemplate(spec.Template)
		if err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
		defer unix.Close(fd)
		tpl = fd
	}
	id, err := newID("sb-", 6)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, id)
	defer b.live.create(id)()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	created := false
	defer func() {
		if !created {
			if err := b.destroy(id); err != nil {
				b.log.Error("cleanup of a failed sandbox", "sandbox", id, "err", err)
			}
		}
	}()
	if err := b.provision(id, dir, spec, net, proxy, tpl); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	created = true
	netName := "none"
	if net != nil {
		netName = net.Name
	} else if proxy != nil {
		netName = "egress proxy"
	}
	b.log.Info("sandbox created", "sandbox", id, "job", spec.JobID, "cpu", spec.CPU,
		"memory", spec.MemoryBytes, "disk", spec.DiskBytes, "template", spec.Template, "network", netName)
	return &sbox{b: b, id: id, dir: dir}, nil
}

// provision fills a new sandbox directory. Every step leaves a trace that
// destroy can undo (state.json is written before the cgroups exist). net
// is the network helper the shim will start, proxy the egress proxy's
// part, nil both for no network; tpl the template's root filesystem
// (openTemplate), -1 for none.
func (b *Backend) provision(id, dir string, spec sandbox.Spec, net *netTool, proxy *proxyState, tpl int) error {
	// The sandbox's host ids: a slot of its own.
	base, err := b.slots.claim(dir)
	if err != nil {
		return err
	}
	hostJob := int(base + jobID)
	// Only init's group (the user namespace's root, host gid base) may
	// search the directory: init reaches its workspace, rootfs and
	// template through it. Nothing in it is readable to that group.
	if err := os.Chown(dir, 0, int(base)); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return err
	}
	st := sandboxState{
		ID:          id,
		JobID:       spec.JobID,
		Created:     time.Now().UTC(),
		CPU:         spec.CPU,
		MemoryBytes: spec.MemoryBytes,
		DiskBytes:   spec.DiskBytes,
		PidsMax:     b.pidsMax,
		NoFile:      b.noFile,
		HostUID:     base,
		Template:    spec.Template,
		Cgroup:      b.cg.names(id),
		Network:     net,
		Proxy:       proxy,
		Multi:       spec.MultiExec,
		Expires:     spec.Expires,
		Init:        spec.MultiExec,
		Var:         spec.DiskVar,
		TmpBytes:    spec.TmpBytes,
	}
	st.Spawns = spec.MultiExec && b.shims.cFor(st)
	if spec.From != "" {
		// A fork: its first state names the checkpoint's layers.
		if err := b.layers.recordFork(dir, &st, spec.From); err != nil {
			return fmt.Errorf("fork from checkpoint %s: %w", spec.From, err)
		}
	} else if err := writeJSONAtomic(filepath.Join(dir, fileState), st); err != nil {
		return err
	}
	for _, d := range []string{dirWorkspace, dirRootfs} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	ws := filepath.Join(dir, dirWorkspace)
	// The tmpfs size is the disk limit. It is mounted here, in the host's
	// mount namespace, so the server can write files before the job runs
	// and read them after it ended. Its pages are memory, and count
	// against the memory limit of whoever writes them.
	// A fork's is an overlay of the same size over a checkpoint's
	// layers (layers_linux.go).
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d",
		spec.DiskBytes, max(spec.DiskBytes/4096, 16384), hostJob, hostJob)
	if spec.From != "" {
		if err := b.layers.mountLayers(dir, st, st.Lowers); err != nil {
			return fmt.Errorf("fork from checkpoint %s: %w", spec.From, err)
		}
	} else if err := unix.Mount("tmpfs", ws, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount workspace tmpfs: %w", err)
	} else if err := unix.Mount("", ws, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make workspace private: %w", err)
	}
	if spec.DiskVar {
		// A VM's /var, on a tmpfs of the disk's size like the workspace
		// (a budget of its own: the simulator's disks are memory anyway).
		v := filepath.Join(dir, dirVar)
		if err := os.Mkdir(v, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", v, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount /var tmpfs: %w", err)
		}
		if err := unix.Mount("", v, "", unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make /var private: %w", err)
		}
	}
	if spec.MultiExec {
		// One init for all its commands (keeper_linux.go), in a network
		// namespace bound here; its commands' directories, and their
		// status channels on a small tmpfs of their own.
		if err := os.Mkdir(filepath.Join(dir, dirExecs), 0o700); err != nil {
			return err
		}
		if proxy == nil {
			if err := pinNetns(filepath.Join(dir, fileNetns)); err != nil {
				return err
			}
		}
		ch := filepath.Join(dir, dirChannel)
		if err := os.Mkdir(ch, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", ch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,nr_inodes=4096,mode=0711"); err != nil {
			return fmt.Errorf("mount the status channels' tmpfs: %w", err)
		}
		if err := unix.Mount("", ch, "", unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make the status channels' tmpfs private: %w", err)
		}
		// The sandbox's accounts, on the same tmpfs (passwd_linux.go).
		if err := writeAccounts(dir); err != nil {
			return err
		}
	} else if err := makeStatusFIFO(dir, hostJob); err != nil {
		return err
	}
	if len(spec.Caches) > 0 {
		// Recorded before the cgroups: Destroy gives back what the
		// state names, and unmounts whatever is under caches/.
		caches, err := b.caches.attach(id, dir, spec, hostJob)
		st.Caches = caches
		if werr := writeJSONAtomic(filepath.Join(dir, fileState), st); err == nil {
			err = werr
		}
		if err != nil {
			return err
		}
	}
	if tpl >= 0 {
		// A read-only bind here, made as host root, lets the unprivileged
		// init reach a template whose path it could not search. It binds
		// the directory that was checked, through its descriptor, not
		// whatever its path names by now.
		dst := filepath.Join(dir, dirTemplate)
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", tpl), dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind vmTemplate %s: %w", spec.Template, err)
		}
		if err := unix.Mount("", dst, "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make template private: %w", err)
		}
		if err := readOnlyRecursive(dst); err != nil {
			return fmt.Errorf("make the template read-only: %w", err)
		}
	}
	if err := st.Cgroup.create(limits{MemoryBytes: spec.MemoryBytes, CPU: spec.CPU, PidsMax: b.pidsMax}); err != nil {
		return err
	}
	if proxy != nil {
		if err := makeProxyNetns(filepath.Join(dir, fileNetns)); err != nil {
			return err
		}
		if proxy.Trust {
			if err := writeTrustBundle(dir, tpl, spec.Egress.CACert); err != nil {
				return err
			}
		}
		if err := b.proxies.serve(id, dir, st); err != nil {
			return err
		}
	}
	if spec.MultiExec {
		return b.shims.startKeeper(dir, st)
	}
	return nil
}

// Recover implements sandbox.Backend.
func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Instance, error) {
	if !idPattern().MatchString(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, sandbox.ErrGone)
	}
	dir := filepath.Join(b.dir, id)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrGone)
	}
	st, stErr := b.state(dir, id)
	// A kept sandbox lives as long as its init (and its supervisor).
	if stErr == nil && st.Init {
		if _, alive := shimAlive(dir); !alive {
			return nil, fmt.Errorf("sandbox %s: its init has ended (its lifetime is over, or it was killed): %w", id, sandbox.ErrGone)
		}
	}
	// A sandbox whose network is the egress proxy's gets its listeners
	// again (a restarted server), unless they are served already.
	if stErr == nil && st.Proxy != nil && b.proxies.server != nil {
		if err := b.proxies.serve(id, dir, st); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	sb := &sbox{b: b, id: id, dir: dir}
	if stErr == nil {
		sb.st = &st
	}
	return sb, nil
}

// List implements sandbox.Backend.
func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []sandbox.Info
	for _, e := range ents {
		if e.IsDir() && idPattern().MatchString(e.Name()) && !b.live.isCreating(e.Name()) {
			var st sandboxState
			readJSON(filepath.Join(b.dir, e.Name(), fileState), &st) // no state: no job to name
			out = append(out, sandbox.Info{ID: e.Name(), JobID: st.JobID})
		}
	}
	return out, nil
}

// Destroy implements sandbox.Backend.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !idPattern().MatchString(id) {
		return fmt.Errorf("destroy sandbox: %q is not a local sandbox id", id)
	}
	return b.destroy(id)
}

// state reads a sandbox's state. When it is missing or unreadable (a
// Create that failed early) the cgroup names are derived from the id, so
// cleanup still finds them.
func (b *Backend) state(dir, id string) (sandboxState, error) {
	var st sandboxState
	err := readJSON(filepath.Join(dir, fileState), &st)
	if err != nil || st.Cgroup.Version == 0 {
		st.Cgroup = b.cg.names(id)
	}
	return st, err
}

// destroy kills, unmounts, removes the cgroups and the directory, in that
// order; what is already gone is skipped.
func (b *Backend) destroy(id string) error {
	dir := filepath.Join(b.dir, id)
	// What this server holds of it in memory is forgotten with it.
	defer b.live.forget(dir)
	// Its listeners close first: nothing is served to a sandbox going.
	// (One that fails to close holds nothing of the sandbox's: the rest
	// goes on, and Destroy reports it.)
	stopErr := b.proxies.stop(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		// Nothing to find the sandbox by; groups under the usual names may
		// still be there (a Destroy interrupted after its directory went).
		b.cg.names(id).remove(0)
		if stopErr != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, stopErr)
		}
		return nil
	}
	st, stErr := b.state(dir, id)
	if stErr != nil && !errors.Is(stErr, os.ErrNotExist) {
		b.log.Warn("destroy: unreadable sandbox state, using default cgroup names", "sandbox", id, "err", stErr)
	}
	var errs []error
	// A sandbox whose command has ended has nothing left to kill (its pid
	// namespace went with init) nor to release; otherwise Kill's marker
	// first, so that an init not yet released never is.
	if !b.ended(id, dir) {
		killSandbox(dir, st.Cgroup)
	}
	if err := st.Cgroup.waitEmpty(drainTimeout); err != nil {
		errs = append(errs, err)
	}
	b.waitShim(id, dir, drainTimeout)
	if st.Multi {
		ents, _ := os.ReadDir(filepath.Join(dir, dirExecs))
		for _, e := range ents {
			b.waitShim(id, filepath.Join(dir, dirExecs, e.Name()), drainTimeout)
		}
	}
	// Normally gone with the cgroups; its record goes with the directory,
	// so one that escaped them must be gone before that.
	if err := waitNetHelperGone(dir, drainTimeout); err != nil {
		errs = append(errs, err)
	}
	if err := unmountSandbox(dir); err != nil {
		errs = append(errs, err)
	} else {
		if err := b.caches.release(id, dir, st.JobID, st.Caches); err != nil {
			errs = append(errs, err)
		}
		// Its checkpoints go with it; the layers a fork of it stands
		// on stay for the fork.
		if err := b.layers.dropSandbox(id, st.Lowers); err != nil {
			errs = append(errs, err)
		}
	}
	if err := st.Cgroup.remove(drainTimeout); err != nil {
		errs = append(errs, err)
	}
	// The directory goes last and only when all else is gone: while it
	// exists, List shows the sandbox and a later Destroy can finish the job
	// (and removing files through a mount would empty it, not free it).
	if len(errs) == 0 {
		if err := removeSandboxDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	// Its host ids are free again once nothing of it is left. (A state
	// that could not be read leaves the claim, whose directory is gone,
	// to the next claim, which takes it.)
	if len(errs) == 0 && st.HostUID != 0 {
		if err := b.slots.release(st.HostUID, dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(append(errs, stopErr)...); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	b.log.Info("sandbox destroyed", "sandbox", id)
	return nil
}

// ended reports whether the sandbox's command has ended and its shim is
// gone.
func (b *Backend) ended(id, dir string) bool {
	if _, err := os.Lstat(filepath.Join(dir, fileExit)); err != nil {
		return false
	}
	if p := b.live.get(dir); p != nil && p.done != nil {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	}
	_, alive := shimAlive(dir)
	return !alive
}

// sandboxFiles and sandboxDirs are what a sandbox directory holds. Knowing
// them, Destroy removes them one by one instead of walking the directory.
var (
	sandboxFiles = [...]string{fileState, fileExec, fileExit, fileOutput, fileStreams, fileEvents, fileEventsLatest, fileStatusFIFO,
		fileKilled, fileDeadline, fileShimPID, fileInitPID, fileShimLog, fileNetHelper, fileNetReady, fileTrust, fileNetns}
	sandboxDirs = [...]string{dirWorkspace, dirRootfs, dirTemplate, dirChannel, dirCacheLayers, dirUpper}
)

// removeSandboxDir removes the sandbox directory, whose mounts are gone.
// Anything it does not know of (a temporary file a crash left, a mount it
// did not make) makes it fall back to finding every mount below the
// directory and removing what is left: removing files through a mount
// would empty it, not free it. rmdir never does that.
func removeSandboxDir(dir string) error {
	for _, f := range sandboxFiles {
		if err := unix.Unlink(filepath.Join(dir, f)); err != nil && !errors.Is(err, unix.ENOENT) {
			break // the general way below says what is wrong
		}
	}
	for _, d := range sandboxDirs {
		unix.Rmdir(filepath.Join(dir, d))
	}
	removeCacheDirs(dir)
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err := unmountAll(dir); err != nil {
		return err
	}
	return removeAll(dir)
}

// removeAll retries because a shim that is just finishing may still add a
// file while the directory is being emptied.
func removeAll(dir string) error {
	var err error
	for range 5 {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// waitShim waits for the sandbox's shim to exit (it does right after
// init), and kills it if it does not.
func (b *Backend) waitShim(id, dir string, timeout time.Duration) {
	if p := b.live.get(dir); p != nil && p.done != nil {
		select {
		case <-p.done:
			return
		case <-time.After(timeout):
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		pid, alive := shimAlive(dir)
		if !alive {
			return
		}
		if time.Now().After(deadline) {
			b.log.Warn("sandbox shim did not exit; killing it", "sandbox", id, "pid", pid)
			unix.Kill(pid, unix.SIGKILL)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
