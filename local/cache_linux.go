//go:build linux

package local

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// Caches (Spec.Caches) are directories under Config.CacheDir, one per
// project (the key the engine gives) and name: CacheDir/KEY/NAME. A
// sandbox that takes one records itself in CacheDir/KEY/NAME.lock (under
// flock, so that two servers sharing the directory agree); the cache is
// handed to the sandbox's job user (every entry chowned: each sandbox has
// host uids of its own) and becomes the lower layer of an overlay mounted
// in the sandbox directory at caches/NAME, which each command's init
// binds at /cache/NAME. The job never writes the cache itself: what it
// changes goes to the overlay's upper layer, on a tmpfs of the sandbox's
// own (cachelayers/, Spec.DiskBytes for all its caches, its pages charged
// to the job's memory as /workspace's are), so a job that writes past it
// gets ENOSPC and the host's disk never fills while the job runs (a bind
// mount of the cache let a job of disk 256M write 1.5 GiB to the host's
// root; project quotas would need prjquota, which a root file system
// seldom has; a loop image per cache would need mkfs and loop devices).
// When the sandbox is destroyed its changes are written back into the
// cache (mergeLayer: the last writer wins, per file), unless the cache
// would then pass Config.CacheMaxBytes or the file system keep less free
// than twice what is written (then the cache stays as it was, and the log
// says so); the cache is measured (CacheDir/KEY/NAME.json: size, last
// use), released, and the least recently used caches are removed while
// all of them hold more than Config.CacheMaxBytes. A sandbox that finds a
// cache taken by another sandbox that still exists gets an empty tmpfs of
// its own there instead (charged to its memory, as /tmp is), and its
// Progress and its command's Exit.CacheMisses say so: one writer at a
// time, and no job waits for another. A kept sandbox takes its caches
// the same way, but for each command's run rather than for its life
// (cachecmd_linux.go).

// cacheMeta is a cache's record, written when a sandbox releases it.
type cacheMeta struct {
	Bytes int64     `json:"bytes"`
	Used  time.Time `json:"used"`
	// Owner is the principal whose cache it is (sandbox.Cache.Owner).
	Owner string `json:"owner,omitempty"`
	// NotSaved says why the last run's changes were not written back
	// (its owner's disk quota), for the next run that takes the cache to
	// tell its job (a CacheMiss): the run that made them has ended by
	// then, and its principal would learn it nowhere else.
	NotSaved string `json:"notSaved,omitempty"`
}

var (
	cacheKeyRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{16,64}$`) })
	cacheNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9]{0,31}$`) })
)

// DefaultCacheMaxBytes bounds every cache together when
// Config.CacheMaxBytes is 0.
const DefaultCacheMaxBytes = 10 << 30

// caches keeps the caches of this backend's sandboxes (see above).
type caches struct {
	dir string // Config.CacheDir, "" for none
	max int64  // Config.CacheMaxBytes
	// uses are kept sandboxes' commands' (cachecmd_linux.go).
	uses cacheUses
	// sandboxes is the backend's directory: a cache held by a sandbox
	// whose directory is gone there is free again.
	sandboxes string
	// ended says whether the sandbox id's one command has ended: a
	// cache it holds then comes back as soon as it is destroyed. Nil:
	// a cache in use is never waited for.
	ended func(id string) bool
	log   *slog.Logger
}

// handBackWait bounds how long a sandbox waits for a cache whose holder
// has ended and is being destroyed (its changes written back): the
// engine stores a job's end before it destroys its sandbox, so a job
// submitted as soon as the previous one is reported ended would
// otherwise find the cache in use and start with an empty one.
const (
	handBackWait = 10 * time.Second
	handBackPoll = 20 * time.Millisecond
)

func (cs *caches) path(c sandbox.Cache) string {
	return filepath.Join(cs.dir, c.Key, c.Name)
}

func checkCaches(caches []sandbox.Cache) error {
	for i, c := range caches {
		if !cacheKeyRE().MatchString(c.Key) || !cacheNameRE().MatchString(c.Name) {
			return fmt.Errorf("cache %q (key %q): a name of lower-case letters and digits, a key of hex digits", c.Name, c.Key)
		}
		if slices.IndexFunc(caches, func(o sandbox.Cache) bool { return o.Name == c.Name }) != i {
			return fmt.Errorf("cache %q is asked for twice", c.Name)
		}
	}
	return nil
}

