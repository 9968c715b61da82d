package pvesim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// TestErrorRate: injected 500s come before anything happens; the client
// retries GETs through them, never a POST.
func TestErrorRate(t *testing.T) {
	s := newSim(t, Options{Seed: 7})
	ctx := ctxT(t)
	s.SetFaults(Faults{ErrorRate: 1})
	r := s.raw(t, "GET", "/api2/json/version", "", "", "")
	if r.Status != 500 || r.Reason != "pvesim: injected fault (error rate 1.00)" {
		t.Errorf("got %d %q", r.Status, r.Reason)
	}
	if _, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101}); err == nil {
		t.Fatal("clone went through")
	}
	if _, ok := s.VM(101); ok {
		t.Error("a failed request acted")
	}
	n := 0
	for _, r := range s.Requests() {
		if r.Method == "POST" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the POST was sent %d times", n)
	}

	s.SetFaults(Faults{ErrorRate: 0.5})
	c := newClient(t, s.Server, "root@pam", "delegate", testTokenSecret, func(c *pve.Config) { c.RetryAttempts = 12 })
	for range 20 {
		if _, err := c.Version(ctx); err != nil {
			t.Fatalf("GET not retried through injected errors: %v", err)
		}
	}
	injected := 0
	for _, r := range s.Requests() {
		if r.Status == 500 && strings.HasPrefix(r.Reason, "pvesim: injected fault") {
			injected++
		}
	}
	if injected < 3 {
		t.Errorf("only %d injected errors at rate 0.5", injected)
	}
}

// TestTaskFailures: a task type made to fail ends with that status and
// leaves no trace of its operation.
func TestTaskFailures(t *testing.T) {
	s := newSim(t, Options{Faults: Faults{TaskFailures: map[string]string{
		"qmclone": "clone failed: lvcreate 'pve/vm-101-disk-0' error:   Volume group \"pve\" has insufficient free space",
	}}})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	if err != nil {
		t.Fatal(err)
	}
	te := taskErr(t, s, upid)
	if !strings.HasPrefix(te.ExitStatus, "clone failed: lvcreate") || te.Type != "qmclone" || te.ID != "9000" {
		t.Errorf("task error: %+v", te)
	}
	if _, err := s.c.VMConfig(ctx, "pve1", 101); !pve.IsNotFound(err) {
		t.Errorf("the failed clone left VM 101: %v", err)
	}
	s.SetFaults(Faults{TaskFailures: map[string]string{"qmstart": "start failed: QEMU exited with code 1"}})
	upid, _ = s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 102})
	if err := s.c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	upid, _ = s.c.StartVM(ctx, "pve1", 102)
	if te := taskErr(t, s, upid); te.ExitStatus != "start failed: QEMU exited with code 1" {
		t.Errorf("start: %v", te)
	}
	if st, _ := s.c.VMStatus(ctx, "pve1", 102); st.Status != "stopped" {
		t.Errorf("status after a failed start: %s", st.Status)
	}
}

// TestSlowTasks: a slow task is visibly running (no exitstatus) until
// its time is up.
func TestSlowTasks(t *testing.T) {
	s := newSim(t, Options{TaskDelays: map[string]time.Duration{"qmclone": 500 * time.Millisecond}})
	ctx := ctxT(t)
	start := time.Now()
	upid, _ := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	st, err := s.c.TaskStatus(ctx, "pve1", upid)
	if err != nil || !st.Running() || st.ExitStatus != "" {
		t.Errorf("slow task: %+v %v", st, err)
	}
	if err := s.c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("took %v", d)
	}
}

