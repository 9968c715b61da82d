package pvesim

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/pve"
)

// TestRequestLogMatchesSchema drives a whole job's worth of calls
// through the pve client, then checks every request the simulator
// received against the schema, with the validator the simulator uses.
// (A test of the Proxmox backend can do the same with its own log.)
func TestRequestLogMatchesSchema(t *testing.T) {
	s := newSim(t, Options{})
	ctx := ctxT(t)
	c := s.c
	c.Version(ctx)
	c.Nodes(ctx)
	c.ClusterResources(ctx, pve.ResourceVM)
	id, _ := c.NextID(ctx)
	c.VMIDFree(ctx, id)
	cloneAndBoot(t, s, id, &pve.CloneOptions{Name: "job-x", Description: "log test", Full: ptr(false)})
	desc := "d"
	c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Tags: []string{"delegate"}, Description: &desc, Options: map[string]string{"onboot": "0"}})
	upid, _ := c.SetVMConfigAsync(ctx, "pve1", id, pve.VMConfigUpdate{Cores: 1})
	c.WaitTask(ctx, "", upid)
	c.VMConfig(ctx, "pve1", id)
	c.VMStatus(ctx, "pve1", id)
	c.AgentFileWrite(ctx, "pve1", id, "/workspace/job.sh", []byte("#!/bin/sh\necho job\n"))
	c.AgentFileRead(ctx, "pve1", id, "/workspace/job.sh")
	pid, _ := c.AgentExec(ctx, "pve1", id, []string{"/bin/sh", "/workspace/job.sh", ""}, []byte("stdin"))
	waitExec(t, s, id, pid)
	c.AgentNetworkInterfaces(ctx, "pve1", id)
	upid, _ = c.ResizeDisk(ctx, "pve1", id, "scsi0", "+1G")
	c.WaitTask(ctx, "", upid)
	upid, _ = c.ShutdownVM(ctx, "pve1", id, pve.ShutdownOptions{ForceStop: true})
	c.WaitTask(ctx, "", upid)
	upid, _ = c.StopVM(ctx, "pve1", id) // already stopped: nothing to do, OK
	c.WaitTask(ctx, "", upid)
	upid, _ = c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{Purge: true})
	c.WaitTask(ctx, "", upid)
	lines, _, _ := c.TaskLog(ctx, "", upid, 0, 10)
	if len(lines) == 0 {
		t.Error("no task log")
	}

	schema := s.Schema()
	reqs := s.Requests()
	methods := map[string]bool{}
	for _, r := range reqs {
		m, _, err := schema.Validate(r.Method, r.Path, r.Params)
		if err != nil {
			t.Errorf("%s %s %v: %v", r.Method, r.Path, r.Params, err)
			continue
		}
		methods[m.Method+" "+m.Path] = true
		if r.Status != 200 && !(r.Status == 500 && r.Reason == "QEMU guest agent is not running") {
			t.Errorf("%s %s: %d %s", r.Method, r.Path, r.Status, r.Reason)
		}
	}
	if len(methods) != 22 {
		t.Errorf("the flow used %d of the 22 methods: %v", len(methods), methods)
	}
}

// TestResponsesMatchSchema fetches each method's answer raw and checks
// its data against the method's "returns" schema.
func TestResponsesMatchSchema(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2)})
	id := cloneAndBoot(t, s, 150, nil)
	s.SetNodeOnline("pve2", false) // offline entries have their own shape
	ctx := ctxT(t)
	s.c.AgentFileWrite(ctx, "pve1", id, "/tmp/f", []byte("content"))
	upid, _ := s.c.StartVM(ctx, "pve1", id) // fails: already running
	s.c.WaitTask(ctx, "", upid)
	vm := fmt.Sprintf("/nodes/pve1/qemu/%d", id)
	gets := []string{
		"/version", "/nodes", "/cluster/resources", "/cluster/resources?type=vm", "/cluster/nextid",
		vm + "/config", "/nodes/pve1/qemu/9000/config", vm + "/status/current", "/nodes/pve1/qemu/9000/status/current",
		"/nodes/pve1/tasks/" + url.PathEscape(upid) + "/status", "/nodes/pve1/tasks/" + url.PathEscape(upid) + "/log",
		vm + "/agent/file-read?file=/tmp/f", vm + "/agent/network-get-interfaces",
	}
	check := func(method, path string, data any) {
		m, _, ok := s.Schema().Lookup(method, strings.SplitN(path, "?", 2)[0])
		if !ok {
			t.Fatalf("%s %s: no method", method, path)
		}
		if err := m.CheckReturns(data); err != nil {
			t.Errorf("%s %s: %v\n%v", method, path, err, data)
		}
	}
	for _, p := range gets {
		r := s.raw(t, "GET", "/api2/json"+p, "", "", "")
		if r.Status != 200 {
			t.Fatalf("GET %s: %d %s", p, r.Status, r.Reason)
		}
		check("GET", p, r.Body["data"])
	}
	pid, _ := s.c.AgentExec(ctx, "pve1", id, []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 1"}, nil)
	var data any
	for {
		r := s.raw(t, "GET", fmt.Sprintf("/api2/json%s/agent/exec-status?pid=%d", vm, pid), "", "", "")
		data = r.Body["data"]
		check("GET", vm+"/agent/exec-status", data)
		if data.(map[string]any)["exited"] == float64(1) {
			break
		}
	}
	want := `{"err-data":"err\n","err-truncated":0,"exitcode":1,"exited":1,"out-data":"out\n","out-truncated":0}`
	if got, _ := json.Marshal(data); string(got) != want {
		t.Errorf("exec-status:\n got %s\nwant %s", got, want)
	}
	posts := [][2]string{
		{vm + "/agent/ping", ""},
		{vm + "/agent/exec", `{"command":["true"]}`},
		{vm + "/agent/file-write", `{"file":"/tmp/g","content":"x"}`},
		{"/nodes/pve1/qemu/9000/clone", `{"newid":777}`},
		{vm + "/status/stop", ""},
		{"/nodes/pve1/qemu/150/config", `{"description":"x"}`},
		{"/nodes/pve1/qemu/9000/status/shutdown", ""},
	}
	for _, pb := range posts {
		p, body := pb[0], pb[1]
		ct := ""
		if body != "" {
			ct = "application/json"
		}
		r := s.raw(t, "POST", "/api2/json"+p, "", ct, body)
		if r.Status != 200 {
			t.Errorf("POST %s: %d %s", p, r.Status, r.Reason)
			continue
		}
		check("POST", p, r.Body["data"])
	}
}
