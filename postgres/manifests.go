package postgres

import (
	"sync"

	"github.com/delegate-dev/delegate"
)

// The manifest cache holds at most manifestCacheBytes of manifests (as
// stored, in JSON), none over manifestCacheMax: a task may be 256 KiB and
// its env 32 MiB, and those are rarely read again. (The SQLite store's
// cache, the same reasons.)
const (
	manifestCacheBytes = 16 << 20
	manifestCacheMax   = 64 << 10
)

// manifestCache keeps parsed manifests (without files) by job id. A
// manifest never changes once stored, so nothing is ever invalidated,
// whichever server stored it; when full, an arbitrary part is forgotten.
type manifestCache struct {
	mu    sync.Mutex
	m     map[string]cachedManifest
	bytes int
}

type cachedManifest struct {
	m         delegate.Manifest
	principal string // the job's
	size      int
}

// get returns job id's manifest if it is cached and reader ("" for all,
// see delegate.ReaderOf) may read it.
func (c *manifestCache) get(id, reader string) (delegate.Manifest, bool) {
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if !ok || reader != "" && e.principal != reader {
		return delegate.Manifest{}, false
	}
	return e.m.Clone(), true
}

// put keeps m, of a job of principal, whose stored JSON is size bytes.
func (c *manifestCache) put(id, principal string, m delegate.Manifest, size int) {
	if size > manifestCacheMax {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedManifest)
	}
	if old, ok := c.m[id]; ok {
		c.bytes -= old.size
	}
	for k, e := range c.m { // map order: an arbitrary victim
		if c.bytes+size <= manifestCacheBytes {
			break
		}
		delete(c.m, k)
		c.bytes -= e.size
	}
	c.m[id] = cachedManifest{m: m, principal: principal, size: size}
	c.bytes += size
}

// forget drops the manifests of jobs that no longer exist (pruned).
func (c *manifestCache) forget(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if e, ok := c.m[id]; ok {
			c.bytes -= e.size
			delete(c.m, id)
		}
	}
}
