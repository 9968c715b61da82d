//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// Checkpoints, rollbacks and forks of kept sandboxes (issue 38): files
// only, as copy-on-write layers, not copies (the root file system here
// is ext4, which has no reflinks, and the workspace is a tmpfs anyway).
//
// A kept sandbox starts as any other: its workspace a tmpfs of
// Spec.DiskBytes at workspace/. Its first checkpoint makes the layers
// directory (Config.Dir/layers: a sandbox that never checkpoints pays
// nothing) and there
//
//   - stops the sandbox's processes (the cut is consistent: nothing
//     writes; a checkpoint is of files, so nothing of memory is kept and
//     they start again from a clean init afterwards, as after a
//     rollback: the engine ends the commands it knows as cancelled);
//   - freezes the sandbox's writable layer: its tmpfs moves, as it is
//     (a bind and an unmount: no byte copied), to layers/<layer>,
//     read-only from then on;
//   - gives the sandbox a fresh writable layer, a new tmpfs of
//     Spec.DiskBytes at upper/ (so the disk limit keeps holding: it
//     bounds what the sandbox writes after the cut), and mounts at
//     workspace/ an overlay of that upper over the frozen layers, newest
//     first;
//   - records the checkpoint (layers/<checkpoint>.json: its layers, its
//     sandbox) and starts the sandbox's init again (paused again if it
//     was).
//
// A rollback drops the sandbox's upper (what it wrote since) and mounts
// a fresh one over the checkpoint's layers; a fork is a new sandbox
// (Spec.From) whose workspace is a fresh upper over a checkpoint's
// layers: the engine forks a live sandbox by checkpointing it first, so
// its N forks share one frozen instant. A layer goes when no checkpoint
// and no sandbox stands on it any more (gc): deleting a checkpoint, or
// destroying a sandbox (its checkpoints go with it), frees what only
// they held, and a fork keeps what it stands on.
//
// Owners: a layer's files belong to the host ids of the sandbox that
// wrote them (its slot, uids.go). A fork has a slot of its own, so it
// sees each layer of another slot through an idmapped mount (a bind of
// the layer whose ids are shifted from that slot to the fork's,
// mount_setattr MOUNT_ATTR_IDMAP with a user namespace that maps the one
// range onto the other), made at lowers/<n> and given to the overlay as
// its lower: in the fork a file the source made is its own job's
// (stat shows uid 1000, not nobody), and changing or deleting it works
// (the overlay copies it up, with the fork's ids, or whites it out).
// Chowning the layer instead would change it for every sandbox on it,
// and copying it would not be a fork. idmapped mounts of tmpfs need
// Linux 6.3, overlay layers that are idmapped mounts 5.19.
//
// Memory: the layers are tmpfs, whose pages stay charged to the memory
// cgroup of the sandbox that wrote them, as its workspace's were; a fork
// is charged only for what it writes (copy-ups included).
type layerStore struct {
	dir       string // Config.Dir/layers, made with the first checkpoint
	sandboxes string // Config.Dir: the sandboxes' states name the layers they stand on
	self      string // SelfExe, which holds an idmap's user namespace (usernsHoldCommand)
	log       *slog.Logger
	// mu orders every change of the layers and checkpoints (a gc must
	// not take a layer a checkpoint or a fork is being made on).
	mu sync.Mutex
}

// checkpointRecord is a checkpoint, layers/<id>.json.
type checkpointRecord struct {
	ID      string     `json:"id"`
	Sandbox string     `json:"sandbox"`
	Layers  []layerRef `json:"layers"` // newest first
	Bytes   int64      `json:"bytes"`
	Created time.Time  `json:"created"`
}

// Files and directories of checkpoints (in a sandbox's directory, and
// in the layers directory).
const (
	dirLayers = "layers"
	dirUpper  = "upper"  // a layered sandbox's writable tmpfs
	dirLowers = "lowers" // the idmapped binds of the layers it stands on
	upperDir  = "upper"  // in dirUpper: the overlay's upper directory
	workDir   = "work"   // in dirUpper: the overlay's work directory
)

