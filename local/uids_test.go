//go:build linux

package local

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseUIDRange(t *testing.T) {
	for _, tc := range []struct {
		in    string
		slots int
		want  string // in the error; "" = accepted
	}{
		{DefaultUIDs, 4094, ""},
		{"65536-131071", 1, ""},
		{" 1879048192 - 1879179263 ", 2, ""},
		{"100000-165535", 0, "whole slots"},
		{"65536-65535", 0, "whole slots"},
		{"131072-65535", 0, "whole slots"},
		{"0-65535", 0, "start at 65536 or above"},
		{"4294901760-4294967295", 0, "below 4294967295"},
		{"1879048192", 0, "FIRST-LAST"},
		{"a-b", 0, "FIRST-LAST"},
		{"", 0, "FIRST-LAST"},
	} {
		r, err := parseUIDRange(tc.in)
		if tc.want == "" {
			if err != nil || r.slots() != tc.slots {
				t.Errorf("%q: %v slots, %v; want %d", tc.in, r.slots(), err, tc.slots)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "DELEGATE_SANDBOX_UIDS") {
			t.Errorf("%q: %v; want an error naming DELEGATE_SANDBOX_UIDS with %q", tc.in, err, tc.want)
		}
	}
	r, _ := parseUIDRange("65536-196607")
	for id, want := range map[uint32]bool{65535: false, 65536: true, 196607: true, 196608: false, legacyIDBase + jobID: true} {
		if r.contains(id) != want {
			t.Errorf("contains(%d) = %v", id, !want)
		}
	}
}

// TestCheckHostIDs: a range that a subordinate id range, a user or a
// group of the host overlaps is refused, naming the file, the line and
// the setting.
func TestCheckHostIDs(t *testing.T) {
	r, _ := parseUIDRange(DefaultUIDs)
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"clear", "/etc/subuid", "alice:100000:65536\nbob:165536:65536\n", ""},
		{"subuid overlaps", "/etc/subuid", "alice:100000:65536\n# lxd\nroot:1879000000:1000000\n", `/etc/subuid line 3 ("root:1879000000:1000000")`},
		{"subgid at the end", "/etc/subgid", "x:2147352575:1\n", "/etc/subgid line 1"},
		{"subgid just after", "/etc/subgid", "x:2147352576:65536\n", ""},
		{"a user", "/etc/passwd", "root:x:0:0::/root:/bin/sh\nsvc:x:2000000000:100::/:/bin/false\n", "/etc/passwd line 2"},
		{"a group", "/etc/group", "big:x:1900000000:\n", "/etc/group line 1"},
		{"no files", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.Mkdir(filepath.Join(root, "etc"), 0o755)
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(root, tc.file), []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := checkHostIDs(r, root)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "DELEGATE_SANDBOX_UIDS") ||
				!strings.Contains(err.Error(), "/etc/subuid, /etc/subgid") {
				t.Errorf("err = %v, want one naming %q, the files and DELEGATE_SANDBOX_UIDS", err, tc.want)
			}
		})
	}
}

// TestUIDRegistry: sandboxes get slots of their own, also from two
// registries (two servers) on one host; a slot whose sandbox directory is
// gone is free again; a release gives back only the releaser's own.
func TestUIDRegistry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "uids")
	r, _ := parseUIDRange("65536-262143") // 3 slots
	a, b := &uidRegistry{dir: dir, r: r}, &uidRegistry{dir: dir, r: r}
	sbs := t.TempDir()
	sb := func(n int) string {
		p := filepath.Join(sbs, "sb"+strconv.Itoa(n))
		os.MkdirAll(p, 0o700)
		return p
	}
	seen := map[uint32]bool{}
	for i, g := range []*uidRegistry{a, b, a} {
		base, err := g.claim(sb(i))
		if err != nil || seen[base] || !r.contains(base) || (base-r.first)%slotSize != 0 {
			t.Fatalf("claim %d: %d, %v (taken: %v)", i, base, err, seen)
		}
		seen[base] = true
	}
	if _, err := b.claim(sb(3)); err == nil || !strings.Contains(err.Error(), "all 3 slots") {
		t.Fatalf("a fourth claim of three slots: %v", err)
	}
	// Sandbox 1 is destroyed by hand: its slot is free again.
	os.RemoveAll(sb(1))
	base, err := a.claim(sb(4))
	if err != nil {
		t.Fatal(err)
	}
	// The old owner's release must not free the new owner's claim.
	if err := b.release(base, filepath.Join(sbs, "sb1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.claim(sb(5)); err == nil {
		t.Fatal("a release by a former owner freed the slot")
	}
	if err := a.release(base, sb(4)); err != nil {
		t.Fatal(err)
	}
	if got, err := b.claim(sb(5)); err != nil || got != base {
		t.Fatalf("after the owner's release: %d, %v; want %d", got, err, base)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("registry directory: %v, %v", st, err)
	}
}

// TestHostUserCannotTouchJob: a host user whose uid was a job's before
// each sandbox had its own (101000, the first regular user's default
// subordinate range) cannot signal a job, nor can a process of another
// sandbox's ids.
func TestHostUserCannotTouchJob(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	p := start(t, sb, "/bin/sh", "-c", "echo started; exec sleep 1000")
	defer p.Kill(context.Background())
	st := stateOf(t, sb)
	jobUID := st.HostUID + jobID
	var pid int
	if !waitFor(10*time.Second, func() bool {
		pids, _ := st.Cgroup.procs()
		for _, p := range pids {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
			if err == nil && strings.Contains(string(data), "\nUid:\t"+strconv.Itoa(int(jobUID))+"\t") &&
				strings.Contains(string(data), "Name:\tsleep\n") {
				pid = p
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no process of host uid %d (the job's) in the sandbox", jobUID)
	}
	for _, uid := range []uint32{legacyIDBase + jobID, st.HostUID + slotSize + jobID, jobUID} {
		cmd := exec.Command("/bin/sh", "-c", `kill -0 "$1" 2>/dev/null && echo can || echo cannot`, "sh", strconv.Itoa(pid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("as uid %d: %v", uid, err)
		}
		// The job's own uid is the control: the check can tell.
		want := "cannot\n"
		if uid == jobUID {
			want = "can\n"
		}
		if string(out) != want {
			t.Errorf("a host process of uid %d signalling the job (host uid %d): %q, want %q", uid, jobUID, out, want)
		}
	}
}
