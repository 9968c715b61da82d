//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// A kept sandbox's caches are its commands', not its own (issue 34, item
// 5: a kept sandbox that held its cache for its whole life, 24 h by
// default, left every other job of its project an empty one). Its init
// has at /cache a small read-only tmpfs of mount points, one per cache,
// shared (in the propagation sense) with the mount namespace of each
// command, which is a copy of init's (rootOps). When a command starts
// and none of the sandbox's commands runs, the server takes each cache
// as a sandbox's job takes it (cache_linux.go: the lock, the overlay
// whose upper layer is on the sandbox's cache layers' tmpfs, or an empty
// tmpfs when another sandbox holds it), makes the mount detached
// (fsmount) and moves it into init's mount namespace at /cache/NAME,
// from where it reaches every command's. When the last of the commands
// running ends, the server unmounts it there, writes the changes back
// into the cache (the last writer wins, per file) and releases it: the
// cache is held for the sandbox's commands' runs, never between them.
// What a command leaves running in the background keeps only what it
// had open in the cache.

// cacheUses are the kept sandboxes' commands' holds of their caches,
// by sandbox id.
type cacheUses struct {
	mu sync.Mutex
	m  map[string]*cacheUse
}

// cacheUse is one kept sandbox's: how many of its commands run with its
// caches mounted, and what those commands did not get.
type cacheUse struct {
	mu     sync.Mutex
	n      int
	misses []sandbox.CacheMiss
}

func (u *cacheUses) get(id string) *cacheUse {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]*cacheUse{}
	}
	cu := u.m[id]
	if cu == nil {
		cu = &cacheUse{}
		u.m[id] = cu
	}
	return cu
}

func (u *cacheUses) forget(id string) {
	u.mu.Lock()
	delete(u.m, id)
	u.mu.Unlock()
}

// perCommand says whether the sandbox's caches are its commands'.
func perCommand(st sandboxState) bool {
	for _, m := range st.Caches {
		if m.PerCommand {
			return true
		}
	}
	return false
}

// enter gives a command of the kept sandbox id (in dir) its caches: they
// are mounted unless another of its commands has them already. It
// returns the caches the command has an empty one of instead, and why.
func (cs *caches) enter(id, dir string, st sandboxState) ([]sandbox.CacheMiss, error) {
	if !perCommand(st) {
		return nil, nil
	}
	u := cs.uses.get(id)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n > 0 {
		u.n++
		return u.misses, nil
	}
	ns, err := initMountNS(dir)
	if err != nil {
		return nil, fmt.Errorf("caches: %w", err)
	}
	defer unix.Close(ns)
	var misses []sandbox.CacheMiss
	for _, m := range st.Caches {
		if !m.PerCommand {
			continue
		}
		miss, err := cs.mountFor(id, dir, st, m, ns)
		if err != nil {
			cs.unmountAll(id, dir, st, ns)
			return nil, fmt.Errorf("cache %s: %w", m.Name, err)
		}
		if miss != nil {
			misses = append(misses, *miss)
		}
	}
	u.n, u.misses = 1, misses
	return misses, nil
}

// leave is a command's end: the last of the sandbox's commands running
// gives its caches back.
func (cs *caches) leave(id, dir string, st sandboxState) {
	if !perCommand(st) {
		return
	}
	u := cs.uses.get(id)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n--; u.n > 0 {
		return
	}
	u.n, u.misses = 0, nil
	ns, err := initMountNS(dir)
	if err != nil {
		ns = -1 // init has ended: its mounts went with it
	} else {
		defer unix.Close(ns)
	}
	cs.unmountAll(id, dir, st, ns)
}

// mountFor mounts cache m for the sandbox's commands in init's mount
// namespace ns. Its layer directory (cachelayers/NAME) says that it is
// mounted: one there already is a mount made for a command an earlier
// server started, which this command shares.
func (cs *caches) mountFor(id, dir string, st sandboxState, m cacheMount, ns int) (*sandbox.CacheMiss, error) {
	layer := filepath.Join(dir, dirCacheLayers, m.Name)
	if _, err := os.Lstat(layer); err == nil {
		return nil, nil
	}
	c := sandbox.Cache{Name: m.Name, Key: m.Key, Owner: m.Owner, Limit: m.Limit}
	holder, notSaved, err := cs.take(c, id)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(layer, 0o700); err != nil {
		return nil, err
	}
	hostJob := int(st.hostBase()) + jobID
	var miss *sandbox.CacheMiss
	var fd int
	if holder != "" {
		miss = &sandbox.CacheMiss{Name: m.Name, Reason: fmt.Sprintf("in use by sandbox %s: this command had an empty one of its own", holder)}
		fd, err = detachedMount("tmpfs", map[string]string{"size": strconv.FormatInt(min(st.DiskBytes, maxTmpBytes), 10),
			"mode": "0755", "uid": strconv.Itoa(hostJob), "gid": strconv.Itoa(hostJob)})
	} else {
		if notSaved != "" {
			miss = &sandbox.CacheMiss{Name: m.Name, Reason: notSaved}
		}
		host := cs.path(c)
		if err := os.MkdirAll(host, 0o755); err != nil {
			return nil, err
		}
		if _, err := chownTree(host, hostJob); err != nil {
			return nil, fmt.Errorf("hand it to the job's user: %w", err)
		}
		upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, err
			}
		}
		// The overlay's root is its upper directory: the job's, as the cache is.
		if err := os.Chown(upper, hostJob, hostJob); err != nil {
			return nil, err
		}
		if err := os.Chmod(upper, 0o755); err != nil {
			return nil, err
		}
		fd, err = detachedMount("overlay", map[string]string{"lowerdir": host, "upperdir": upper, "workdir": work})
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return miss, moveInto(ns, fd, "/cache/"+m.Name)
}