// attachCaches gives a new sandbox its caches (see above); hostJob is its
// job's host uid. It returns what it mounted, for the sandbox's state.
func (cs *caches) attach(id, dir string, spec sandbox.Spec, hostJob int) ([]cacheMount, error) {
	if len(spec.Caches) == 0 {
		return nil, nil
	}
	if cs.dir == "" {
		return nil, errors.New("caches are not kept by this backend (Config.CacheDir is not set)")
	}
	if err := checkCaches(spec.Caches); err != nil {
		return nil, err
	}
	top := filepath.Join(dir, dirCaches)
	if err := os.Mkdir(top, 0o755); err != nil {
		return nil, err
	}
	var out []cacheMount
	if spec.MultiExec {
		// A kept sandbox's caches are its commands' (cachecmd_linux.go):
		// none is taken now, but their layers' tmpfs is made.
		for _, c := range spec.Caches {
			out = append(out, cacheMount{Name: c.Name, Key: c.Key, Shared: true, Layer: true, PerCommand: true, Owner: c.Owner, Limit: c.Limit})
		}
		return out, mountLayers(filepath.Join(dir, dirCacheLayers), spec.DiskBytes)
	}
	for _, c := range spec.Caches {
		mp := filepath.Join(top, c.Name)
		if err := os.Mkdir(mp, 0o755); err != nil {
			return out, err
		}
		holder, notSaved, err := cs.take(c, id)
		if err != nil {
			return out, fmt.Errorf("cache %s: %w", c.Name, err)
		}
		if holder != "" {
			opts := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", min(spec.DiskBytes, maxTmpBytes), hostJob, hostJob)
			if err := unix.Mount("tmpfs", mp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
				return out, fmt.Errorf("cache %s: mount an empty one: %w", c.Name, err)
			}
			if err := unix.Mount("", mp, "", unix.MS_PRIVATE, ""); err != nil {
				return out, fmt.Errorf("cache %s: %w", c.Name, err)
			}
			out = append(out, cacheMount{Name: c.Name, Key: c.Key, Owner: c.Owner, Limit: c.Limit, Busy: holder})
			spec.Step(fmt.Sprintf("cache %s is in use by sandbox %s: this job has an empty one of its own", c.Name, holder))
			continue
		}
		out = append(out, cacheMount{Name: c.Name, Key: c.Key, Shared: true, Layer: true, Owner: c.Owner, Limit: c.Limit, NotSaved: notSaved})
		if notSaved != "" {
			spec.Step(fmt.Sprintf("cache %s: %s", c.Name, notSaved))
		}
		host := cs.path(c)
		if err := os.MkdirAll(host, 0o755); err != nil {
			return out, fmt.Errorf("cache %s: %w", c.Name, err)
		}
		start := time.Now()
		n, err := chownTree(host, hostJob)
		if err != nil {
			return out, fmt.Errorf("cache %s: hand it to the job's user: %w", c.Name, err)
		}
		cs.log.Debug("cache handed over", "sandbox", id, "cache", c.Name, "entries", n, "took", time.Since(start))
		if err := mountLayered(host, mp, filepath.Join(dir, dirCacheLayers), c.Name, spec.DiskBytes, hostJob); err != nil {
			return out, fmt.Errorf("cache %s: %w", c.Name, err)
		}
	}
	return out, nil
}