// checkpointMemoryMissing is why no checkpoint keeps memory here
// (Capabilities.CheckpointMemoryMissing).
const checkpointMemoryMissing = "a checkpoint of a sandbox's memory and processes needs CRIU that works on this host " +
	"(criu check passes): Debian 12's CRIU 3.17 fails it on this kernel (\"vdso: Unexpected rt vDSO area bounds\"), " +
	"so the local backend keeps files only; leave memory out (its processes start again from a clean init)"

var (
	layerIDPattern      = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^ly-[0-9a-f]{12}$`) })
	checkpointIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^cp-[0-9a-f]{12}$`) })
)

// CheckCheckpointID says whether id could name a local checkpoint.
func checkCheckpointID(id string) error {
	if !checkpointIDPattern().MatchString(id) {
		return fmt.Errorf("checkpoint %q is not a checkpoint of the local backend (cp- and 12 hex digits)", id)
	}
	return nil
}

func (ls *layerStore) path(name string) string { return filepath.Join(ls.dir, name) }

// record reads a checkpoint's record.
func (ls *layerStore) record(id string) (checkpointRecord, error) {
	var rec checkpointRecord
	if err := checkCheckpointID(id); err != nil {
		return rec, err
	}
	if err := readJSON(ls.path(id+".json"), &rec); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return rec, fmt.Errorf("checkpoint %s: %w", id, sandbox.ErrGone)
		}
		return rec, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return rec, nil
}

// freezeTop makes the sandbox's writable layer a frozen one (see above):
// its tmpfs goes to the layers directory, read-only, unmounted from the
// sandbox. The sandbox's processes have ended; its overlay (if any) is
// unmounted here.
func (ls *layerStore) freezeTop(dir string, st sandboxState) (layerRef, int64, error) {
	src, root := filepath.Join(dir, dirWorkspace), "."
	if st.Layered {
		if err := unmountOverlay(dir); err != nil {
			return layerRef{}, 0, err
		}
		src, root = filepath.Join(dir, dirUpper), upperDir
	}
	// What is frozen is a tmpfs of the sandbox's, never its overlay
	// (which a stale state would name).
	var sfs unix.Statfs_t
	if err := unix.Statfs(src, &sfs); err != nil {
		return layerRef{}, 0, fmt.Errorf("freeze the workspace: %w", err)
	}
	if sfs.Type != unix.TMPFS_MAGIC {
		return layerRef{}, 0, fmt.Errorf("freeze the workspace: %s is not the sandbox's tmpfs (file system type %#x)", src, sfs.Type)
	}
	if err := os.Mkdir(ls.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return layerRef{}, 0, fmt.Errorf("make the layers directory: %w", err)
	}
	id, err := newID("ly-", 6)
	if err != nil {
		return layerRef{}, 0, err
	}
	mp := ls.path(id)
	if err := os.Mkdir(mp, 0o700); err != nil {
		return layerRef{}, 0, err
	}
	if err := unix.Mount(src, mp, "", unix.MS_BIND, ""); err != nil {
		os.Remove(mp)
		return layerRef{}, 0, fmt.Errorf("freeze the workspace: %w", err)
	}
	steps := []struct {
		flags uintptr
		what  string
	}{
		{unix.MS_PRIVATE, "make it private"},
		{unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV, "make it read-only"},
	}
	for _, s := range steps {
		if err := unix.Mount("", mp, "", s.flags, ""); err != nil {
			unmountAt(mp)
			os.Remove(mp)
			return layerRef{}, 0, fmt.Errorf("freeze the workspace: %s: %w", s.what, err)
		}
	}
	if err := unmountAt(src); err != nil {
		return layerRef{}, 0, err
	}
	var bytes int64
	if unix.Statfs(mp, &sfs) == nil {
		bytes = int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize
	}
	return layerRef{ID: id, Base: st.hostBase(), Root: root}, bytes, nil
}

