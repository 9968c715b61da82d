package pvetools

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/testsim"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestMain(m *testing.M) {
	// The simulator's guests run in local sandboxes, whose helpers are
	// this test binary.
	if local.Reexec() {
		return
	}
	os.Exit(m.Run())
}

const (
	tokenID     = "admin@pve!tools"
	tokenSecret = "0d9f5a7e-2b1c-4e3f-8a6b-5c4d3e2f1a0b"
	tplID       = 9000
)

// harness is a 3-node simulator (a VM template on pve1, containers 200
// running and 201 stopped on pve2) and an MCP client session to a server
// with the toolset.
type harness struct {
	sim *pvesim.Server
	cs  *mcp.ClientSession
}

type options struct {
	elevated bool
	jobs     delegate.JobService
	wait     time.Duration
	sim      func(*pvesim.Options)
	// jobToken: the tools use the least-privilege token the README
	// documents for jobs (pvesim.CreateJobToken), not an administrator's.
	jobToken bool
	// observe hears the client's requests, as the metrics do.
	observe pve.Observer
	// log is the toolset's (nil: none).
	log *slog.Logger
}

func newHarness(t *testing.T, o options) *harness {
	t.Helper()
	sim := testsim.Start(t, pvesim.DefaultNodes(3), o.sim)
	if err := sim.AddToken(pvesim.Token{ID: tokenID, Secret: tokenSecret, Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddTemplate("pve1", tplID, "debian-tpl", pvesim.TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddContainer("pve2", 200, "web", pvesim.ContainerSpec{Running: true, Cores: 1}); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddContainer("pve2", 201, "db", pvesim.ContainerSpec{}); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(sim.URL())
	port, _ := strconv.Atoi(u.Port())
	user, name, _ := strings.Cut(tokenID, "!")
	secret := tokenSecret
	if o.jobToken {
		jt, err := sim.CreateJobToken(testCtx(t), pvesim.Token{ID: tokenID, Secret: tokenSecret})
		if err != nil {
			t.Fatal(err)
		}
		user, name, secret = jt.User, jt.TokenName, jt.Secret
	}
	client, err := pve.New(pve.Config{Host: u.Hostname(), Port: port, User: user, TokenName: name, TokenValue: secret,
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), TaskPollInterval: 20 * time.Millisecond,
		RetryDelay: 10 * time.Millisecond, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if o.observe != nil {
		client.Observe(o.observe)
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "delegate-test", Version: "1"}, nil)
	if err := Register(server, Config{Client: client, AllowElevated: o.elevated, Jobs: o.jobs, Wait: o.wait,
		PollInterval: 20 * time.Millisecond, Logger: o.log}); err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return &harness{sim: sim, cs: cs}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// callRaw calls a tool and returns its result (error or not).
func (h *harness) callRaw(t *testing.T, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := h.cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// call calls a tool that must succeed and decodes its structured result.
func call[T any](t *testing.T, h *harness, tool string, args any) T {
	t.Helper()
	res := h.callRaw(t, tool, args)
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", tool, args, resultText(res))
	}
	var out T
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %s: %v", tool, raw, err)
	}
	// The client decodes structured content into a map; the text must
	// hold the same JSON.
	var fromText, fromStruct any
	json.Unmarshal([]byte(resultText(res)), &fromText)
	json.Unmarshal(raw, &fromStruct)
	if !reflect.DeepEqual(fromText, fromStruct) {
		t.Errorf("%s: text content %s differs from the structured %s", tool, resultText(res), raw)
	}
	return out
}

// untilAgent calls a guest agent tool until the guest's agent answers
// (the guest boots meanwhile), and returns its result.
func (h *harness) untilAgent(t *testing.T, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	var res *mcp.CallToolResult
	testkit.Eventually(t, 30*time.Second, tool+" past the agent's start", func() bool {
		res = h.callRaw(t, tool, args)
		if res.IsError && !strings.Contains(resultText(res), "QEMU guest agent is not running") {
			t.Fatalf("%s: %s", tool, resultText(res))
		}
		return !res.IsError
	})
	return res
}

// callErr calls a tool that must fail and returns its message.
func callErr(t *testing.T, h *harness, tool string, args any) string {
	t.Helper()
	res := h.callRaw(t, tool, args)
	if !res.IsError {
		t.Fatalf("%s %v: succeeded, want an error: %s", tool, args, resultText(res))
	}
	return resultText(res)
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s: %q does not say %q", what, got, w)
		}
	}
}

// issueTools are the tools issue 10 names, exactly.
var issueTools = []string{
	"proxmox_get_nodes", "proxmox_get_vms", "proxmox_get_vm_status", "proxmox_execute_vm_command", "proxmox_get_storage",
	"proxmox_get_cluster_status", "proxmox_guest_list", "proxmox_guest_status", "proxmox_guest_config", "proxmox_guest_start",
	"proxmox_guest_stop", "proxmox_guest_shutdown", "proxmox_guest_reboot", "proxmox_guest_clone", "proxmox_guest_delete",
	"proxmox_guest_config_update", "proxmox_guest_resize", "proxmox_get_next_vmid", "proxmox_node_task",
	"proxmox_storage_content", "proxmox_guest_snapshot", "proxmox_agent_exec", "proxmox_agent_file",
}

// TestToolsListed: every tool of the issue is listed with its hints:
// read-only tools readOnlyHint, stop, delete and snapshot (rollback)
// destructiveHint, all openWorldHint (they reach a cluster); input
// schemas state the choices; tools/list's size is logged.
func TestToolsListed(t *testing.T) {
	h := newHarness(t, options{})
	res, err := h.cs.ListTools(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	readOnly := map[string]bool{}
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		a := tool.Annotations
		if a == nil || a.DestructiveHint == nil || a.OpenWorldHint == nil || !*a.OpenWorldHint {
			t.Errorf("%s: annotations %+v", tool.Name, a)
			continue
		}
		readOnly[tool.Name] = a.ReadOnlyHint
		if a.ReadOnlyHint == Elevated(tool.Name) && tool.Name != "proxmox_guest_snapshot" {
			t.Errorf("%s: readOnlyHint %v but elevated %v", tool.Name, a.ReadOnlyHint, Elevated(tool.Name))
		}
		if a.ReadOnlyHint && *a.DestructiveHint {
			t.Errorf("%s: read-only and destructive", tool.Name)
		}
		if tool.OutputSchema == nil || len(tool.Description) > 120 {
			t.Errorf("%s: output schema %v, description of %d bytes", tool.Name, tool.OutputSchema, len(tool.Description))
		}
		schema, _ := json.Marshal(tool.InputSchema)
		if strings.Contains(string(schema), `"type"`) && strings.Contains(string(schema), `"type":{`) &&
			!strings.Contains(string(schema), `"enum":["qemu","lxc"]`) {
			t.Errorf("%s: type without its choices: %s", tool.Name, schema)
		}
	}
	// Issue 10's tools, and issue 20's pending view.
	want := append(slices.Clone(issueTools), "proxmox_guest_pending")
	if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(want))) {
		t.Errorf("tools %v\nwant %v", names, want)
	}
	for _, name := range []string{"proxmox_guest_stop", "proxmox_guest_delete", "proxmox_guest_snapshot"} {
		for _, tool := range res.Tools {
			if tool.Name == name && !*tool.Annotations.DestructiveHint {
				t.Errorf("%s is not destructive", name)
			}
		}
	}
	for _, name := range []string{"proxmox_get_nodes", "proxmox_get_vms", "proxmox_get_vm_status", "proxmox_get_storage",
		"proxmox_get_cluster_status", "proxmox_guest_list", "proxmox_guest_status", "proxmox_guest_config", "proxmox_guest_pending",
		"proxmox_get_next_vmid", "proxmox_node_task", "proxmox_storage_content"} {
		if !readOnly[name] {
			t.Errorf("%s is not read-only", name)
		}
	}
	raw, _ := json.Marshal(res)
	t.Logf("tools/list of the proxmox toolset: %d bytes, %d tools", len(raw), len(res.Tools))
}

