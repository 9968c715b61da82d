package pvesim

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// TestOutputLimits: exec output beyond 16 MiB is cut and flagged; a
// file read stops at count and says so (also when it reached the end).
func TestOutputLimits(t *testing.T) {
	s := newSim(t, Options{})
	id := cloneAndBoot(t, s, 101, nil)
	es := run(t, s, id, "/bin/sh", "-c", "head -c 17000000 /dev/zero | tr '\\0' x; echo done >&2")
	if len(es.Stdout) != maxExecOutput || !es.StdoutTruncated || string(es.Stderr) != "done\n" || es.StderrTruncated {
		t.Errorf("stdout %d bytes, truncated %v; stderr %q", len(es.Stdout), es.StdoutTruncated, es.Stderr)
	}
	if err := s.c.AgentFileWrite(ctxT(t), "pve1", id, "/tmp/ten", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		query     string
		content   string
		truncated bool
	}{
		{"", "0123456789", false},
		{"&count=4", "0123", true},
		{"&count=10", "0123456789", true}, // PVE cannot tell it reached the end
		{"&count=11", "0123456789", false},
		{"&offset=8", "89", false},
	} {
		r := s.raw(t, "GET", fmt.Sprintf("/api2/json/nodes/pve1/qemu/%d/agent/file-read?file=/tmp/ten%s", id, tt.query), "", "", "")
		data, _ := r.Body["data"].(map[string]any)
		if data["content"] != tt.content || (data["truncated"] == float64(1)) != tt.truncated || data["bytes-read"] != float64(len(tt.content)) {
			t.Errorf("%s: %d %v", tt.query, r.Status, r.Body)
		}
	}
	r := s.raw(t, "GET", fmt.Sprintf("/api2/json/nodes/pve1/qemu/%d/agent/file-read?file=/tmp/ten&decode=0", id), "", "", "")
	if r.Body["data"].(map[string]any)["content"] != "MDEyMzQ1Njc4OQ==" {
		t.Errorf("decode=0: %v", r.Body)
	}
	// encode=1 reads characters as bytes; a wider character fails like
	// Perl's encode_base64.
	r = s.raw(t, "POST", fmt.Sprintf("/api2/json/nodes/pve1/qemu/%d/agent/file-write", id), "", "application/json", `{"file":"/tmp/w","content":"€"}`)
	if r.Status != 500 || r.Reason != "Wide character in subroutine entry" {
		t.Errorf("wide character: %d %s", r.Status, r.Reason)
	}
}

// TestCloseStopsGuests: closing the simulator leaves no guest behind.
func TestCloseStopsGuests(t *testing.T) {
	s := newSim(t, Options{})
	id := cloneAndBoot(t, s, 101, nil)
	marker := "sleep 4343." + strings.Repeat("7", 3)
	if _, err := s.c.AgentExec(ctxT(t), "pve1", id, []string{"/bin/sh", "-c", "exec " + marker}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command", func() bool { return processRunning(marker) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command to die", func() bool { return !processRunning(marker) })
	assertNoGuests(t, s)
	if _, err := s.c.Version(context.Background()); err == nil {
		t.Error("still serving")
	}
	if vm, _ := s.VM(id); vm.Status != "stopped" {
		t.Errorf("status %s", vm.Status)
	}
}