// TestAgentDown: the VM runs, its agent never answers, until the fault
// goes away.
func TestAgentDown(t *testing.T) {
	s := newSim(t, Options{Faults: Faults{AgentDown: true}})
	ctx := ctxT(t)
	upid, _ := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	s.c.WaitTask(ctx, "", upid)
	upid, _ = s.c.StartVM(ctx, "pve1", 101)
	if err := s.c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * s.opts.BootDelay)
	for _, call := range []func() error{
		func() error { return s.c.AgentPing(ctx, "pve1", 101) },
		func() error { _, err := s.c.AgentExec(ctx, "pve1", 101, []string{"true"}, nil); return err },
		func() error { _, err := s.c.AgentFileRead(ctx, "pve1", 101, "/etc/hostname"); return err },
	} {
		if err := call(); !pve.IsAgentNotRunning(err) {
			t.Errorf("agent down: %v", err)
		}
	}
	if st, _ := s.c.VMStatus(ctx, "pve1", 101); st.Status != "running" {
		t.Errorf("status %s", st.Status)
	}
	s.SetFaults(Faults{})
	waitAgent(t, s, 101)
	// An agent not configured is another error. Removing the option
	// from a running VM waits for its next start ([PENDING]).
	if err := s.c.SetVMConfig(ctx, "pve1", 101, pve.VMConfigUpdate{Delete: []string{"agent"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.c.AgentPing(ctx, "pve1", 101); err != nil {
		t.Errorf("agent removed while running: %v", err)
	}
	for _, f := range []func(context.Context, string, int) (string, error){s.c.StopVM, s.c.StartVM} {
		upid, err := f(ctx, "pve1", 101)
		if err == nil {
			err = s.c.WaitTask(ctx, "", upid)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.c.AgentPing(ctx, "pve1", 101); !pve.IsAgentNotConfigured(err) {
		t.Errorf("agent not configured: %v", err)
	}
}

// TestOfflineNode: an offline node is "offline", its VMs "unknown", and
// calls to it fail with 595 (retried by the client, in vain).
func TestOfflineNode(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2)})
	ctx := ctxT(t)
	if err := s.AddTemplate("pve2", 9001, "tpl2", TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	upid, _ := s.c.CloneVM(ctx, "pve2", 9001, pve.CloneOptions{NewID: 300})
	if err := s.c.WaitTask(ctx, "pve2", upid); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeOnline("pve2", false); err != nil {
		t.Fatal(err)
	}
	nodes, _ := s.c.Nodes(ctx)
	if len(nodes) != 2 || nodes[0].Status != "online" || nodes[1].Status != "offline" {
		t.Errorf("nodes: %+v", nodes)
	}
	res, _ := s.c.ClusterResources(ctx, pve.ResourceAll)
	seen := 0
	for _, r := range res {
		switch {
		case r.Type == "qemu" && r.Node == "pve2":
			seen++
			if r.Status != "unknown" {
				t.Errorf("VM on the offline node: %+v", r)
			}
		case r.Type == "node" && r.Node == "pve2":
			seen++
			if r.Status != "offline" {
				t.Errorf("offline node: %+v", r)
			}
		}
	}
	if seen != 3 {
		t.Errorf("resources: %+v", res)
	}
	_, err := s.c.VMConfig(ctx, "pve2", 300)
	var api *pve.APIError
	if !errors.As(err, &api) || api.StatusCode != 595 || api.Reason != "No route to host" {
		t.Errorf("call to the offline node: %v", err)
	}
	// Calls to the other node still work.
	if _, err := s.c.VMConfig(ctx, "pve1", tplID); err != nil {
		t.Errorf("online node: %v", err)
	}
	s.SetNodeOnline("pve2", true)
	if _, err := s.c.VMConfig(ctx, "pve2", 300); err != nil {
		t.Errorf("back online: %v", err)
	}
	if err := s.SetNodeOnline("pve9", false); err == nil {
		t.Error("unknown node accepted")
	}
}

// TestDaemonWorkers: a node's pvedaemon has three workers; an agent call
// to a guest still booting holds one for the ping's time-out, so a fourth
// call to the node (here another ping) waits for a worker.
func TestDaemonWorkers(t *testing.T) {
	s := newSim(t, Options{BootDelay: 10 * time.Second, AgentPingTimeout: 400 * time.Millisecond})
	ctx := ctxT(t)
	upid, err := s.c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: 101})
	mustTask(t, s, upid, err)
	upid, err = s.c.StartVM(ctx, "pve1", 101)
	mustTask(t, s, upid, err)
	c := newClient(t, s.Server, "root@pam", "delegate", testTokenSecret, func(c *pve.Config) { c.NodeCalls = -1 })
	before := len(s.Requests())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.AgentPing(ctx, "pve1", 101); !pve.IsAgentNotRunning(err) {
				t.Errorf("ping while booting: %v", err)
			}
		}()
	}
	wg.Wait()
	queued := 0
	for _, r := range s.Requests()[before:] {
		if strings.HasSuffix(r.Path, "/agent/ping") && r.Queued >= 300*time.Millisecond {
			queued++
		}
	}
	if queued != 1 {
		t.Errorf("%d of 4 pings waited for a worker, want 1", queued)
	}
}