type nodesOut struct {
	Nodes []NodeOut `json:"nodes"`
}

// TestReadTools: the read-only tools answer on a 3-node cluster, without
// PROXMOX_ALLOW_ELEVATED.
func TestReadTools(t *testing.T) {
	h := newHarness(t, options{})
	nodes := call[nodesOut](t, h, "proxmox_get_nodes", map[string]any{})
	if len(nodes.Nodes) != 3 || nodes.Nodes[0].Node != "pve1" || nodes.Nodes[0].Status != "online" || nodes.Nodes[0].MaxMem == 0 {
		t.Errorf("nodes %+v", nodes)
	}
	all := call[GuestsOut](t, h, "proxmox_get_vms", map[string]any{})
	if len(all.Guests) != 3 || all.Guests[0].VMID != 200 || all.Guests[0].Type != "lxc" || all.Guests[0].Node != "pve2" ||
		all.Guests[2].VMID != tplID || !all.Guests[2].Template || all.Guests[2].Type != "qemu" {
		t.Errorf("every guest: %+v", all)
	}
	cts := call[GuestsOut](t, h, "proxmox_guest_list", map[string]any{"node": "pve2", "type": "lxc"})
	if len(cts.Guests) != 2 || cts.Guests[0].Name != "web" || cts.Guests[0].Status != "running" || cts.Guests[1].Status != "stopped" {
		t.Errorf("containers of pve2: %+v", cts)
	}
	if vms := call[GuestsOut](t, h, "proxmox_guest_list", map[string]any{"node": "pve2", "type": "qemu"}); len(vms.Guests) != 0 {
		t.Errorf("VMs of pve2: %+v", vms)
	}
	for _, tool := range []string{"proxmox_get_vm_status", "proxmox_guest_status"} {
		st := call[StatusOut](t, h, tool, map[string]any{"node": "pve1", "vmid": tplID})
		if st.Status != "stopped" || !st.Template || st.Name != "debian-tpl" || st.MaxMem != 2048<<20 || st.Type != "qemu" {
			t.Errorf("%s: %+v", tool, st)
		}
	}
	ct := call[StatusOut](t, h, "proxmox_guest_status", map[string]any{"node": "pve2", "vmid": 200, "type": "lxc"})
	if ct.Status != "running" || ct.Name != "web" || ct.Uptime < 0 || ct.PID == 0 {
		t.Errorf("container status %+v", ct)
	}
	conf := call[ConfigOut](t, h, "proxmox_guest_config", map[string]any{"node": "pve1", "vmid": tplID})
	if conf.Digest == "" || conf.Config["template"] != "1" || conf.Config["name"] != "debian-tpl" || conf.Config["cores"] != "2" {
		t.Errorf("config %+v", conf)
	}
	ctConf := call[ConfigOut](t, h, "proxmox_guest_config", map[string]any{"node": "pve2", "vmid": 201, "type": "lxc"})
	if ctConf.Config["hostname"] != "db" || ctConf.Type != "lxc" {
		t.Errorf("container config %+v", ctConf)
	}
	storages := call[StoragesOut](t, h, "proxmox_get_storage", map[string]any{})
	if len(storages.Storages) != 6 || storages.Storages[0].Node != "pve1" || storages.Storages[5].Node != "pve3" || storages.Storages[0].Total == 0 {
		t.Errorf("storages %+v", storages)
	}
	if one := call[StoragesOut](t, h, "proxmox_get_storage", map[string]any{"node": "pve2"}); len(one.Storages) != 2 {
		t.Errorf("storages of pve2 %+v", one)
	}
	cl := call[ClusterOut](t, h, "proxmox_get_cluster_status", map[string]any{})
	if cl.Cluster == nil || cl.Cluster.Nodes != 3 || !cl.Cluster.Quorate || len(cl.Nodes) != 3 || !cl.Nodes[0].Local || !cl.Nodes[2].Online {
		t.Errorf("cluster %+v", cl)
	}
	if next := call[NextIDOut](t, h, "proxmox_get_next_vmid", map[string]any{}); next.VMID != 100 {
		t.Errorf("next id %+v", next)
	}
	vols := call[ContentOut](t, h, "proxmox_storage_content", map[string]any{"node": "pve1", "storage": "local-lvm"})
	if len(vols.Volumes) != 1 || vols.Volumes[0].VolID != "local-lvm:base-9000-disk-0" || vols.Volumes[0].VMID != tplID {
		t.Errorf("content %+v", vols)
	}
	tasks := call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve1", "action": "list"})
	if len(tasks.Tasks) != 0 || tasks.Total != 0 {
		t.Errorf("tasks of a new node %+v", tasks)
	}
	snaps := call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "list"})
	if len(snaps.Snapshots) != 0 || snaps.Parent != "" {
		t.Errorf("snapshots of the template %+v", snaps)
	}
	// An unknown VM: Proxmox's reason.
	msg := callErr(t, h, "proxmox_guest_status", map[string]any{"node": "pve1", "vmid": 4242})
	wantContains(t, "unknown VM", msg, "Configuration file 'nodes/pve1/qemu-server/4242.conf' does not exist")
	msg = callErr(t, h, "proxmox_guest_config", map[string]any{"node": "pve3", "vmid": 200, "type": "lxc"})
	wantContains(t, "container on another node", msg, "Configuration file 'nodes/pve3/lxc/200.conf' does not exist")
	if len(h.sim.Tasks()) != 0 {
		t.Errorf("read tools started tasks: %+v", h.sim.Tasks())
	}
}

