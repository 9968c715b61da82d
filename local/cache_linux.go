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
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// Caches (Spec.Caches) are directories under Config.CacheDir, one per
// project (the key the engine gives) and name: CacheDir/KEY/NAME. A
// sandbox that takes one records itself in CacheDir/KEY/NAME.lock (under
// flock, so that two servers sharing the directory agree); the cache is
// handed to the sandbox's job user (every entry chowned: each sandbox has
// host uids of its own) and bound into the sandbox directory at
// caches/NAME, which each command's init binds at /cache/NAME. A sandbox
// that finds a cache taken by another sandbox that still exists gets an
// empty tmpfs of its own there instead (charged to its memory, as /tmp
// is), and its Progress says so: one writer at a time, and no job waits
// for another. When the sandbox is destroyed the cache is measured
// (CacheDir/KEY/NAME.json: size, last use), released, and the least
// recently used caches are removed while all of them hold more than
// Config.CacheMaxBytes.

// cacheMeta is a cache's record, written when a sandbox releases it.
type cacheMeta struct {
	Bytes int64     `json:"bytes"`
	Used  time.Time `json:"used"`
}

var (
	cacheKeyRE  = regexp.MustCompile(`^[0-9a-f]{16,64}$`)
	cacheNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,31}$`)
)

// DefaultCacheMaxBytes bounds every cache together when
// Config.CacheMaxBytes is 0.
const DefaultCacheMaxBytes = 10 << 30

// caches keeps the caches of this backend's sandboxes (see above).
type caches struct {
	dir string // Config.CacheDir, "" for none
	max int64  // Config.CacheMaxBytes
	// sandboxes is the backend's directory: a cache held by a sandbox
	// whose directory is gone there is free again.
	sandboxes string
	log       *slog.Logger
}

func (cs *caches) path(c sandbox.Cache) string {
	return filepath.Join(cs.dir, c.Key, c.Name)
}

func checkCaches(caches []sandbox.Cache) error {
	for i, c := range caches {
		if !cacheKeyRE.MatchString(c.Key) || !cacheNameRE.MatchString(c.Name) {
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
	for _, c := range spec.Caches {
		mp := filepath.Join(top, c.Name)
		if err := os.Mkdir(mp, 0o755); err != nil {
			return out, err
		}
		holder, err := cs.take(c, id)
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
			out = append(out, cacheMount{Name: c.Name, Key: c.Key})
			spec.Step(fmt.Sprintf("cache %s is in use by sandbox %s: this job has an empty one of its own", c.Name, holder))
			continue
		}
		out = append(out, cacheMount{Name: c.Name, Key: c.Key, Shared: true})
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
		if err := unix.Mount(host, mp, "", unix.MS_BIND, ""); err != nil {
			return out, fmt.Errorf("cache %s: bind: %w", c.Name, err)
		}
		if err := unix.Mount("", mp, "", unix.MS_PRIVATE, ""); err != nil {
			return out, fmt.Errorf("cache %s: %w", c.Name, err)
		}
		if err := unix.Mount("", mp, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return out, fmt.Errorf("cache %s: nosuid, nodev: %w", c.Name, err)
		}
	}
	return out, nil
}

// take records sandbox id as the cache's writer, unless another
// sandbox that still exists holds it: then it returns that one's id.
func (cs *caches) take(c sandbox.Cache, id string) (holder string, err error) {
	if err := os.MkdirAll(filepath.Join(cs.dir, c.Key), 0o700); err != nil {
		return "", err
	}
	err = cs.withLock(c, func(f *os.File, cur string) error {
		if cur != "" && cur != id && idPattern.MatchString(cur) {
			if _, err := os.Lstat(filepath.Join(cs.sandboxes, cur)); err == nil {
				holder = cur
				return nil
			}
			// Its sandbox is gone without releasing it (a crash): stale.
		}
		return rewrite(f, id)
	})
	return holder, err
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

// release measures and frees the caches a destroyed sandbox held
// (its mounts are gone), then keeps all of them under the cap.
func (cs *caches) release(id string, caches []cacheMount) {
	if cs.dir == "" {
		return
	}
	released := false
	for _, m := range caches {
		if !m.Shared {
			continue
		}
		c := sandbox.Cache{Name: m.Name, Key: m.Key}
		err := cs.withLock(c, func(f *os.File, holder string) error {
			if holder != id {
				return nil // taken over already (this sandbox was thought gone)
			}
			meta := cacheMeta{Bytes: treeSize(cs.path(c)), Used: time.Now().UTC()}
			if err := writeJSONAtomic(cs.path(c)+".json", meta); err != nil {
				return err
			}
			released = true
			return rewrite(f, "")
		})
		if err != nil {
			cs.log.Warn("release cache", "sandbox", id, "cache", c.Name, "key", c.Key, "err", err)
		}
	}
	if released {
		cs.evict()
	}
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

// removeCacheDirs removes the (unmounted, empty) mount points of caches;
// rmdir never removes what a mount still holds.
func removeCacheDirs(dir string) {
	top := filepath.Join(dir, dirCaches)
	ents, _ := os.ReadDir(top)
	for _, e := range ents {
		unix.Rmdir(filepath.Join(top, e.Name()))
	}
	unix.Rmdir(top)
}