// mountLayers mounts a fresh upper (a tmpfs of the sandbox's disk size,
// the job's) and at workspace/ the overlay of it over layers (newest
// first), each seen with the sandbox's own ids.
func (ls *layerStore) mountLayers(dir string, st sandboxState, layers []layerRef) error {
	hostJob := int(st.hostBase() + jobID)
	up := filepath.Join(dir, dirUpper)
	if err := os.Mkdir(up, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	// 0755: a fork sees it through an idmapped mount, in which root,
	// its owner, is no one it may search as.
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", st.DiskBytes, max(st.DiskBytes/4096, 16384))
	if err := unix.Mount("tmpfs", up, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the workspace's upper tmpfs: %w", err)
	}
	if err := unix.Mount("", up, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the upper tmpfs private: %w", err)
	}
	upper, work := filepath.Join(up, upperDir), filepath.Join(up, workDir)
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// The overlay's root is its upper directory: the job's, as the
	// workspace tmpfs's root is.
	if err := os.Chown(upper, hostJob, hostJob); err != nil {
		return err
	}
	if err := os.Chmod(upper, 0o755); err != nil {
		return err
	}
	lowers := make([]string, len(layers))
	// One user namespace per slot the layers come from (all of a
	// source's layers are of its slot): made once, used for each.
	userns := map[uint32]int{}
	defer func() {
		for _, fd := range userns {
			unix.Close(fd)
		}
	}()
	for i, l := range layers {
		if !layerIDPattern().MatchString(l.ID) || (l.Root != "." && l.Root != upperDir) {
			return fmt.Errorf("layer %q (root %q) is not a layer of this backend", l.ID, l.Root)
		}
		p := filepath.Join(ls.dir, l.ID, l.Root)
		if l.Base != st.hostBase() {
			// The whole layer's mount is idmapped (a bind of its
			// directory upper is refused: EINVAL).
			at := filepath.Join(dir, dirLowers, strconv.Itoa(i))
			if err := os.MkdirAll(at, 0o700); err != nil {
				return err
			}
			ns, ok := userns[l.Base]
			if !ok {
				var err error
				if ns, err = ls.idmapUserns(l.Base, st.hostBase()); err != nil {
					return fmt.Errorf("layer %s (%d of %d, root %s): %w", l.ID, i+1, len(layers), l.Root, err)
				}
				userns[l.Base] = ns
			}
			if err := idmapped(filepath.Join(ls.dir, l.ID), at, ns); err != nil {
				return fmt.Errorf("layer %s (%d of %d, root %s): %w", l.ID, i+1, len(layers), l.Root, err)
			}
			p = filepath.Join(at, l.Root)
		}
		lowers[i] = p
	}
	for _, p := range append([]string{upper, work}, lowers...) {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("the path %s has a ',', ':' or '\\', which an overlay's options cannot carry", p)
		}
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upper, work)
	ws := filepath.Join(dir, dirWorkspace)
	if err := unix.Mount("overlay", ws, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl); err != nil {
		return fmt.Errorf("mount the workspace's overlay: %w", err)
	}
	if err := unix.Mount("", ws, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the workspace's overlay private: %w", err)
	}
	return nil
}

// unmountLayered unmounts a layered sandbox's workspace overlay, its
// upper (and so what it wrote) and its binds of its layers.
func unmountLayered(dir string) error {
	if err := unmountOverlay(dir); err != nil {
		return err
	}
	return unmountAt(filepath.Join(dir, dirUpper))
}

// unmountOverlay unmounts a layered sandbox's workspace overlay and its
// binds of its layers, not its upper.
func unmountOverlay(dir string) error {
	if err := unmountAt(filepath.Join(dir, dirWorkspace)); err != nil {
		return err
	}
	lowers := filepath.Join(dir, dirLowers)
	ents, _ := os.ReadDir(lowers)
	for _, e := range ents {
		if err := unmountAt(filepath.Join(lowers, e.Name())); err != nil {
			return err
		}
		os.Remove(filepath.Join(lowers, e.Name()))
	}
	os.Remove(lowers)
	return nil
}

// idmapped mounts at at a read-only bind of src whose files' ids are
// seen through the user namespace userns (idmapUserns: those of one
// slot as the same ids of another).
func idmapped(src, at string, userns int) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap the layer (mount_setattr; Linux 6.3 idmaps tmpfs): %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the idmapped layer: %w", err)
	}
	return nil
}

