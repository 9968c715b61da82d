package e2e

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/pvesim"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listTools returns the names in tools/list, and its size in bytes.
func listTools(t *testing.T, cs *mcp.ClientSession) ([]string, int, *mcp.ListToolsResult) {
	t.Helper()
	res, err := cs.ListTools(testContext(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	raw, _ := json.Marshal(res)
	return names, len(raw), res
}

// TestToolsets: delegate serve offers the job tools by default, the
// Proxmox admin tools with --toolsets proxmox (alone, a Proxmox MCP
// server), or both; an unknown toolset stops it at start, naming the
// variable. The size of each tools/list is printed.
func TestToolsets(t *testing.T) {
	_, simEnv := simCluster(t, 1)

	cs, _, _ := stdioSession(t, t.TempDir(), "")
	jobs, jobsBytes, _ := listTools(t, cs)
	if slices.ContainsFunc(jobs, func(n string) bool { return strings.HasPrefix(n, "proxmox_") }) || !slices.Contains(jobs, "submit_job") {
		t.Errorf("default tools: %v", jobs)
	}
	cs, _, _ = stdioSession(t, t.TempDir(), "", append(simEnv, "DELEGATE_TOOLSETS=proxmox")...)
	admin, adminBytes, res := listTools(t, cs)
	if len(admin) != 24 || slices.Contains(admin, "submit_job") {
		t.Errorf("proxmox tools: %v", admin)
	}
	for _, tool := range res.Tools {
		a := tool.Annotations
		if a == nil || a.OpenWorldHint == nil || !*a.OpenWorldHint || a.DestructiveHint == nil {
			t.Errorf("%s: annotations %+v", tool.Name, a)
		}
		if (tool.Name == "proxmox_guest_stop" || tool.Name == "proxmox_guest_delete") && !*a.DestructiveHint {
			t.Errorf("%s is not destructive", tool.Name)
		}
		if tool.Name == "proxmox_get_nodes" && !a.ReadOnlyHint {
			t.Errorf("%s is not read-only", tool.Name)
		}
	}
	cs, _, _ = stdioSession(t, t.TempDir(), "", append(simEnv, "DELEGATE_TOOLSETS=jobs,proxmox")...)
	both, bothBytes, _ := listTools(t, cs)
	if len(both) != len(jobs)+24 {
		t.Errorf("both toolsets: %d tools", len(both))
	}
	t.Logf("tools/list bytes: jobs %d (%d tools), proxmox %d (%d tools), jobs,proxmox %d (%d tools)",
		jobsBytes, len(jobs), adminBytes, len(admin), bothBytes, len(both))

	// --toolsets overrides the environment.
	cmd := exec.Command(binary, "serve", "--toolsets", "proxmox,nope")
	cmd.Env = serverEnv(t.TempDir(), simEnv...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), `--toolsets (env DELEGATE_TOOLSETS): unknown toolset "nope"`) {
		t.Errorf("serve --toolsets proxmox,nope: %v\n%s", err, out)
	}
	cmd = exec.Command(binary, "serve")
	cmd.Env = serverEnv(t.TempDir(), "DELEGATE_TOOLSETS=proxmox")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "DELEGATE_TOOLSETS includes proxmox") ||
		!strings.Contains(string(out), "PROXMOX_HOST: must be set") {
		t.Errorf("proxmox toolset without a token: %v\n%s", err, out)
	}
}