// elevatedCalls are a call of every tool (or action) that changes the
// cluster.
var elevatedCalls = []struct {
	tool string
	args map[string]any
}{
	{"proxmox_execute_vm_command", map[string]any{"node": "pve1", "vmid": 100, "command": "true"}},
	{"proxmox_guest_start", map[string]any{"node": "pve2", "vmid": 201, "type": "lxc"}},
	{"proxmox_guest_stop", map[string]any{"node": "pve2", "vmid": 200, "type": "lxc"}},
	{"proxmox_guest_shutdown", map[string]any{"node": "pve2", "vmid": 200, "type": "lxc"}},
	{"proxmox_guest_reboot", map[string]any{"node": "pve2", "vmid": 200, "type": "lxc"}},
	{"proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID}},
	{"proxmox_guest_delete", map[string]any{"node": "pve2", "vmid": 201, "type": "lxc"}},
	{"proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": tplID, "config": map[string]any{"cores": 4}}},
	{"proxmox_guest_resize", map[string]any{"node": "pve1", "vmid": tplID, "disk": "scsi0", "size": "+1G"}},
	{"proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "create", "snapname": "s1"}},
	{"proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "rollback", "snapname": "s1"}},
	{"proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "delete", "snapname": "s1"}},
	{"proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": 100, "command": []string{"true"}}},
	{"proxmox_agent_file", map[string]any{"node": "pve1", "vmid": 100, "action": "write", "file": "/tmp/x", "content": "x"}},
	{"proxmox_agent_file", map[string]any{"node": "pve1", "vmid": 100, "action": "read", "file": "/etc/hostname"}},
}

// TestElevatedRefused: without PROXMOX_ALLOW_ELEVATED, every tool that
// changes anything answers an error naming the setting, and the cluster
// is left as it was.
func TestElevatedRefused(t *testing.T) {
	h := newHarness(t, options{})
	before := h.sim.VMs()
	for _, c := range elevatedCalls {
		msg := callErr(t, h, c.tool, c.args)
		wantContains(t, c.tool, msg, "PROXMOX_ALLOW_ELEVATED=true")
	}
	if tasks := h.sim.Tasks(); len(tasks) != 0 {
		t.Errorf("tasks ran: %+v", tasks)
	}
	after := h.sim.VMs()
	for i := range before {
		if before[i].Status != after[i].Status || before[i].Config["cores"] != after[i].Config["cores"] {
			t.Errorf("%d changed: %+v -> %+v", before[i].VMID, before[i], after[i])
		}
	}
}

// TestVMLife: with PROXMOX_ALLOW_ELEVATED, a VM's whole life through the
// tools: next id, clone, start, a command and its output, files, config,
// snapshots, rollback, reboot, resize, shutdown, stop, delete.
func TestVMLife(t *testing.T) {
	h := newHarness(t, options{elevated: true})
	next := call[NextIDOut](t, h, "proxmox_get_next_vmid", map[string]any{}).VMID
	clone := call[TaskOut](t, h, "proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID, "newid": next, "name": "work"})
	if clone.Status != "stopped" || clone.ExitStatus != "OK" || clone.VMID != next || !strings.Contains(clone.UPID, ":qmclone:9000:") {
		t.Fatalf("clone %+v", clone)
	}
	vm := map[string]any{"node": "pve1", "vmid": next}
	if st := call[TaskOut](t, h, "proxmox_guest_start", vm); st.ExitStatus != "OK" {
		t.Fatalf("start %+v", st)
	}
	// The agent answers once the guest booted.
	var out ExecOut
	res := h.untilAgent(t, "proxmox_execute_vm_command", map[string]any{"node": "pve1", "vmid": next,
		"command": "echo hello from $(uname -s); echo oops >&2; exit 3"})
	raw, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(raw, &out)
	if !out.Exited || out.ExitCode == nil || *out.ExitCode != 3 || out.Stdout != "hello from Linux\n" || out.Stderr != "oops\n" {
		t.Errorf("exec %+v", out)
	}
	argv := call[ExecOut](t, h, "proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": next,
		"command": []string{"printf", "%s|", "$(not a shell)", "two words"}})
	if argv.Stdout != "$(not a shell)|two words|" || *argv.ExitCode != 0 {
		t.Errorf("argv exec %+v", argv)
	}

	// Files: text, then binary larger than one agent write, in parts.
	w := call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "write",
		"file": "/tmp/note.txt", "content": "héllo\n"})
	if w.Bytes != 7 || w.Parts != 1 {
		t.Errorf("write %+v", w)
	}
	r := call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "read", "file": "/tmp/note.txt"})
	if r.Content != "héllo\n" || r.Encoding != "text" || r.Bytes != 7 {
		t.Errorf("read %+v", r)
	}
	blob := make([]byte, 3*pve.MaxFileWrite+123)
	rand.Read(blob)
	w = call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "write",
		"file": "/workspace/blob.bin", "content": base64.StdEncoding.EncodeToString(blob), "encoding": "base64"})
	if w.Bytes != len(blob) || w.Parts != 4 {
		t.Errorf("large write %+v", w)
	}
	r = call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "read",
		"file": "/workspace/blob.bin", "encoding": "base64"})
	if got, _ := base64.StdEncoding.DecodeString(r.Content); string(got) != string(blob) {
		t.Errorf("large read: %d bytes, want %d", len(got), len(blob))
	}
	msg := callErr(t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "read", "file": "/workspace/blob.bin"})
	wantContains(t, "binary as text", msg, "not UTF-8", "base64")
	ls := call[ExecOut](t, h, "proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": next, "command": "ls /workspace"})
	if ls.Stdout != "blob.bin\n" {
		t.Errorf("parts left behind: %q", ls.Stdout)
	}
	msg = callErr(t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": next, "action": "read", "file": "/nope"})
	wantContains(t, "missing file", msg, "Agent error", "No such file or directory")

	// Config and snapshots. The VM runs: cores change at its next start
	// (the pending view says so), description and onboot at once. The
	// snapshot keeps what it runs with; a rollback brings it back (and
	// stops the VM), pending changes gone.
	cfg := call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": next,
		"config": map[string]any{"cores": 1, "description": "tools test", "onboot": true}})
	if cfg.ExitStatus != "OK" || !strings.Contains(cfg.UPID, ":qmconfig:") {
		t.Errorf("config update %+v", cfg)
	}
	pending := call[PendingOut](t, h, "proxmox_guest_pending", vm)
	if len(pending.Changes) != 1 || pending.Changes[0] != (PendingChange{Option: "cores", Current: "2", Next: "1"}) {
		t.Errorf("pending %+v", pending)
	}
	snap := call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": next, "action": "create",
		"snapname": "before", "description": "one core"})
	if snap.ExitStatus != "OK" {
		t.Errorf("snapshot %+v", snap)
	}
	list := call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": next, "action": "list"})
	if len(list.Snapshots) != 1 || list.Snapshots[0].Name != "before" || list.Snapshots[0].Description != "one core" || list.Parent != "before" {
		t.Errorf("snapshots %+v", list)
	}
	call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": next,
		"config": map[string]any{"cores": 4, "delete": "onboot"}})
	conf := call[ConfigOut](t, h, "proxmox_guest_config", vm)
	if conf.Config["cores"] != "4" || conf.Config["onboot"] != "" {
		t.Errorf("config after update %+v", conf.Config)
	}
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": next, "action": "rollback", "snapname": "before"})
	conf = call[ConfigOut](t, h, "proxmox_guest_config", vm)
	if conf.Config["cores"] != "2" || conf.Config["onboot"] != "1" || conf.Config["description"] != "tools test" {
		t.Errorf("config after rollback %+v", conf.Config)
	}
	if p := call[PendingOut](t, h, "proxmox_guest_pending", vm); len(p.Changes) != 0 {
		t.Errorf("pending after rollback %+v", p)
	}
	if st := call[StatusOut](t, h, "proxmox_guest_status", vm); st.Status != "stopped" {
		t.Errorf("after rollback: %s", st.Status)
	}
	call[TaskOut](t, h, "proxmox_guest_start", vm)
	if rb := call[TaskOut](t, h, "proxmox_guest_reboot", vm); !strings.Contains(rb.UPID, ":qmreboot:") || rb.ExitStatus != "OK" {
		t.Errorf("reboot %+v", rb)
	}
	call[SnapshotOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": next, "action": "delete", "snapname": "before"})
	if rs := call[TaskOut](t, h, "proxmox_guest_resize", map[string]any{"node": "pve1", "vmid": next, "disk": "scsi0", "size": "+2G"}); rs.ExitStatus != "OK" {
		t.Errorf("resize %+v", rs)
	}
	if conf := call[ConfigOut](t, h, "proxmox_guest_config", vm); !strings.Contains(conf.Config["scsi0"], "size=10G") {
		t.Errorf("disk after resize: %s", conf.Config["scsi0"])
	}
	msg = callErr(t, h, "proxmox_guest_delete", vm)
	wantContains(t, "delete running", msg, fmt.Sprintf("VM %d is running - destroy failed", next))
	call[TaskOut](t, h, "proxmox_guest_shutdown", map[string]any{"node": "pve1", "vmid": next, "forceStop": true, "timeout": 5})
	if st := call[TaskOut](t, h, "proxmox_guest_stop", vm); st.ExitStatus != "OK" {
		t.Errorf("stop %+v", st)
	}
	tasks := call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve1", "action": "list", "vmid": next, "typefilter": "qmstop"})
	if len(tasks.Tasks) != 1 || tasks.Tasks[0].Status != "OK" || tasks.Tasks[0].User != tokenID {
		t.Errorf("stop tasks %+v", tasks)
	}
	logs := call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve1", "action": "log", "upid": clone.UPID})
	if len(logs.Lines) == 0 || logs.Lines[len(logs.Lines)-1] != "TASK OK" {
		t.Errorf("clone log %+v", logs)
	}
	status := call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve1", "action": "status", "upid": clone.UPID})
	if status.Status != "stopped" || status.ExitStatus != "OK" || status.Type != "qmclone" {
		t.Errorf("clone status %+v", status)
	}
	if del := call[TaskOut](t, h, "proxmox_guest_delete", map[string]any{"node": "pve1", "vmid": next, "purge": true}); del.ExitStatus != "OK" {
		t.Errorf("delete %+v", del)
	}
	msg = callErr(t, h, "proxmox_guest_status", vm)
	wantContains(t, "deleted VM", msg, fmt.Sprintf("Configuration file 'nodes/pve1/qemu-server/%d.conf' does not exist", next))

	// A clone without newid takes the next free id.
	auto := call[TaskOut](t, h, "proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID})
	if auto.VMID != next {
		t.Errorf("automatic newid %d, want %d", auto.VMID, next)
	}
	// A failed task is an error with Proxmox's message.
	msg = callErr(t, h, "proxmox_guest_start", map[string]any{"node": "pve1", "vmid": tplID})
	wantContains(t, "start of a template", msg, "task qmstart failed", "you can't start a vm if it's a template", "proxmox_node_task")
}

// TestContainerTools: containers list, start, stop, shut down, reboot and
// go; exec is refused because the API has none for them.
func TestContainerTools(t *testing.T) {
	h := newHarness(t, options{elevated: true})
	ct := func(id int) map[string]any { return map[string]any{"node": "pve2", "vmid": id, "type": "lxc"} }
	if st := call[TaskOut](t, h, "proxmox_guest_start", ct(201)); !strings.Contains(st.UPID, ":vzstart:201:") {
		t.Errorf("start %+v", st)
	}
	msg := callErr(t, h, "proxmox_guest_start", ct(201))
	wantContains(t, "start twice", msg, "CT 201 already running")
	call[TaskOut](t, h, "proxmox_guest_reboot", ct(201))
	call[TaskOut](t, h, "proxmox_guest_shutdown", ct(201))
	if st := call[StatusOut](t, h, "proxmox_guest_status", ct(201)); st.Status != "stopped" {
		t.Errorf("after shutdown %+v", st)
	}
	msg = callErr(t, h, "proxmox_guest_stop", ct(201))
	wantContains(t, "stop a stopped CT", msg, "CT 201 not running")
	call[TaskOut](t, h, "proxmox_guest_stop", ct(200))
	call[TaskOut](t, h, "proxmox_guest_delete", ct(201))
	list := call[GuestsOut](t, h, "proxmox_guest_list", map[string]any{"type": "lxc"})
	if len(list.Guests) != 1 || list.Guests[0].VMID != 200 || list.Guests[0].Status != "stopped" {
		t.Errorf("containers left %+v", list)
	}
	for _, tool := range []string{"proxmox_execute_vm_command"} {
		msg := callErr(t, h, tool, map[string]any{"node": "pve2", "vmid": 200, "type": "lxc", "command": "id"})
		wantContains(t, tool, msg, "type: lxc", "no exec for containers")
	}
}

// TestArgumentErrors: arguments are refused naming the field and the rule.
func TestArgumentErrors(t *testing.T) {
	h := newHarness(t, options{elevated: true})
	for _, c := range []struct {
		tool string
		args any
		want string
	}{
		{"proxmox_guest_status", map[string]any{"node": "pve1", "vmidd": 100}, "vmidd: unknown field (known: node, vmid, type)"},
		{"proxmox_guest_status", map[string]any{"node": "pve1", "vmid": 100, "vm": 1}, "vm: unknown field (known: node, vmid, type)"},
		{"proxmox_guest_status", json.RawMessage(`{"node":"pve1","vmid":100,"vmid":101}`), "vmid: duplicate key"},
		{"proxmox_guest_config_update", json.RawMessage(`{"node":"pve1","vmid":100,"config":{"cores":1,"cores":2}}`), "config.cores: duplicate key"},
		{"proxmox_guest_status", map[string]any{"node": "pve1", "vmid": "100"}, "vmid: must be an integer (got a string)"},
		{"proxmox_guest_status", map[string]any{"node": "pve1", "vmid": 7}, "vmid: must be a VM id from 100 to 999999999 (got 7)"},
		{"proxmox_guest_status", map[string]any{"node": "pve 1", "vmid": 100}, "node: must be a node name"},
		{"proxmox_guest_status", map[string]any{"node": "pve1", "vmid": 100, "type": "kvm"}, `type: must be qemu or lxc (got "kvm")`},
		{"proxmox_node_task", map[string]any{"node": "pve1", "action": "kill"}, `action: must be list, status or log (got "kill")`},
		{"proxmox_node_task", map[string]any{"node": "pve1", "action": "log"}, "upid: required for action log"},
		{"proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "create"}, "snapname: required for action create"},
		{"proxmox_agent_file", map[string]any{"node": "pve1", "vmid": 100, "action": "read", "file": "etc/passwd"}, "file: must be an absolute path"},
		{"proxmox_agent_file", map[string]any{"node": "pve1", "vmid": 100, "action": "write", "file": "/x", "content": "!!", "encoding": "base64"}, "content: is not valid base64"},
		{"proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": 100, "command": []string{}}, "command: must name a program first"},
		{"proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": 100, "command": 5}, "command: must be an array of strings"},
		{"proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": 100, "config": map[string]any{"vmid": 5}}, "config.vmid: is not an option this tool sets"},
		{"proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": 100, "config": map[string]any{"net0": map[string]any{}}}, "config.net0: must be a string, a number or true/false"},
		// Proxmox's own checks come back in its words.
		{"proxmox_guest_resize", map[string]any{"node": "pve1", "vmid": tplID, "disk": "scsi0", "size": "10GB"}, "Proxmox: Parameter verification failed.; size: value does not match the regex pattern"},
		{"proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": tplID, "action": "create", "snapname": "1st"}, "snapname: invalid format"},
	} {
		msg := callErr(t, h, c.tool, c.args)
		wantContains(t, c.tool, msg, c.want)
	}
}