// idmapUserns returns a user namespace (its descriptor) that maps the
// slot of host ids from onto the slot to. The kernel takes a map only
// from a process in the namespace, so one is made: a child of this
// binary in a new user namespace, its map written by the runtime before
// it execs, which stops at its exec (PTRACE_TRACEME: the kernel stops a
// traced process with SIGTRAP before its first instruction), so that it
// runs nothing (no Go runtime to start, no pipe to wait on: a fork pays
// a clone and an exec, about 1 ms, where the child that ran until its
// stdin closed cost 13 ms at load 6). Its namespace is opened, then it
// is killed. Where the host refuses tracing (Yama's ptrace_scope 3),
// the child runs usernsHoldCommand until its stdin closes, as before.
func (ls *layerStore) idmapUserns(from, to uint32) (int, error) {
	// The child's parent-death signal (and its tracer) is the thread that
	// forks it, and the runtime ends threads (namespace work elsewhere in
	// this package): held until the child is reaped, the thread is ours.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// No descriptors: were it ever let go by its tracer, it would find
	// no stdin and end at once.
	proc, err := os.StartProcess(ls.self, []string{ls.self, usernsHoldCommand}, &os.ProcAttr{Sys: idmapAttr(from, to, true)})
	if err != nil {
		if !errors.Is(err, syscall.EPERM) {
			return -1, fmt.Errorf("a user namespace for an idmap: %w", err)
		}
		return ls.idmapUsernsHeld(from, to)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", proc.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	proc.Kill()
	proc.Wait()
	if err != nil {
		return -1, fmt.Errorf("a user namespace for an idmap: %w", err)
	}
	return fd, nil
}

// idmapAttr makes a child in a new user namespace that maps the slot of
// host ids from onto the slot to, traced (stopped at its exec) or not.
func idmapAttr(from, to uint32, traced bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(to), Size: slotSize}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(to), Size: slotSize}},
		Ptrace:      traced,
		Pdeathsig:   syscall.SIGKILL,
	}
}

// idmapUsernsHeld is idmapUserns where tracing is refused: the child
// runs, holding the namespace until its stdin closes.
func (ls *layerStore) idmapUsernsHeld(from, to uint32) (int, error) {
	runtime.LockOSThread() // as in idmapUserns
	defer runtime.UnlockOSThread()
	cmd := exec.Command(ls.self, usernsHoldCommand)
	cmd.SysProcAttr = idmapAttr(from, to, false)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return -1, err
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("a user namespace for an idmap: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	stdin.Close()
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("the user namespace's holder: %w", werr)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("a user namespace for an idmap: %w", err)
	}
	return fd, nil
}

// runUsernsHold is usernsHoldCommand: it waits for its stdin to close.
func runUsernsHold() int {
	var b [1]byte
	for {
		if _, err := os.Stdin.Read(b[:]); err != nil {
			return 0
		}
	}
}

// save records a checkpoint.
func (ls *layerStore) save(rec checkpointRecord) error {
	return writeJSONAtomic(ls.path(rec.ID+".json"), rec)
}