// TestConcurrentVMs: several VMs live at once, each running its own
// commands, and all go away cleanly.
func TestConcurrentVMs(t *testing.T) {
	s := newSim(t, Options{})
	t.Run("vms", func(t *testing.T) {
		for i := range 4 {
			id := 200 + i
			t.Run(fmt.Sprint(id), func(t *testing.T) {
				t.Parallel()
				ctx := ctxT(t)
				cloneAndBoot(t, s, id, nil)
				for j := range 3 {
					es := run(t, s, id, "/bin/sh", "-c", fmt.Sprintf("echo vm%d-%d", id, j))
					if want := fmt.Sprintf("vm%d-%d\n", id, j); string(es.Stdout) != want {
						t.Errorf("got %q, want %q", es.Stdout, want)
					}
				}
				upid, _ := s.c.StopVM(ctx, "pve1", id)
				if err := s.c.WaitTask(ctx, "", upid); err != nil {
					t.Fatal(err)
				}
				upid, _ = s.c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{})
				if err := s.c.WaitTask(ctx, "", upid); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
	assertNoGuests(t, s)
}

// TestRealAgent: where qemu-guest-agent is installed (scripts/test
// installs it; DELEGATE_REQUIRE_QEMU_GA=1 makes its absence a failure),
// the guests run it: agent/info is qemu-ga's, and a restart of the agent
// kills what it started in its process group (the stand-in for its
// service's cgroup) but not what left it (setsid), and it answers again.
func TestRealAgent(t *testing.T) {
	s := newSim(t, Options{})
	if !strings.HasPrefix(s.AgentKind(), "qemu-ga ") {
		if os.Getenv("DELEGATE_REQUIRE_QEMU_GA") != "" {
			t.Fatalf("guests run %s: qemu-guest-agent is not installed", s.AgentKind())
		}
		t.Skip("qemu-guest-agent is not installed: guests run the emulation")
	}
	ctx := ctxT(t)
	id := cloneAndBoot(t, s, 120, nil)
	info, err := s.c.AgentInfo(ctx, "pve1", id)
	if err != nil || !strings.HasPrefix(s.AgentKind(), "qemu-ga "+info.Version) || len(info.Commands) < 20 || len(info.Disabled("guest-exec", "guest-file-open")) != 0 {
		t.Fatalf("agent/info %+v %v (%s)", info, err, s.AgentKind())
	}
	pids := func() string {
		es := run(t, s, id, "/bin/sh", "-c", `for p in /proc/[0-9]*; do c=$(tr '\000' ' ' < $p/cmdline 2>/dev/null); case $c in "sleep 10"*) echo "$c";; esac; done | sort`)
		return string(es.Stdout)
	}
	run(t, s, id, "/bin/sh", "-c", "sleep 101 >/dev/null 2>&1 & setsid sleep 102 >/dev/null 2>&1 &")
	if got := pids(); got != "sleep 101 \nsleep 102 \n" {
		t.Fatalf("before the restart: %q", got)
	}
	agentPid := func() string {
		data, err := s.c.AgentFileRead(ctx, "pve1", id, qgaDir+"/agent.pid")
		if err != nil {
			t.Fatal(err)
		}
		return string(data.Data)
	}
	before := agentPid()
	if err := s.RestartAgent(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	waitAgent(t, s, id)
	if after := agentPid(); after == before {
		t.Errorf("qemu-ga was not restarted (pid %s)", after)
	}
	if got := pids(); got != "sleep 102 \n" {
		t.Errorf("after the restart: %q, want only the setsid one", got)
	}
}

// TestGuestTmp (issue 39, item 7): a guest's /tmp is RAM, half the VM's
// memory, as a Debian 13 guest's (systemd's tmp.mount, size=50%): bulk
// data beyond that fails there ("No space left on device"), where the
// VM's disk (/var/tmp) takes it.
func TestGuestTmp(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	if err == nil {
		err = s.c.WaitTask(ctx, "pve1", upid)
	}
	if err == nil {
		err = s.c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{MemoryMiB: 128})
	}
	if err == nil {
		upid, err = s.c.StartVM(ctx, "pve1", 101)
	}
	if err == nil {
		err = s.c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitAgent(t, s, 101)
	es := run(t, s, 101, "/bin/sh", "-c", `stat -f -c '%T %b %S' /tmp; stat -f -c '%b %S' /var/tmp`)
	var fsType string
	var blocks, bsize, diskBlocks, diskBsize int64
	if _, err := fmt.Sscan(string(es.Stdout), &fsType, &blocks, &bsize, &diskBlocks, &diskBsize); err != nil || es.ExitCode == nil || *es.ExitCode != 0 {
		t.Fatalf("stat -f: %q %q (%v)", es.Stdout, es.Stderr, err)
	}
	if fsType != "tmpfs" || blocks*bsize != 64<<20 {
		t.Errorf("/tmp is %s of %d bytes, want tmpfs of 64 MiB (half of 128 MiB)", fsType, blocks*bsize)
	}
	if diskBlocks*diskBsize < 1<<30 {
		t.Errorf("/var/tmp has %d bytes, want the VM's disk", diskBlocks*diskBsize)
	}
	// 70 MB: more than /tmp holds, less than the VM's memory.
	es = run(t, s, 101, "/bin/sh", "-c", "head -c 70000000 /dev/zero > /tmp/bulk; rc=$?; rm -f /tmp/bulk; exit $rc")
	if es.ExitCode == nil || *es.ExitCode == 0 || !strings.Contains(string(es.Stderr), "No space left on device") {
		t.Errorf("70 MB into /tmp: exit %d, %q; want it refused for lack of room", exitCode(es), es.Stderr)
	}
	es = run(t, s, 101, "/bin/sh", "-c", "head -c 70000000 /dev/zero > /var/tmp/bulk; rc=$?; rm -f /var/tmp/bulk; exit $rc")
	if es.ExitCode == nil || *es.ExitCode != 0 {
		t.Errorf("70 MB into /var/tmp: exit %d, %q", exitCode(es), es.Stderr)
	}
}

// exitCode is a command's exit code, -1 without one.
func exitCode(es pve.ExecStatus) int {
	if es.ExitCode == nil {
		return -1
	}
	return *es.ExitCode
}
