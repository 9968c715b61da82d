package pvesim

import (
	"errors"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

func TestLifecycleSmoke(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	c := s.c
	id, err := c.NextID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: id, Name: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	upid, err = c.StartVM(ctx, "pve1", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	err = c.AgentPing(ctx, "pve1", id)
	t.Log("ping before boot:", err, pve.IsAgentNotRunning(err))
	for {
		if err = c.AgentPing(ctx, "pve1", id); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid, err := c.AgentExec(ctx, "pve1", id, []string{"/bin/sh", "-c", "echo hi; echo err >&2; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		st, err := c.AgentExecStatus(ctx, "pve1", id, pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited {
			t.Logf("%d %q %q", *st.ExitCode, st.Stdout, st.Stderr)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, r := range s.Requests() {
		t.Logf("%s %s %v %d %s", r.Method, r.Path, r.Params, r.Status, r.Reason)
	}
}
