package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pvesim"
)

// readyPoolVMs lists the simulator's pool VMs whose agent answered.
func readyPoolVMs(sim *pvesim.Server) []int {
	var out []int
	for _, v := range sim.VMs() {
		if strings.Contains(v.Config["name"], "-pool-") && strings.Contains(v.Config["tags"], "delegate-ready") && v.Status == "running" {
			out = append(out, v.VMID)
		}
	}
	return out
}

func poolVMCount(sim *pvesim.Server) int {
	n := 0
	for _, v := range sim.VMs() {
		if strings.Contains(v.Config["name"], "-pool-") {
			n++
		}
	}
	return n
}

// waitPool waits until the simulator holds exactly n pool VMs, all ready.
func waitPool(t *testing.T, sim *pvesim.Server, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if len(readyPoolVMs(sim)) == n && poolVMCount(sim) == n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("not %d ready pool VMs after %s: %d ready of %d", n, within, len(readyPoolVMs(sim)), poolVMCount(sim))
}

func clones(sim *pvesim.Server) int {
	n := 0
	for _, task := range sim.Tasks() {
		if task.Type == "qmclone" {
			n++
		}
	}
	return n
}

var claimPath = regexp.MustCompile(`^/nodes/[^/]+/qemu/(\d+)/config$`)

// claimOf finds the digest-checked update that gave a pool VM to a job:
// the VM's id, or 0.
func claimOf(sim *pvesim.Server, job string) int {
	for _, r := range sim.Requests() {
		if m := claimPath.FindStringSubmatch(r.Path); m != nil && r.Method == "PUT" && r.Status == 200 && r.Params["digest"] != nil &&
			strings.HasSuffix(fmt.Sprint(r.Params["name"]), "-"+job) {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 0
}

// TestProxmoxWarmPool: at a real cluster's timings, `serve` with
// PROXMOX_POOL_SIZE=2 keeps two booted VMs; an echo job takes one and
// succeeds; the pool refills; the cleanup sweep (every second) never
// takes a pool VM; a restarted server adopts the pool (its next job is
// warm without a new clone), a smaller size shrinks it and 0 removes it.
func TestProxmoxWarmPool(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simClusterWith(t, 1, func(o *pvesim.Options) {
		o.Latency, o.TaskDelay, o.BootDelay = "real", 0, 0
	})
	dataDir := t.TempDir()
	env = append(env, "DEFAULT_CPU=1")
	cs, cmd, _ := stdioSession(t, dataDir, "", append(env, "PROXMOX_POOL_SIZE=2")...)
	waitPool(t, sim, 2, 90*time.Second)
	idle := readyPoolVMs(sim)
	// The sweep runs every second: the idle pool stays.
	time.Sleep(3 * time.Second)
	if got := readyPoolVMs(sim); fmt.Sprint(got) != fmt.Sprint(idle) {
		t.Fatalf("the idle pool changed: %v, then %v", idle, got)
	}

	start := time.Now()
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo warm"}})
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 45})
	took := time.Since(start)
	res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID})
	vmid := claimOf(sim, sub.JobID)
	if st.Status != "success" || res.Output != "warm\n" || vmid == 0 {
		t.Fatalf("job %+v %q, from pool VM %d", st, res.Output, vmid)
	}
	// claimOf proves the job ran in a pool VM; how fast that is belongs
	// to the benchmarks (docs/BENCHMARKS.md), not to a pass/fail test.
	t.Logf("warm echo job: submit to done in %s, VM %d", took.Round(time.Millisecond), vmid)
	waitPool(t, sim, 2, 90*time.Second)
	// Every VM deleted so far was the job's.
	for _, r := range sim.Requests() {
		if m := vmPathRe.FindStringSubmatch(r.Path); m != nil && r.Method == "DELETE" && r.Status == 200 && m[1] != strconv.Itoa(vmid) {
			t.Errorf("VM %s was deleted: no job's", m[1])
		}
	}

	// A restart adopts the pool: the next job is warm, with no new clone.
	stopServer(t, cs, cmd)
	made := clones(sim)
	cs, cmd, _ = stdioSession(t, dataDir, "", append(env, "PROXMOX_POOL_SIZE=2")...)
	sub = call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo adopted"}})
	st = call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 45})
	if st.Status != "success" || claimOf(sim, sub.JobID) == 0 {
		t.Fatalf("after a restart: %+v, claimed %d", st, claimOf(sim, sub.JobID))
	}
	waitPool(t, sim, 2, 90*time.Second)
	if c := clones(sim); c != made+1 {
		t.Errorf("%d clones after the restart, want 1 (the refill)", c-made)
	}

	// A smaller size shrinks the pool; 0 removes it.
	stopServer(t, cs, cmd)
	cs, cmd, _ = stdioSession(t, dataDir, "", append(env, "PROXMOX_POOL_SIZE=1")...)
	waitPool(t, sim, 1, 30*time.Second)
	stopServer(t, cs, cmd)
	stdioSession(t, dataDir, "", append(env, "PROXMOX_POOL_SIZE=0")...)
	noVMsLeft(t, sim)
}

var vmPathRe = regexp.MustCompile(`^/nodes/[^/]+/qemu/(\d+)$`)