// TestTaskOutlivesWait: a task longer than the wait is returned running
// with its upid, and proxmox_node_task follows it.
func TestTaskOutlivesWait(t *testing.T) {
	h := newHarness(t, options{elevated: true, wait: 200 * time.Millisecond,
		sim: func(o *pvesim.Options) { o.TaskDelays = map[string]time.Duration{"vzstart": 1500 * time.Millisecond} }})
	st := call[TaskOut](t, h, "proxmox_guest_start", map[string]any{"node": "pve2", "vmid": 201, "type": "lxc"})
	if st.Status != "running" || st.ExitStatus != "" || st.UPID == "" {
		t.Fatalf("start %+v", st)
	}
	var s NodeTaskOut
	testkit.Eventually(t, 10*time.Second, "the task's end", func() bool {
		s = call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve2", "action": "status", "upid": st.UPID})
		return s.Status == "stopped"
	})
	if s.ExitStatus != "OK" {
		t.Errorf("task %+v", s)
	}
}

// TestJobTokenPrivileges: with the least-privilege token of the job
// backend (the DelegateJobs role of docs/PROXMOX.md on /vms, /nodes, the
// image storages and vmbr0), on PVE 8 and 9, the tools work, snapshots
// included (the role has VM.Snapshot for checkpoints), but for what the
// docs list as extra: the cluster status Sys.Audit on /, other storages
// an ACL of their own, hardware options VM.Config.HWType.
func TestJobTokenPrivileges(t *testing.T) {
	for _, release := range []string{"8.4", "9.1"} {
		t.Run(release, func(t *testing.T) {
			h := newHarness(t, options{elevated: true, jobToken: true, sim: func(o *pvesim.Options) { o.PVEVersion = release }})
			if n := call[nodesOut](t, h, "proxmox_get_nodes", map[string]any{}); len(n.Nodes) != 3 || n.Nodes[0].MaxMem == 0 {
				t.Errorf("nodes without their figures: %+v", n)
			}
			if g := call[GuestsOut](t, h, "proxmox_get_vms", map[string]any{}); len(g.Guests) != 3 {
				t.Errorf("guests %+v", g)
			}
			call[StatusOut](t, h, "proxmox_guest_status", map[string]any{"node": "pve2", "vmid": 200, "type": "lxc"})
			call[ContentOut](t, h, "proxmox_storage_content", map[string]any{"node": "pve1", "storage": "local-lvm"})
			call[NodeTaskOut](t, h, "proxmox_node_task", map[string]any{"node": "pve1", "action": "list"})
			clone := call[TaskOut](t, h, "proxmox_guest_clone", map[string]any{"node": "pve1", "vmid": tplID, "name": "least"})
			vm := map[string]any{"node": "pve1", "vmid": clone.VMID}
			call[TaskOut](t, h, "proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": clone.VMID,
				"config": map[string]any{"cores": 1, "memory": 1024, "description": "x"}})
			call[TaskOut](t, h, "proxmox_guest_start", vm)
			h.untilAgent(t, "proxmox_agent_exec", map[string]any{"node": "pve1", "vmid": clone.VMID, "command": []string{"true"}})
			call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": clone.VMID, "action": "write", "file": "/tmp/f", "content": "x"})
			call[FileOut](t, h, "proxmox_agent_file", map[string]any{"node": "pve1", "vmid": clone.VMID, "action": "read", "file": "/tmp/f"})
			call[TaskOut](t, h, "proxmox_guest_snapshot", map[string]any{"node": "pve1", "vmid": clone.VMID, "action": "create", "snapname": "s1"})
			for _, c := range []struct {
				tool string
				args map[string]any
				want string
			}{
				{"proxmox_get_cluster_status", map[string]any{}, "Permission check failed (/, Sys.Audit)"},
				{"proxmox_storage_content", map[string]any{"node": "pve1", "storage": "local"},
					"Permission check failed (/storage/local, Datastore.Audit|Datastore.AllocateSpace)"},
				{"proxmox_guest_config_update", map[string]any{"node": "pve1", "vmid": clone.VMID, "config": map[string]any{"tablet": 0}},
					fmt.Sprintf("Permission check failed (/vms/%d, VM.Config.HWType)", clone.VMID)},
			} {
				msg := callErr(t, h, c.tool, c.args)
				wantContains(t, c.tool, msg, c.want, "the API token lacks this privilege")
			}
			call[TaskOut](t, h, "proxmox_guest_stop", vm)
			call[TaskOut](t, h, "proxmox_guest_delete", vm)
		})
	}
}

