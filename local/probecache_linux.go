//go:build linux

package local

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// probeRecordDir holds the records of the sandbox probes that passed on
// this host, each under the key of everything its result depends on
// (probeKey), in a file named by the key's hash. A CLI command opens a
// backend on every call, and the probe starts the helpers in new
// namespaces (3 ms with the C helpers, 20 ms and more with the Go ones,
// which start two Go processes; a cgo build probed both): with a record
// of its key in place, New skips it. In /run, like the uid registry, so a
// reboot empties it; root's alone; no data dir holds it (the result is
// the host's and the binary's). Check always probes.
const probeRecordDir = "/run/delegate/probes"

// probeKey says what a probe's result depends on: this boot of this
// kernel (a sysctl set since is in the limits read below, a new kernel
// is a new boot), the helper binary as a file (a rebuilt or replaced
// binary has another inode, size or change time), which helpers it
// has, the uid the probe ran as, and the kernel's namespace limits. A
// record whose key differs in any of them is ignored and the probe runs
// again.
func probeKey(selfExe string, uids uidRange) (string, error) {
	var b strings.Builder
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(selfExe, &st); err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "boot=%s kernel=%s %s\n", bytes.TrimSpace(boot), unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]))
	fmt.Fprintf(&b, "exe=%s dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d mode=%o\n", selfExe, st.Dev, st.Ino, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Mode)
	fmt.Fprintf(&b, "c=%t uid=%d euid=%d\n", haveCHelper, uids.first, os.Geteuid())
	for _, ns := range []string{"user", "mnt", "pid", "ipc", "uts", "net", "cgroup"} {
		v, err := os.ReadFile("/proc/sys/user/max_" + ns + "_namespaces")
		if err != nil {
			continue // an older kernel without this limit: the same on every call
		}
		fmt.Fprintf(&b, "max_%s_namespaces=%s\n", ns, bytes.TrimSpace(v))
	}
	return b.String(), nil
}

// probeRecord is the file in dir of the record of key.
func probeRecord(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16]))
}

// probedBefore says whether dir holds the record of key.
func probedBefore(dir, key string) bool {
	data, err := os.ReadFile(probeRecord(dir, key))
	return err == nil && string(data) == key
}

// recordProbe records in dir that the probe passed under key (best
// effort: without the record the next New probes again).
func recordProbe(dir, key string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	dst := probeRecord(dir, key)
	tmp := dst + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, []byte(key), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
