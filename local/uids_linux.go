//go:build linux

package local

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// uidRegistryDir is where the sandboxes of every delegate on this host
// claim their host uids (see uids.go): a file per claimed base, named by
// it, holding the sandbox directory. In /run, so a reboot, which ends
// every sandbox, empties it; root's alone.
const uidRegistryDir = "/run/delegate/uids"

// uidRegistry hands out slots of a range, one per sandbox.
type uidRegistry struct {
	dir string
	r   uidRange
}

// lock takes the registry's lock (a flock: released if the process dies)
// and returns its release.
func (g *uidRegistry) lock() (func(), error) {
	if err := os.MkdirAll(g.dir, 0o700); err != nil {
		return nil, fmt.Errorf("host uid registry: %w", err)
	}
	fd, err := unix.Open(filepath.Join(g.dir, ".lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host uid registry: %w", err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("host uid registry: lock: %w", err)
	}
	return func() { unix.Close(fd) }, nil
}

// claim takes a free slot for the sandbox in sandboxDir and returns its
// base. A claim whose sandbox directory is gone (removed by hand, or a
// crash between the claim and the directory's removal) is free again.
func (g *uidRegistry) claim(sandboxDir string) (uint32, error) {
	unlock, err := g.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	n := g.r.slots()
	start := rand.IntN(n) // few collisions to step over, however many are taken
	for i := range n {
		base := g.r.first + uint32((start+i)%n)*slotSize
		file := filepath.Join(g.dir, strconv.FormatUint(uint64(base), 10))
		if owner, err := os.ReadFile(file); err == nil {
			if _, err := os.Lstat(string(owner)); err == nil || !errors.Is(err, os.ErrNotExist) {
				continue // taken
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("host uid registry: %w", err)
		}
		if err := writeFileAtomic(file, []byte(sandboxDir), 0o600); err != nil {
			return 0, fmt.Errorf("host uid registry: %w", err)
		}
		return base, nil
	}
	return 0, fmt.Errorf("all %d slots of host uids (DELEGATE_SANDBOX_UIDS=%s) are taken: as many sandboxes exist on this host; destroy some, or widen the range", n, g.r)
}

// release gives the sandbox's slot back, if it still holds it.
func (g *uidRegistry) release(base uint32, sandboxDir string) error {
	unlock, err := g.lock()
	if err != nil {
		return err
	}
	defer unlock()
	file := filepath.Join(g.dir, strconv.FormatUint(uint64(base), 10))
	owner, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) || (err == nil && string(owner) != sandboxDir) {
		return nil // never claimed (a sandbox made before slots), or another's since
	}
	if err == nil {
		err = os.Remove(file)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("host uid registry: %w", err)
	}
	return nil
}