// mountLayered mounts at mp an overlay of the cache host (its lower
// layer, read-only to it) and an upper layer in layers/name, on the
// layers' tmpfs (of size bytes, made with the first cache), owned by
// hostJob, the job's host uid.
func mountLayered(host, mp, layers, name string, bytes int64, hostJob int) error {
	for _, p := range []string{host, layers} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("the path %s has a ',', ':' or '\\', which an overlay's options cannot carry", p)
		}
	}
	if err := mountLayers(layers, bytes); err != nil {
		return err
	}
	upper, work := filepath.Join(layers, name, "upper"), filepath.Join(layers, name, "work")
	for _, d := range []string{filepath.Dir(upper), upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// The overlay's root is its upper directory: the job's, as the cache is.
	if err := os.Chown(upper, hostJob, hostJob); err != nil {
		return err
	}
	if err := os.Chmod(upper, 0o755); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", host, upper, work)
	if err := unix.Mount("overlay", mp, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount its overlay: %w", err)
	}
	if err := unix.Mount("", mp, "", unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	return nil
}

// mountLayers mounts the caches' layers' tmpfs (of size bytes) at
// layers, unless it is there.
func mountLayers(layers string, bytes int64) error {
	if err := os.Mkdir(layers, 0o700); errors.Is(err, os.ErrExist) {
		return nil
	} else if err != nil {
		return err
	}
	opts := fmt.Sprintf("size=%d,mode=0700", bytes)
	if err := unix.Mount("tmpfs", layers, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the layers' tmpfs: %w", err)
	}
	if err := unix.Mount("", layers, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the layers' tmpfs private: %w", err)
	}
	return nil
}

// take records sandbox id as the cache's writer, unless another
// sandbox that still exists holds it: then it returns that one's id.
// Taken, it returns why the last run's changes were not saved, if they
// were not (cacheMeta.NotSaved).
func (cs *caches) take(c sandbox.Cache, id string) (holder, notSaved string, err error) {
	deadline := time.Now().Add(handBackWait)
	for {
		holder, notSaved, err = cs.takeOnce(c, id)
		if err != nil || holder == "" || cs.ended == nil || !cs.ended(holder) || time.Now().After(deadline) {
			return holder, notSaved, err
		}
		time.Sleep(handBackPoll) // the holder's Destroy may be another process's: no event to wait on
	}
}

// takeOnce is take without waiting for a holder that has ended.
func (cs *caches) takeOnce(c sandbox.Cache, id string) (holder, notSaved string, err error) {
	if err := os.MkdirAll(filepath.Join(cs.dir, c.Key), 0o700); err != nil {
		return "", "", err
	}
	err = cs.withLock(c, func(f *os.File, cur string) error {
		if cur != "" && cur != id && idPattern().MatchString(cur) {
			if _, err := os.Lstat(filepath.Join(cs.sandboxes, cur)); err == nil {
				holder = cur
				return nil
			}
			// Its sandbox is gone without releasing it (a crash): stale.
		}
		var meta cacheMeta
		if readJSON(cs.path(c)+".json", &meta) == nil {
			notSaved = meta.NotSaved
		}
		return rewrite(f, id)
	})
	return holder, notSaved, err
}

// withLock runs fn with the cache's lock file, under flock, and its
// content (the holder's sandbox id, "" when free).
func (cs *caches) withLock(c sandbox.Cache, fn func(f *os.File, holder string) error) error {
	f, err := os.OpenFile(cs.path(c)+".lock", os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	buf := make([]byte, 64)
	n, _ := f.ReadAt(buf, 0)
	return fn(f, strings.TrimSpace(string(buf[:n])))
}

func rewrite(f *os.File, s string) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(s), 0)
	return err
}

// chownTree gives every entry under dir (dir too) to uid, without
// following links; it returns how many there were.
func chownTree(dir string, uid int) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		return unix.Lchown(p, uid, uid)
	})
	return n, err
}

// treeSize adds up the sizes of the regular files under dir.
func treeSize(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total
}

// release writes back what the sandbox at dir changed in its caches (its
// overlays are unmounted), measures and frees them, then keeps all of
// them under the cap; last it unmounts the sandbox's layers. It returns
// what it could not unmount.
func (cs *caches) release(id, dir, jobID string, caches []cacheMount) error {
	layers := filepath.Join(dir, dirCacheLayers)
	if cs.dir == "" {
		return unmountAt(layers)
	}
	released := false
	for _, m := range caches {
		if !m.Shared {
			continue
		}
		// (A kept sandbox's is held only while one of its commands runs:
		// by it here when this server did not see that command end.)
		upper := ""
		if m.Layer {
			upper = filepath.Join(layers, m.Name, "upper")
		}
		run := "job " + jobID
		if m.PerCommand || jobID == "" {
			run = "a command in kept sandbox " + id
		}
		if cs.give(id, run, sandbox.Cache{Name: m.Name, Key: m.Key, Owner: m.Owner, Limit: m.Limit}, upper) {
			released = true
		}
	}
	cs.uses.forget(id)
	if released {
		cs.evict()
	}
	return unmountAt(layers)
}