// TestProxmoxToolsetThroughBinary: through the built binary on the
// simulator: read tools answer, a change without PROXMOX_ALLOW_ELEVATED
// names it, and with it the tools leave a running job's VM alone unless
// forced, and work on containers.
func TestProxmoxToolsetThroughBinary(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 3)
	if err := sim.AddContainer("pve2", 300, "web", pvesim.ContainerSpec{Running: true}); err != nil {
		t.Fatal(err)
	}
	env = append(env, "DELEGATE_TOOLSETS=jobs,proxmox")

	// Read-only, with the local backend: the toolset needs only the
	// PROXMOX_* token (and a second server with the proxmox backend on the
	// same cluster would sweep the other's VMs as orphans).
	ro, _, _ := stdioSession(t, t.TempDir(), "", append(env, "DELEGATE_BACKEND=local", "DEFAULT_VM_TEMPLATE=")...)
	nodes := call[struct {
		Nodes []struct {
			Node   string `json:"node"`
			Status string `json:"status"`
		} `json:"nodes"`
	}](t, ro, "proxmox_get_nodes", map[string]any{})
	if len(nodes.Nodes) != 3 || nodes.Nodes[2].Status != "online" {
		t.Errorf("nodes %+v", nodes)
	}
	res, err := ro.CallTool(testContext(t), &mcp.CallToolParams{Name: "proxmox_guest_stop",
		Arguments: map[string]any{"node": "pve2", "vmid": 300, "type": "lxc"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "PROXMOX_ALLOW_ELEVATED=true") {
		t.Fatalf("stop without the setting: %v %s", err, text(res))
	}

	cs, _, _ := stdioSession(t, t.TempDir(), "", append(env, "PROXMOX_ALLOW_ELEVATED=true")...)
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}})
	waitFor(t, cs, job.JobID, "running")
	vms := slices.DeleteFunc(jobVMs(sim), func(v pvesim.VM) bool { return v.Type != "qemu" })
	if len(vms) != 1 {
		t.Fatalf("job VMs %+v", vms)
	}
	vm := map[string]any{"node": vms[0].Node, "vmid": vms[0].VMID}
	cmd := map[string]any{"node": vms[0].Node, "vmid": vms[0].VMID, "command": "echo inside"}
	for tool, args := range map[string]map[string]any{"proxmox_guest_stop": vm, "proxmox_guest_delete": vm, "proxmox_guest_reboot": vm,
		"proxmox_execute_vm_command": cmd} {
		res, err := cs.CallTool(testContext(t), &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil || !res.IsError || !strings.Contains(text(res), "belongs to delegate job "+job.JobID) {
			t.Errorf("%s of the job's VM: %v %s", tool, err, text(res))
		}
	}
	// Forced, a command runs in it.
	cmd["force"] = true
	out := call[struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitcode"`
	}](t, cs, "proxmox_execute_vm_command", cmd)
	if out.Stdout != "inside\n" {
		t.Errorf("exec %+v", out)
	}
	// Forced, the stop goes through and the job sees its VM gone.
	forced := map[string]any{"node": vms[0].Node, "vmid": vms[0].VMID, "force": true}
	if st := call[struct {
		ExitStatus string `json:"exitstatus"`
	}](t, cs, "proxmox_guest_stop", forced); st.ExitStatus != "OK" {
		t.Errorf("forced stop %+v", st)
	}
	st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 50})
	if st.Status == "running" || st.Status == "success" {
		t.Errorf("the job after its VM stopped: %+v", st)
	}

	// Containers: status, stop; exec is refused.
	ct := map[string]any{"node": "pve2", "vmid": 300, "type": "lxc"}
	call[struct{}](t, cs, "proxmox_guest_stop", ct)
	status := call[struct {
		Status string `json:"status"`
	}](t, cs, "proxmox_guest_status", ct)
	if status.Status != "stopped" {
		t.Errorf("container after stop: %+v", status)
	}
	res, err = cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "proxmox_execute_vm_command",
		Arguments: map[string]any{"node": "pve2", "vmid": 300, "type": "lxc", "command": "id"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "no exec for containers") {
		t.Errorf("exec in a container: %v %s", err, text(res))
	}
	res, err = cs.CallTool(testContext(t), &mcp.CallToolParams{Name: "proxmox_guest_status",
		Arguments: map[string]any{"node": "pve3", "vmid": 4242}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "Configuration file 'nodes/pve3/qemu-server/4242.conf' does not exist") {
		t.Errorf("unknown VM: %v %s", err, text(res))
	}
}
