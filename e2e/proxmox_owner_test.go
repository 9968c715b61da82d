package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pvesim"
)

// TestProxmoxSweepSparesProvisioning: a fresh clone carries the template's
// tags (here "delegate") until the job writes its own. With a cleanup
// sweep every second and slow clone and config tasks, the sweep sees the
// half-made VM several times; it must not take it for an orphan.
func TestProxmoxSweepSparesProvisioning(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simClusterWith(t, 1, func(o *pvesim.Options) {
		o.TaskDelays = map[string]time.Duration{"qmclone": 2500 * time.Millisecond, "qmconfig": 2500 * time.Millisecond}
	})
	// The template itself looks like delegate's: its clones inherit that.
	if err := sim.AddTemplate("pve1", 9100, "tagged-job", pvesim.TemplateSpec{Tags: "delegate;template"}); err != nil {
		t.Fatal(err)
	}
	cs, _, _ := stdioSession(t, t.TempDir(), "", append(env, "DEFAULT_VM_TEMPLATE=tagged-job")...)
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo survived"}})
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID, "timeout_seconds": 50})
	if st.Status != "success" {
		t.Fatalf("job %+v: the sweep took its VM while it was being provisioned", st)
	}
	if r := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID}); r.Output != "survived\n" {
		t.Fatalf("%+v", r)
	}
	noVMsLeft(t, sim)
}

// TestProxmoxRealLatency: at a real cluster's timings (clones ~2 s
// contending on their storage's lock, boot ~12 s, a new VM missing from
// the statistics for ~10 s), 8 jobs submitted at once from a template
// tagged like delegate's all succeed while the cleanup sweep runs every
// second; each job's VM is destroyed once, by that job's own cleanup,
// and no other VM is deleted.
func TestProxmoxRealLatency(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simClusterWith(t, 2, func(o *pvesim.Options) {
		o.Latency, o.TaskDelay, o.BootDelay = "real", 0, 0
	})
	for i, node := range []string{"pve1", "pve2"} {
		if err := sim.AddTemplate(node, 9100+i, "tagged-job", pvesim.TemplateSpec{Tags: "delegate;template"}); err != nil {
			t.Fatal(err)
		}
	}
	cs, _, stderr := stdioSession(t, t.TempDir(), "", append(env, "DEFAULT_VM_TEMPLATE=tagged-job", "DELEGATE_MAX_CONCURRENT=8")...)
	var ids []string
	for i := range 8 {
		ids = append(ids, call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
			"agentType": "script", "task": fmt.Sprintf("echo job %d", i)}}).JobID)
	}
	for i, id := range ids {
		var st statusOut
		for range 4 {
			if st = call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 45}); st.Status == "success" || st.Status == "failed" {
				break
			}
		}
		if r := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": id}); st.Status != "success" || r.Output != fmt.Sprintf("job %d\n", i) {
			t.Errorf("job %d: %+v %q", i, st, r.Output)
		}
	}
	noVMsLeft(t, sim)
	byJob := vmsDeletedByJob(t, sim, ids)
	// The server logs a destroy once it has seen the delete task end,
	// which may be a poll interval after the VM is gone.
	var destroyed map[string][]int
	for range 100 {
		if destroyed = destroyedInLog(stderr.String()); len(destroyed) >= len(ids) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, id := range ids {
		if len(byJob[id]) != 1 {
			t.Errorf("job %d (%s): its VMs deleted %v, want one", i, id, byJob[id])
			continue
		}
		if got := destroyed[id]; len(got) != 1 || got[0] != byJob[id][0] {
			t.Errorf("job %d (%s): its own cleanup destroyed VMs %v, want its VM %d", i, id, got, byJob[id][0])
		}
	}
	if strings.Contains(stderr.String(), "destroying orphaned sandbox") {
		t.Errorf("the cleanup sweep destroyed a job's VM: the job's own cleanup did not")
	}
}

// vmsDeletedByJob follows the simulator's request log: a job's tag
// written to a VM's config (right after its clone) makes it the job's VM;
// every successful DELETE of a VM is counted for the job that owned it
// then, and one of a VM no job owned fails the test.
func vmsDeletedByJob(t *testing.T, sim *pvesim.Server, jobs []string) map[string][]int {
	t.Helper()
	owner := map[string]string{} // vmid -> job
	out := map[string][]int{}
	for _, r := range sim.Requests() {
		if r.Status != 200 {
			continue
		}
		if m := claimPath.FindStringSubmatch(r.Path); m != nil && r.Method == "PUT" {
			tags := strings.Split(fmt.Sprint(r.Params["tags"]), ";")
			for _, job := range jobs {
				if slices.Contains(tags, job) {
					owner[m[1]] = job
				}
			}
		}
		if m := vmPathRe.FindStringSubmatch(r.Path); m != nil && r.Method == "DELETE" {
			job, ok := owner[m[1]]
			if !ok {
				t.Errorf("VM %s was deleted: no job's", m[1])
				continue
			}
			delete(owner, m[1])
			n, _ := strconv.Atoi(m[1])
			out[job] = append(out[job], n)
		}
	}
	return out
}

var destroyedRe = regexp.MustCompile(`msg="destroyed VM" .*\bvmid=(\d+) .*\bjob=(\S+)`)

// destroyedInLog reads the server's "destroyed VM" lines: the VMs each
// job's sandbox destroy removed.
func destroyedInLog(log string) map[string][]int {
	out := map[string][]int{}
	for _, m := range destroyedRe.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out[m[2]] = append(out[m[2]], n)
	}
	return out
}