// TestErrorsThroughTheTable: the toolset answers through mcpserver's error
// table. Proxmox's own answers are errors of a kind and reach the agent in
// its words (the tests above); an error that is no answer of the API's
// (here, the cluster gone: connection refused) is logged in full and the
// agent told only which call failed and what to do.
func TestErrorsThroughTheTable(t *testing.T) {
	log, logs := testkit.NewLog()
	h := newHarness(t, options{log: log})
	call[nodesOut](t, h, "proxmox_get_nodes", map[string]any{})
	h.sim.Close()
	msg := callErr(t, h, "proxmox_get_nodes", map[string]any{})
	wantContains(t, "the cluster gone", msg, "proxmox_get_nodes failed on the server (the server's log says why)")
	if strings.Contains(msg, "refused") || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("the agent reads the transport's words: %q", msg)
	}
	if !strings.Contains(logs.String(), "tool=proxmox_get_nodes") || !strings.Contains(logs.String(), "connect") {
		t.Errorf("the log lacks the error in full:\n%s", logs.String())
	}
}

// TestProxmoxErrorKinds: Proxmox's answers are errors of the kind their
// status says, in Proxmox's words (the table shows them); an error that
// is no answer of the API's is of no kind (the table hides it).
func TestProxmoxErrorKinds(t *testing.T) {
	for _, c := range []struct {
		api  *pve.APIError
		kind delegate.Kind
	}{
		{&pve.APIError{StatusCode: 400, Reason: "Parameter verification failed.", Errors: map[string]string{"size": "bad"}}, delegate.KindInvalid},
		{&pve.APIError{StatusCode: 501, Reason: "for data too large"}, delegate.KindInvalid},
		{&pve.APIError{StatusCode: 401, Reason: "authentication failure"}, delegate.KindForbidden},
		{&pve.APIError{StatusCode: 403, Reason: "Permission check failed (/vms/100, VM.PowerMgmt)"}, delegate.KindForbidden},
		{&pve.APIError{StatusCode: 500, Reason: "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist"}, delegate.KindNotFound},
		{&pve.APIError{StatusCode: 500, Reason: "VM 100 is running - destroy failed"}, delegate.KindConflict},
		{&pve.APIError{StatusCode: 595, Reason: "No route to host"}, delegate.KindUnavailable},
	} {
		c.api.Method, c.api.Path = "POST", "/nodes/pve1/qemu/100/status/start"
		err := proxmoxError(fmt.Errorf("start: %w", c.api))
		if got := delegate.ErrorKind(err); got != c.kind {
			t.Errorf("%d %s: kind %v, want %v", c.api.StatusCode, c.api.Reason, got, c.kind)
		}
		if !strings.HasPrefix(err.Error(), "Proxmox: "+c.api.Reason) {
			t.Errorf("%d: %q does not give Proxmox's words first", c.api.StatusCode, err)
		}
	}
	if err := proxmoxError(errors.New("dial tcp 10.0.0.1:8006: connection refused")); delegate.ErrorKind(err) != delegate.KindInternal {
		t.Errorf("a transport error is of kind %v", delegate.ErrorKind(err))
	}
}