// delete forgets a checkpoint and frees what only it held.
func (ls *layerStore) delete(id string) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	rec, err := ls.record(id)
	if errors.Is(err, sandbox.ErrGone) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.Remove(ls.path(id + ".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return ls.gc(rec.Layers)
}

// dropSandbox forgets the checkpoints of a sandbox being destroyed and
// frees the layers only it and they held (its own state, lowers, is
// gone already or going: it is not counted).
func (ls *layerStore) dropSandbox(id string, lowers []layerRef) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ents, err := os.ReadDir(ls.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	cands := append([]layerRef(nil), lowers...)
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !checkpointIDPattern().MatchString(name) {
			continue
		}
		rec, err := ls.record(name)
		if err != nil || rec.Sandbox != id {
			continue
		}
		if err := os.Remove(ls.path(e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		cands = append(cands, rec.Layers...)
	}
	return ls.gcExcept(cands, id)
}

func (ls *layerStore) gc(cands []layerRef) error { return ls.gcExcept(cands, "") }

// gcExcept removes each layer of cands that no checkpoint and no sandbox
// (but skip, being destroyed) stands on. The caller holds mu.
func (ls *layerStore) gcExcept(cands []layerRef, skip string) error {
	if len(cands) == 0 {
		return nil
	}
	used := map[string]bool{}
	if ents, err := os.ReadDir(ls.dir); err == nil {
		for _, e := range ents {
			name, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || !checkpointIDPattern().MatchString(name) {
				continue
			}
			var rec checkpointRecord
			if err := readJSON(ls.path(e.Name()), &rec); err != nil {
				return fmt.Errorf("read checkpoint %s: %w (no layer freed)", name, err)
			}
			for _, l := range rec.Layers {
				used[l.ID] = true
			}
		}
	}
	sbs, err := os.ReadDir(ls.sandboxes)
	if err != nil {
		return err
	}
	for _, e := range sbs {
		if !idPattern().MatchString(e.Name()) || e.Name() == skip {
			continue
		}
		var st sandboxState
		if err := readJSON(filepath.Join(ls.sandboxes, e.Name(), fileState), &st); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return fmt.Errorf("read sandbox %s: %w (no layer freed)", e.Name(), err)
		}
		for _, l := range st.Lowers {
			used[l.ID] = true
		}
	}
	var errs []error
	for _, l := range cands {
		if used[l.ID] || !layerIDPattern().MatchString(l.ID) {
			continue
		}
		used[l.ID] = true // once
		mp := ls.path(l.ID)
		if err := unmountAt(mp); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(mp); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Checkpoint implements sandbox.Checkpointer (see layerStore): a
// running sandbox is frozen for the cut and its processes go on after it
// (livecut_linux.go); one without processes (its init not running) gets
// its init started again.
func (s *sbox) Checkpoint(ctx context.Context) (sandbox.Checkpoint, error) {
	ls := s.b.layers
	ls.mu.Lock()
	defer ls.mu.Unlock()
	st, err := keptState(s, "checkpoint")
	if err != nil {
		return sandbox.Checkpoint{}, err
	}
	paused := st.Cgroup.frozen()
	if !paused {
		if err := st.Cgroup.freeze(drainTimeout); err != nil {
			st.Cgroup.thaw()
			return sandbox.Checkpoint{}, s.goneOr(fmt.Errorf("checkpoint sandbox %s: freeze it for the cut: %w", s.id, err))
		}
	}
	// thawed as it was, whatever happens below (a paused sandbox stays
	// paused).
	defer func() {
		if !paused {
			st.Cgroup.thaw()
		}
	}()
	if st.Layered && upperEmpty(s.dir) {
		// Nothing written since its layers were cut (a checkpoint, a
		// rollback, or its fork): its files are those layers, which
		// the checkpoint names; no layer is frozen, nothing moved, and
		// a sandbox forked again and again does not pile up empty ones.
		return sameLayers(s, st)
	}
	dev, err := workspaceDev(s.dir)
	if err != nil {
		return sandbox.Checkpoint{}, s.goneOr(fmt.Errorf("checkpoint sandbox %s: %w", s.id, err))
	}
	swaps, err := s.liveCut(st.Cgroup, dev)
	if err != nil {
		return sandbox.Checkpoint{}, err
	}
	top, bytes, err := ls.freezeTop(s.dir, st)
	if err != nil {
		callOff(swaps)
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", s.id, err)
	}
	// From here on, the old workspace is the checkpoint's layer: it
	// stays read-only wherever it is held, whatever fails.
	layers := append([]layerRef{top}, st.Lowers...)
	id, err := newID("cp-", 6)
	if err != nil {
		keep(swaps)
		return sandbox.Checkpoint{}, err
	}
	rec := checkpointRecord{ID: id, Sandbox: s.id, Layers: layers, Bytes: bytes, Created: time.Now().UTC()}
	// The layer is recorded before anything else can fail: what the
	// sandbox had is in it, and a failure below leaves it to a rollback.
	if err := ls.save(rec); err != nil {
		keep(swaps)
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", s.id, err)
	}
	if len(swaps) == 0 {
		// No process: its init starts (again) on the new layers.
		if _, err := stopAll(s, st); err != nil {
			return sandbox.Checkpoint{}, err
		}
		if err := relayer(s, st, layers, paused); err != nil {
			return sandbox.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", s.id, err)
		}
	} else if err := s.layerLive(st, layers, swaps); err != nil {
		// Some namespace kept the old workspace (read-only): the
		// sandbox starts again on the new one, its processes from a
		// clean init, rather than run on two.
		s.b.log.Warn("checkpoint: the new workspace did not reach every process; the sandbox starts again", "sandbox", s.id, "err", err)
		if _, err := stopAll(s, st); err != nil {
			return sandbox.Checkpoint{}, err
		}
		if err := unmountLayered(s.dir); err != nil {
			return sandbox.Checkpoint{}, err
		}
		if err := relayer(s, st, layers, paused); err != nil {
			return sandbox.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", s.id, err)
		}
	}
	s.b.log.Info("sandbox checkpointed", "sandbox", s.id, "checkpoint", id, "bytes", bytes, "layers", len(layers), "namespaces", len(swaps))
	return sandbox.Checkpoint{ID: id, Bytes: bytes, Created: rec.Created}, nil
}

// upperEmpty says whether a layered sandbox's upper holds nothing: no
// file written, none deleted (a whiteout is an entry), since its layers
// were cut. Its processes are frozen.
func upperEmpty(dir string) bool {
	f, err := os.Open(filepath.Join(dir, dirUpper, upperDir))
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	return len(names) == 0 && errors.Is(err, io.EOF)
}

// sameLayers records a checkpoint of a sandbox whose files are its
// layers (upperEmpty): the checkpoint is of them, of no bytes of its
// own. The caller holds the layers' lock.
func sameLayers(s *sbox, st sandboxState) (sandbox.Checkpoint, error) {
	id, err := newID("cp-", 6)
	if err != nil {
		return sandbox.Checkpoint{}, err
	}
	rec := checkpointRecord{ID: id, Sandbox: s.id, Layers: st.Lowers, Created: time.Now().UTC()}
	if err := s.b.layers.save(rec); err != nil {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", s.id, err)
	}
	s.b.log.Info("sandbox checkpointed", "sandbox", s.id, "checkpoint", id, "bytes", 0, "layers", len(st.Lowers), "unchanged", true)
	return sandbox.Checkpoint{ID: id, Created: rec.Created}, nil
}

// layerLive mounts a fresh upper over layers on the host, records them
// as the sandbox's, and hands the new workspace to the sandbox's mount
// namespaces, its processes frozen and going on after it.
func (s *sbox) layerLive(st sandboxState, layers []layerRef, swaps []*swap) error {
	// Recorded first: a gc running after a failure below keeps them.
	st.Layered, st.Lowers = true, layers
	if err := writeJSONAtomic(s.path(fileState), st); err != nil {
		keep(swaps)
		return err
	}
	s.stMu.Lock()
	s.st = &st
	s.stMu.Unlock()
	if err := s.b.layers.mountLayers(s.dir, st, layers); err != nil {
		keep(swaps)
		return err
	}
	return swapIn(swaps, s.path(dirWorkspace))
}

// Rollback implements sandbox.Checkpointer: the sandbox's upper (what it
// wrote since) is dropped, a fresh one mounted over the checkpoint's
// layers. Only the sandbox's own checkpoints are reachable.
func (s *sbox) Rollback(ctx context.Context, id string) error {
	ls := s.b.layers
	ls.mu.Lock()
	defer ls.mu.Unlock()
	rec, err := ls.record(id)
	if err != nil {
		return err
	}
	if rec.Sandbox != s.id {
		return fmt.Errorf("checkpoint %s is of sandbox %s, not of %s: a sandbox rolls back to its own checkpoints", id, rec.Sandbox, s.id)
	}
	st, err := keptState(s, "roll back")
	if err != nil {
		return err
	}
	frozen, err := stopAll(s, st)
	if err != nil {
		return err
	}
	old := st.Lowers
	if st.Layered {
		err = unmountLayered(s.dir)
	} else {
		err = unmountAt(s.path(dirWorkspace))
	}
	if err != nil {
		return fmt.Errorf("roll back sandbox %s: %w", s.id, err)
	}
	if err := relayer(s, st, rec.Layers, frozen); err != nil {
		return fmt.Errorf("roll back sandbox %s: %w", s.id, err)
	}
	if err := ls.gc(old); err != nil {
		s.b.log.Warn("free layers after a rollback", "sandbox", s.id, "err", err)
	}
	s.b.log.Info("sandbox rolled back", "sandbox", s.id, "checkpoint", id)
	return nil
}

// keptState reads the state of a sandbox whose files can be checkpointed.
func keptState(s *sbox, what string) (sandboxState, error) {
	// From the disk: what sbox.state keeps from before a checkpoint (of
	// another sbox of the same sandbox, too) has its layers of then.
	st, err := s.b.state(s.dir, s.id)
	if err != nil {
		return st, s.goneOr(fmt.Errorf("%s: %w", what, err))
	}
	if !st.Multi || !st.Init {
		return st, fmt.Errorf("%s: sandbox %s is not a kept sandbox (one command only): only kept sandboxes have checkpoints", what, s.id)
	}
	return st, nil
}

// stopAll ends every process of a kept sandbox (its init, and with it
// its commands, whose shims record their ends) and waits for them to
// be gone; frozen says whether it was paused.
func stopAll(s *sbox, st sandboxState) (frozen bool, err error) {
	frozen = st.Cgroup.frozen()
	if err := killSandbox(s.dir, st.Cgroup); err != nil {
		return frozen, err
	}
	if err := st.Cgroup.waitEmpty(drainTimeout); err != nil {
		return frozen, err
	}
	s.b.waitShim(s.id, s.dir, drainTimeout)
	ents, _ := os.ReadDir(s.path(dirExecs))
	for _, e := range ents {
		s.b.waitShim(s.id, filepath.Join(s.dir, dirExecs, e.Name()), drainTimeout)
	}
	return frozen, nil
}

// relayer mounts a fresh upper over layers at the workspace, records
// them as the sandbox's, and starts its init again (paused, if it was).
func relayer(s *sbox, st sandboxState, layers []layerRef, frozen bool) error {
	// Recorded first: a gc running after a failure below keeps them.
	st.Layered, st.Lowers = true, layers
	if err := writeJSONAtomic(s.path(fileState), st); err != nil {
		return err
	}
	s.stMu.Lock()
	s.st = &st
	s.stMu.Unlock()
	if err := s.b.layers.mountLayers(s.dir, st, layers); err != nil {
		return err
	}
	for _, f := range []string{fileKilled, fileExit, fileInitPID, fileShimPID} {
		if err := os.Remove(s.path(f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := s.b.shims.startKeeper(s.dir, st); err != nil {
		return fmt.Errorf("start its init again: %w", err)
	}
	if frozen {
		if err := st.Cgroup.freeze(5 * time.Second); err != nil {
			return fmt.Errorf("pause it again: %w", err)
		}
	}
	return nil
}

// DeleteCheckpoint implements sandbox.CheckpointKeeper.
func (b *Backend) DeleteCheckpoint(ctx context.Context, id string) error {
	if err := checkCheckpointID(id); err != nil {
		return err
	}
	return b.layers.delete(id)
}

// recordFork records a new sandbox (a fork) as standing on the layers
// of checkpoint from, with its first state (which it writes): under the
// layers' lock, so that no gc takes them between the read of the
// checkpoint and that record; from then on a gc keeps them, and Destroy
// frees them. Its workspace is mounted afterwards, outside the lock
// (mountLayers), so that N forks mount theirs at once.
func (ls *layerStore) recordFork(dir string, st *sandboxState, from string) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	rec, err := ls.record(from)
	if err != nil {
		return err
	}
	st.Layered, st.Lowers, st.From = true, rec.Layers, rec.ID
	return writeJSONAtomic(filepath.Join(dir, fileState), *st)
}
