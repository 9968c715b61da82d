package e2e

import (
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