// writeBack writes the changes of sandbox id in cache c (the upper layer
// of its overlay) into the cache, within the cap and the file system's
// room (see the top of this file). Changes its owner's disk quota has no
// room for are not written back: it returns why, naming run (what made
// them: "job job-…"), for the cache's next run to tell (cacheMeta).
func (cs *caches) writeBack(id, run string, c sandbox.Cache, upper string) (notSaved string) {
	changed := treeSize(upper)
	host := cs.path(c)
	var fs unix.Statfs_t
	free := int64(-1)
	if unix.Statfs(host, &fs) == nil {
		free = int64(fs.Bavail) * fs.Bsize
	}
	// What the cache held at its last release (nothing changes it
	// while a sandbox holds it), or measured when there is no record.
	var meta cacheMeta
	have := int64(0)
	if readJSON(host+".json", &meta) == nil {
		have = meta.Bytes
	} else {
		have = treeSize(host)
	}
	if have+changed > cs.max || (free >= 0 && free < 2*changed) {
		cs.log.Warn("cache: the job's changes are not kept", "sandbox", id, "cache", c.Name, "key", c.Key,
			"changed", changed, "cache bytes", have, "cap", cs.max, "free", free)
		return ""
	}
	if c.Limit > 0 && changed > 0 {
		// The owner's disk quota: its other caches, this one, and what
		// the job added (its checkpoints were taken off the limit).
		others := cs.ownerBytes(c.Owner, c)
		if others+have+changed > c.Limit {
			cs.log.Warn("cache: the job's changes are not kept: over the disk quota of its principal (DELEGATE_QUOTA_DISK, less its checkpoints)",
				"sandbox", id, "cache", c.Name, "key", c.Key, "principal", c.Owner,
				"caches bytes", others+have, "changed", changed, "quota bytes", c.Limit)
			return fmt.Sprintf("the changes %s made were not saved in it: %v", run, &delegate.QuotaError{
				Principal: c.Owner, Quota: "disk of caches (what its checkpoints leave of the disk quota)", Setting: "DELEGATE_QUOTA_DISK",
				Use: delegate.FormatBytes(others + have), Asked: delegate.FormatBytes(changed), Limit: delegate.FormatBytes(c.Limit),
				Free: "delete a checkpoint (sandbox_checkpoint action delete), release a kept sandbox, or leave less in the cache"})
		}
	}
	lower, err := unix.Open(host, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		cs.log.Warn("cache: write back", "sandbox", id, "cache", c.Name, "err", err)
		return ""
	}
	defer unix.Close(lower)
	start := time.Now()
	if err := mergeLayer(upper, lower); err != nil {
		cs.log.Warn("cache: write back", "sandbox", id, "cache", c.Name, "err", err)
		return ""
	}
	cs.log.Debug("cache written back", "sandbox", id, "cache", c.Name, "bytes", changed, "took", time.Since(start))
	return ""
}

// CacheBytes implements sandbox.CacheMeter.
func (b *Backend) CacheBytes(owner string) (int64, error) {
	if b.caches.dir == "" {
		return 0, nil
	}
	return b.caches.ownerBytes(owner, sandbox.Cache{}), nil
}

// ownerBytes is what owner's caches hold, as last released, but except's.
func (cs *caches) ownerBytes(owner string, except sandbox.Cache) int64 {
	metas, _ := filepath.Glob(filepath.Join(cs.dir, "*", "*.json"))
	var total int64
	for _, p := range metas {
		var m cacheMeta
		if readJSON(p, &m) != nil || m.Owner != owner || p == cs.path(except)+".json" {
			continue
		}
		total += m.Bytes
	}
	return total
}

// evict removes the least recently used caches that no sandbox
// holds while all of them hold more than the cap.
func (cs *caches) evict() {
	metas, _ := filepath.Glob(filepath.Join(cs.dir, "*", "*.json"))
	type entry struct {
		c    sandbox.Cache
		meta cacheMeta
	}
	var all []entry
	var total int64
	for _, p := range metas {
		var m cacheMeta
		if readJSON(p, &m) != nil {
			continue
		}
		c := sandbox.Cache{Key: filepath.Base(filepath.Dir(p)), Name: strings.TrimSuffix(filepath.Base(p), ".json")}
		all = append(all, entry{c, m})
		total += m.Bytes
	}
	slices.SortFunc(all, func(a, b entry) int { return a.meta.Used.Compare(b.meta.Used) })
	for _, e := range all {
		if total <= cs.max {
			return
		}
		err := cs.withLock(e.c, func(f *os.File, holder string) error {
			if holder != "" {
				return errors.New("in use")
			}
			if err := os.RemoveAll(cs.path(e.c)); err != nil {
				return err
			}
			return os.Remove(cs.path(e.c) + ".json")
		})
		if err == nil {
			total -= e.meta.Bytes
			cs.log.Info("cache evicted", "cache", e.c.Name, "key", e.c.Key, "bytes", e.meta.Bytes, "last used", e.meta.Used)
		}
	}
}

// unmountCaches unmounts the caches bound in a sandbox directory.
func unmountCaches(dir string) error {
	ents, err := os.ReadDir(filepath.Join(dir, dirCaches))
	if err != nil {
		return nil // none
	}
	for _, e := range ents {
		if err := unmountAt(filepath.Join(dir, dirCaches, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// removeCacheDirs removes the (unmounted, empty) mount points of caches,
// and their layers' mount point; rmdir never removes what a mount still
// holds.
func removeCacheDirs(dir string) {
	unix.Rmdir(filepath.Join(dir, dirCacheLayers))
	top := filepath.Join(dir, dirCaches)
	ents, _ := os.ReadDir(top)
	for _, e := range ents {
		unix.Rmdir(filepath.Join(top, e.Name()))
	}
	unix.Rmdir(top)
}
