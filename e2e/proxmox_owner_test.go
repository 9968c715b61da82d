package e2e

import (
	"fmt"
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
// second, and each VM is deleted once.
func TestProxmoxRealLatency(t *testing.T) {
	sim, env := simClusterWith(t, 2, func(o *pvesim.Options) {
		o.Latency, o.TaskDelay, o.BootDelay = "real", 0, 0
	})
	for i, node := range []string{"pve1", "pve2"} {
		if err := sim.AddTemplate(node, 9100+i, "tagged-job", pvesim.TemplateSpec{Tags: "delegate;template"}); err != nil {
			t.Fatal(err)
		}
	}
	cs, _, _ := stdioSession(t, t.TempDir(), "", append(env, "DEFAULT_VM_TEMPLATE=tagged-job", "DELEGATE_MAX_CONCURRENT=8")...)
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
	deleted := map[string]int{}
	for _, r := range sim.Requests() {
		if r.Method == "DELETE" && r.Status == 200 {
			deleted[r.Path]++
		}
	}
	n := 0
	for path, times := range deleted {
		n += times
		if times > 1 && !strings.Contains(path, "/tasks/") {
			t.Logf("%s deleted %d times (vmids are reused)", path, times)
		}
	}
	if n != 8 {
		t.Errorf("%d successful deletes for 8 jobs: %v", n, deleted)
	}
}
