//go:build linux

package local

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	b := newBackend(t, 0)
	tests := []struct {
		name    string
		limit   int64
		allocMB int
		wantOOM bool
	}{
		{"over the limit is OOM-killed", 64 * mib, 256, true},
		{"under the limit runs", 64 * mib, 10, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := defaultSpec()
			spec.MemoryBytes = tt.limit
			sb := create(t, b, spec)
			st := stateOf(t, sb)
			if st.Cgroup.Version == 1 {
				if got := cgroupValue(t, st.Cgroup.Memory, "memory.limit_in_bytes"); got != strconv.FormatInt(tt.limit, 10) {
					t.Errorf("memory.limit_in_bytes = %s, want %d", got, tt.limit)
				}
				if got := cgroupValue(t, st.Cgroup.Memory, "memory.memsw.limit_in_bytes"); got != strconv.FormatInt(tt.limit, 10) {
					t.Errorf("memory.memsw.limit_in_bytes = %s, want %d", got, tt.limit)
				}
			} else if got := cgroupValue(t, st.Cgroup.Memory, "memory.max"); got != strconv.FormatInt(tt.limit, 10) {
				t.Errorf("memory.max = %s, want %d", got, tt.limit)
			}
			exit, out := runHelperIn(t, sb, "alloc", strconv.Itoa(tt.allocMB))
			if exit.OOMKilled != tt.wantOOM {
				t.Errorf("OOMKilled = %v, want %v (exit %+v, output %q)", exit.OOMKilled, tt.wantOOM, exit, out)
			}
			if tt.wantOOM && (exit.Code != 137 || exit.Signal != "killed" || strings.Contains(out, "allocated")) {
				t.Errorf("exit = %+v, output %q; want killed by SIGKILL before it finished", exit, out)
			}
			if !tt.wantOOM && (exit.Code != 0 || !strings.Contains(out, "allocated")) {
				t.Errorf("exit = %+v, output %q; want success", exit, out)
			}
		})
	}
}

func TestPidsLimit(t *testing.T) {
	const pidsMax = 24
	b := newBackend(t, pidsMax)
	sb := create(t, b, defaultSpec())
	st := stateOf(t, sb)
	if got := cgroupValue(t, st.Cgroup.Pids, "pids.max"); got != strconv.Itoa(pidsMax) {
		t.Errorf("pids.max = %s, want %d", got, pidsMax)
	}
	// Try to start 200 processes that stay alive; count those that started.
	exit, out := run(t, sb, "/bin/sh", "-c", `
		n=0
		while [ $n -lt 200 ]; do
			sleep 60 2>/dev/null &
			[ $? -eq 0 ] || break
			n=$((n+1))
		done
		echo "started=$n alive=$(ls /proc | grep -c '^[0-9]')"`)
	t.Logf("exit %+v, output %q", exit, out)
	if strings.Contains(out, "started=200") {
		t.Fatalf("200 processes started under pids.max=%d: %s", pidsMax, out)
	}
	if !strings.Contains(strings.ToLower(out), "fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("output does not show a failed fork: %q", out)
	}
	if st.Cgroup.Version == 1 {
		events := cgroupValue(t, st.Cgroup.Pids, "pids.events")
		if events == "max 0" {
			t.Errorf("pids.events = %q, want the limit hit", events)
		}
	}
}

// TestCPULimit checks the configuration only: a timed assertion would
// flake on a busy two-core machine.
func TestCPULimit(t *testing.T) {
	b := newBackend(t, 0)
	for _, cores := range []float64{0.5, 1.5, 0.001} {
		spec := defaultSpec()
		spec.CPU = cores
		st := stateOf(t, create(t, b, spec))
		want := cpuQuota(cores)
		if st.Cgroup.Version == 1 {
			if got := cgroupValue(t, st.Cgroup.CPU, "cpu.cfs_period_us"); got != "100000" {
				t.Errorf("cpu %v: cfs_period_us = %s", cores, got)
			}
			if got := cgroupValue(t, st.Cgroup.CPU, "cpu.cfs_quota_us"); got != strconv.FormatInt(want, 10) {
				t.Errorf("cpu %v: cfs_quota_us = %s, want %d", cores, got, want)
			}
		} else if got := cgroupValue(t, st.Cgroup.CPU, "cpu.max"); got != strconv.FormatInt(want, 10)+" 100000" {
			t.Errorf("cpu %v: cpu.max = %s, want %d 100000", cores, got, want)
		}
	}
	if cpuQuota(0.5) != 50000 || cpuQuota(2) != 200000 || cpuQuota(0.001) != 1000 {
		t.Errorf("cpuQuota: 0.5→%d 2→%d 0.001→%d", cpuQuota(0.5), cpuQuota(2), cpuQuota(0.001))
	}
	// No cpu means no quota.
	spec := defaultSpec()
	spec.CPU = 0
	st := stateOf(t, create(t, b, spec))
	if st.Cgroup.Version == 1 {
		if got := cgroupValue(t, st.Cgroup.CPU, "cpu.cfs_quota_us"); got != "-1" {
			t.Errorf("cpu 0: cfs_quota_us = %s, want -1", got)
		}
	}
}

func TestDiskLimit(t *testing.T) {
	b := newBackend(t, 0)
	spec := defaultSpec()
	spec.DiskBytes = 8 * mib
	sb := create(t, b, spec)
	exit, out := run(t, sb, "/bin/sh", "-c", `head -c 20000000 /dev/zero > /workspace/big; echo "rc=$?"; df -k /workspace | tail -1`)
	wantContains(t, out, "No space left on device", "rc=1")
	if exit.Code != 0 {
		t.Errorf("exit = %+v", exit)
	}
	// The workspace is a tmpfs of exactly that size.
	if fields := strings.Fields(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]); len(fields) < 2 || fields[1] != "8192" {
		t.Errorf("df of /workspace: %q, want 8192 KiB", out)
	}
	data, err := sb.ReadFile(context.Background(), "/workspace/big", 0, 100*mib)
	if err != nil || int64(len(data)) > 8*mib {
		t.Errorf("ReadFile of the partial file: %d bytes, %v", len(data), err)
	}
}
