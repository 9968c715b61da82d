package pvesim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// lockTable holds the simulator's locks: the flock(2) locks a node's
// processes take on files in /var/lock (PVE::Tools::lock_file_full: shared
// or exclusive, given up after a time-out) and pmxcfs's cluster-wide locks
// (PVE::Cluster cfs_lock). A waiter polls, like lock_file_full's blocking
// flock under an alarm; who gets a freed lock first is not defined, as with
// flock.
type lockTable struct {
	mu      sync.Mutex
	held    map[string]*lockState
	changed chan struct{} // closed and replaced whenever a lock is released
}

type lockState struct {
	exclusive bool
	shared    int
}

func newLockTable() *lockTable {
	return &lockTable{held: map[string]*lockState{}, changed: make(chan struct{})}
}

var errLockTimeout = errors.New("got timeout")

// acquire takes a lock, waiting at most timeout; the result releases it.
func (lt *lockTable) acquire(ctx context.Context, name string, shared bool, timeout time.Duration) (func(), error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		lt.mu.Lock()
		st := lt.held[name]
		if st == nil {
			st = &lockState{}
			lt.held[name] = st
		}
		free := !st.exclusive && (shared || st.shared == 0)
		if free {
			if shared {
				st.shared++
			} else {
				st.exclusive = true
			}
			lt.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { lt.release(name, shared) }) }, nil
		}
		wait := lt.changed
		lt.mu.Unlock()
		select {
		case <-wait:
		case <-deadline.C:
			return nil, errLockTimeout
		case <-ctx.Done():
			return nil, fmt.Errorf("interrupted by signal")
		}
	}
}

func (lt *lockTable) release(name string, shared bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	st := lt.held[name]
	if st == nil {
		return
	}
	if shared {
		st.shared--
	} else {
		st.exclusive = false
	}
	if !st.exclusive && st.shared <= 0 {
		delete(lt.held, name)
	}
	close(lt.changed)
	lt.changed = make(chan struct{})
}

// Lock time-outs, as PVE sets them: a clone's locks on its source and on
// the new VM's config wait 1 s (qemu-server clone_vm), every other config
// lock 10 s (PVE::AbstractConfig lock_config), storage locks 10 s
// (PVE::Storage::Plugin cluster_lock_storage: lock_file's and cfs_lock's
// default).
const (
	cloneLockTimeout   = time.Second
	configLockTimeout  = 10 * time.Second
	storageLockTimeout = 10 * time.Second
)

// lockTimeout scales one of PVE's time-outs by Options.LockTimeoutScale.
func (s *Server) lockTimeout(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.opts.LockTimeoutScale)
}

// configLockFile is a VM's config lock on its node (PVE::QemuConfig
// config_file_lock).
func configLockFile(vmid int) string {
	return fmt.Sprintf("/var/lock/qemu-server/lock-%d.conf", vmid)
}

// lockConfig is PVE::AbstractConfig's lock_config_full/lock_config_shared
// on a node: the error is lock_file_full's "can't lock file '...' - got
// timeout".
func (s *Server) lockConfig(ctx context.Context, node string, vmid int, shared bool, timeout time.Duration) (func(), error) {
	file := configLockFile(vmid)
	release, err := s.locks.acquire(ctx, node+":"+file, shared, s.lockTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("can't lock file '%s' - %v", file, err)
	}
	return release, nil
}

// lockStorage is cluster_lock_storage: a node-local flock for a local
// storage, pmxcfs's cluster-wide lock for a shared one, each with its own
// error text.
func (s *Server) lockStorage(ctx context.Context, node string, st *storage) (func(), error) {
	if st.shared {
		release, err := s.locks.acquire(ctx, "cfs:storage-"+st.id, false, s.lockTimeout(storageLockTimeout))
		if err != nil {
			if errors.Is(err, errLockTimeout) {
				err = errors.New("got lock request timeout")
			}
			return nil, fmt.Errorf("cfs-lock 'storage-%s' error: %v", st.id, err)
		}
		return release, nil
	}
	file := "/var/lock/pve-manager/pve-storage-" + st.id
	release, err := s.locks.acquire(ctx, node+":"+file, false, s.lockTimeout(storageLockTimeout))
	if err != nil {
		return nil, fmt.Errorf("can't lock file '%s' - %v", file, err)
	}
	return release, nil
}

// HoldStorageLock takes a storage's lock for d, as a long operation of
// another client would (a full clone, a backup): pmxcfs's cluster-wide
// lock for a shared storage, the node's flock for a local one. Clones that
// need it meanwhile wait up to 10 s (LockTimeoutScale) and then fail.
func (s *Server) HoldStorageLock(node, storageID string, d time.Duration) error {
	s.mu.Lock()
	st := s.storage(storageID)
	s.mu.Unlock()
	if st == nil {
		return fmt.Errorf("pvesim: no storage %q", storageID)
	}
	release, err := s.lockStorage(s.ctx, node, st)
	if err != nil {
		return err
	}
	time.AfterFunc(d, release)
	return nil
}
