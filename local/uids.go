package local

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// The host uids of sandboxes.
//
// Each sandbox has host uids and gids of its own: a slot of slotSize ids
// starting at its base, which the sandbox's user namespace maps its ids
// 0..slotSize-1 onto (its init, uid 0 inside, is host uid base; its job,
// uid jobID inside, host uid base+jobID). The base is also the owner of
// the sandbox's user namespace: the kernel charges per-user budgets
// (inotify instances and watches, fanotify groups, POSIX message-queue
// bytes, pending signals, locked memory) up the chain of namespace owners,
// so with root as every sandbox's owner, one job could exhaust root's
// budget, and with it every other sandbox's and the host's.
//
// The slots are the operator's range (Config.UIDs, DELEGATE_SANDBOX_UIDS),
// which no /etc/subuid or /etc/subgid entry, nor any user or group of
// /etc/passwd and /etc/group, may overlap: a host process of one of those
// uids could stop, renice or prlimit a job. New checks that at start.
//
// A sandbox's base is claimed when the sandbox is made, in a registry
// shared by every delegate on the host (uidRegistryDir: one file per
// claimed base, naming the sandbox directory, in /run, which a reboot
// empties with the sandboxes it recorded), recorded in its state.json
// (sandboxState.HostUID), where a restarted server finds it again, and
// released when the sandbox is destroyed. A sandbox recorded without one
// (made before the slots) has legacyIDBase.
const (
	// slotSize is how many host ids one sandbox has: the whole 16-bit
	// range its programs may expect.
	slotSize = 65536
	// DefaultUIDs is the default range: the block systemd leaves unused
	// between its container range (524288-1879048191, which
	// systemd-nspawn picks from) and its foreign range (2147352576-),
	// above the subordinate ids useradd hands out (100000-600100000),
	// below 2^31 (some programs take ids for signed numbers). 4094 slots.
	// See systemd's docs/UIDS-GIDS.md.
	DefaultUIDs = "1879048192-2147352575"
	// legacyIDBase is the one range every sandbox had before slots.
	legacyIDBase = 100000
)

// uidRange is the host ids sandboxes' slots are taken from: first..last,
// whole slots.
type uidRange struct{ first, last uint32 }

// parseUIDRange reads "FIRST-LAST": inclusive host ids, whole slots
// (FIRST and LAST+1 multiples of 65536), at least one, above the 16-bit
// ids of a host's own users and below 2^32-1 ((uid_t)-1).
func parseUIDRange(s string) (uidRange, error) {
	bad := func(rule string) (uidRange, error) {
		return uidRange{}, fmt.Errorf("the sandboxes' host uid range %q (DELEGATE_SANDBOX_UIDS): %s", s, rule)
	}
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return bad("must be FIRST-LAST, two host ids, like " + DefaultUIDs)
	}
	switch {
	case first%slotSize != 0 || (last+1)%slotSize != 0 || last < first:
		return bad(fmt.Sprintf("must be whole slots of %d ids: FIRST and LAST+1 multiples of %d", slotSize, slotSize))
	case first < slotSize:
		return bad(fmt.Sprintf("must start at %d or above, clear of the host's own users", slotSize))
	case last >= 1<<32-1:
		return bad("must end below 4294967295, which is (uid_t)-1")
	}
	return uidRange{first: uint32(first), last: uint32(last)}, nil
}

func (r uidRange) String() string { return fmt.Sprintf("%d-%d", r.first, r.last) }

// slots is how many sandboxes the range holds at once.
func (r uidRange) slots() int { return int((uint64(r.last) + 1 - uint64(r.first)) / slotSize) }

// contains reports whether a host id is one of the sandboxes'.
func (r uidRange) contains(id uint32) bool {
	return id >= r.first && id <= r.last || id >= legacyIDBase && id < legacyIDBase+slotSize
}

// idFiles are the host's files of users, groups and subordinate ids that
// the range must stay clear of, and how to read an entry's ids.
var idFiles = []struct {
	path string
	ids  func(fields []string) (start, count uint64, ok bool)
}{
	{"/etc/subuid", subIDs},
	{"/etc/subgid", subIDs},
	{"/etc/passwd", func(f []string) (uint64, uint64, bool) { return field(f, 2) }},
	{"/etc/group", func(f []string) (uint64, uint64, bool) { return field(f, 2) }},
}

// subIDs reads "name:start:count".
func subIDs(f []string) (uint64, uint64, bool) {
	if len(f) < 3 {
		return 0, 0, false
	}
	start, err1 := strconv.ParseUint(f[1], 10, 32)
	count, err2 := strconv.ParseUint(f[2], 10, 32)
	return start, count, err1 == nil && err2 == nil && count > 0
}

// field reads the one id in field i.
func field(f []string, i int) (uint64, uint64, bool) {
	if len(f) <= i {
		return 0, 0, false
	}
	id, err := strconv.ParseUint(f[i], 10, 32)
	return id, 1, err == nil
}

// checkHostIDs says which entry of the host's id files overlaps r, if
// any. root is prefixed to the files' paths (tests).
func checkHostIDs(r uidRange, root string) error {
	for _, file := range idFiles {
		f, err := os.Open(root + file.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s to check the sandboxes' host uid range: %w", file.path, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			start, count, ok := file.ids(strings.Split(line, ":"))
			if ok && start <= uint64(r.last) && start+count-1 >= uint64(r.first) {
				f.Close()
				return fmt.Errorf("the sandboxes' host uid range %s (DELEGATE_SANDBOX_UIDS) overlaps %s line %d (%q): a process of those ids could signal, renice or prlimit a job; set DELEGATE_SANDBOX_UIDS to whole slots of %d ids that no entry of /etc/subuid, /etc/subgid, /etc/passwd or /etc/group overlaps",
					r, file.path, n, line, slotSize)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return fmt.Errorf("read %s to check the sandboxes' host uid range: %w", file.path, err)
		}
	}
	return nil
}