// unmountAll unmounts the sandbox's caches in init's mount namespace ns
// (-1: it is gone), writes back what its commands changed in those they
// held, and releases them.
func (cs *caches) unmountAll(id, dir string, st sandboxState, ns int) {
	released := false
	for _, m := range st.Caches {
		layer := filepath.Join(dir, dirCacheLayers, m.Name)
		if _, err := os.Lstat(layer); !m.PerCommand || err != nil {
			continue
		}
		if ns >= 0 {
			if err := unmountIn(ns, "/cache/"+m.Name); err != nil {
				cs.log.Warn("cache: unmount it after the command", "sandbox", id, "cache", m.Name, "err", err)
			}
		}
		if cs.give(id, "a command in kept sandbox "+id, sandbox.Cache{Name: m.Name, Key: m.Key, Owner: m.Owner, Limit: m.Limit}, filepath.Join(layer, "upper")) {
			released = true
		}
		if err := os.RemoveAll(layer); err != nil {
			cs.log.Warn("cache: remove the command's layer", "sandbox", id, "cache", m.Name, "err", err)
		}
	}
	if released {
		cs.evict()
	}
}

// give writes back the changes in upper (when there is one) of sandbox
// id, which holds cache c, measures the cache and frees it; it says
// whether id held it. run names what made the changes, for the next
// run's note when they are not saved (writeBack).
func (cs *caches) give(id, run string, c sandbox.Cache, upper string) bool {
	held := false
	err := cs.withLock(c, func(f *os.File, holder string) error {
		if holder != id {
			return nil // another's (this sandbox had an empty one), or taken over already
		}
		held = true
		notSaved := ""
		if _, err := os.Lstat(upper); upper != "" && err == nil {
			notSaved = cs.writeBack(id, run, c, upper)
		}
		meta := cacheMeta{Bytes: treeSize(cs.path(c)), Used: time.Now().UTC(), Owner: c.Owner, NotSaved: notSaved}
		if err := writeJSONAtomic(cs.path(c)+".json", meta); err != nil {
			return err
		}
		return rewrite(f, "")
	})
	if err != nil {
		cs.log.Warn("release cache", "sandbox", id, "cache", c.Name, "key", c.Key, "err", err)
	}
	return held
}

// initMountNS opens the mount namespace of the kept sandbox's init (in
// dir), once it has checked that the pid recorded is still its
// supervisor's child (pids are reused).
func initMountNS(dir string) (int, error) {
	shim, alive := shimAlive(dir)
	if !alive {
		return -1, errors.New("the sandbox's init has ended")
	}
	pid, err := readPID(filepath.Join(dir, fileInitPID))
	if err != nil {
		return -1, err
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the sandbox's init's mount namespace: %w", err)
	}
	// Checked after the open: the namespace open is init's if the pid
	// is still the supervisor's child now.
	if parentOf(pid) != shim {
		unix.Close(ns)
		return -1, errors.New("the sandbox's init has ended")
	}
	return ns, nil
}

// detachedMount makes a mount of fstype, with options, attached nowhere
// yet (nosuid, nodev), and returns its descriptor.
func detachedMount(fstype string, opts map[string]string) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for k, v := range opts {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("%s: %s=%s: %w", fstype, k, v, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("%s: create: %w", fstype, err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return fd, nil
}

// moveInto attaches the detached mount fd at path in the mount namespace
// ns; unmountIn unmounts what is mounted at path there (nothing: no
// error). Each runs on a thread of its own that enters ns and is then
// thrown away (the Go runtime ends a thread locked when its goroutine
// returns): setns of a mount namespace changes the thread's root, which
// no other goroutine may then see.
func moveInto(ns, fd int, path string) error {
	return inMountNS(ns, func() error {
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount it at %s in the sandbox: %w", path, err)
		}
		return nil
	})
}

func unmountIn(ns int, path string) error {
	return inMountNS(ns, func() error {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	})
}

func inMountNS(ns int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if unix.Gettid() == unix.Getpid() {
			// The main thread never leaves the server's namespaces: the
			// runtime keeps it when its goroutine ends, and /proc/self is
			// its view. Held here, it lets another thread do it.
			errc <- inMountNS(ns, fn)
			runtime.UnlockOSThread()
			return
		}
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare the thread's root: %w", err)
			return
		}
		if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("enter the sandbox's mount namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// busyMisses are the caches a sandbox's one command has an empty one of
// (another sandbox held them when it was made), or has without the last
// run's changes (its owner's disk quota had no room for them), and why.
func busyMisses(st sandboxState) []sandbox.CacheMiss {
	var out []sandbox.CacheMiss
	for _, m := range st.Caches {
		if m.Busy != "" {
			out = append(out, sandbox.CacheMiss{Name: m.Name, Reason: fmt.Sprintf("in use by sandbox %s: this job had an empty one of its own", m.Busy)})
		} else if m.NotSaved != "" {
			out = append(out, sandbox.CacheMiss{Name: m.Name, Reason: m.NotSaved})
		}
	}
	return out
}
