// Package pvetools is the "proxmox" toolset of delegate's MCP server: the
// tools of the Proxmox administration MCP servers delegate's design
// started from (nodes, guests, snapshots, tasks, storage, the guest
// agent), over the same pve client as the Proxmox backend (retries only
// where safe, the rate limit, Proxmox's own errors). It is off by
// default, so a job-running agent's context stays small.
//
// Read-only tools always work. A tool that changes anything answers an
// error naming PROXMOX_ALLOW_ELEVATED=true unless the server allows it.
// Every tool that changes a VM a running delegate job owns, or runs
// anything in it (start, stop, shutdown, reboot, delete, clone, config
// and disk changes, snapshots, agent commands and file writes), is
// refused unless force is true; reading it is not. Tools that
// start a Proxmox task wait for it (at most about 50 s, under the
// per-call time-outs of MCP clients) and return its upid and exit
// status; a failed task is a tool error with Proxmox's message.
package pvetools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/pve"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxWait is the longest a tool waits for a Proxmox task or a command:
// MCP clients give up on a call after about a minute.
const MaxWait = 50 * time.Second

// Config is what the toolset needs.
type Config struct {
	// Client reaches the cluster (the PROXMOX_* token of the backend).
	Client *pve.Client
	// AllowElevated allows the tools that change anything
	// (PROXMOX_ALLOW_ELEVATED).
	AllowElevated bool
	// Jobs tells which delegate jobs run and which VMs they hold; nil:
	// no job owns any VM.
	Jobs delegate.JobService
	// Wait bounds each tool's wait for a task or a command; default
	// MaxWait.
	Wait time.Duration
	// PollInterval is the first pause between polls of a command's
	// status (it grows to 1 s); default 200 ms.
	PollInterval time.Duration
	Logger       *slog.Logger
}

// tools holds the handlers.
type tools struct {
	cfg Config
	c   *pve.Client
	log *slog.Logger
}

// Names lists the toolset's tools, in the order tools/list shows them.
func Names() []string {
	out := make([]string, len(catalog))
	for i, t := range catalog {
		out[i] = t.name
	}
	return out
}

// Elevated reports whether a tool changes anything (and so needs
// PROXMOX_ALLOW_ELEVATED); guest_snapshot and node_task are decided per
// action (list, status and log are read-only).
func Elevated(name string) bool {
	for _, t := range catalog {
		if t.name == name {
			return t.elevated
		}
	}
	return false
}

// toolDef is one tool: its name, description, hints, and how it is added.
type toolDef struct {
	name, desc                        string
	readOnly, destructive, idempotent bool
	elevated                          bool
	add                               func(ts *mcpserver.Tools, t *tools, tool *mcp.Tool)
}

// def builds a toolDef for a handler. The input schema comes from In;
// properties with a fixed set of values get an enum: type (qemu, lxc),
// action (actions), and command takes argv or a shell line.
func def[In, Out any](name, desc string, readOnly, destructive, idempotent, elevated bool,
	h func(t *tools, ctx context.Context, in *In) (Out, error), actions ...string) toolDef {
	return toolDef{name: name, desc: desc, readOnly: readOnly, destructive: destructive, idempotent: idempotent,
		elevated: elevated, add: func(ts *mcpserver.Tools, t *tools, tool *mcp.Tool) {
			schema := inputSchema[In]()
			if p := schema.Properties["type"]; p != nil {
				p.Enum = []any{"qemu", "lxc"}
			}
			if p := schema.Properties["action"]; p != nil {
				p.Description = ""
				for _, a := range actions {
					p.Enum = append(p.Enum, a)
				}
			}
			if schema.Properties["command"] != nil {
				schema.Properties["command"] = commandSchema()
			}
			if p := schema.Properties["config"]; p != nil {
				p.AdditionalProperties = nil // any option; the handler reads each
			}
			tool.InputSchema = schema
			tool.OutputSchema = outputSchema[Out]()
			mcpserver.AddTool(ts, tool, func(ctx context.Context, _ *mcp.CallToolRequest, in *In) (Out, error) { return h(t, ctx, in) })
		}}
}

// catalog is the toolset. Hints: read-only tools readOnlyHint; stop,
// delete, snapshot (rollback, delete), config changes and the guest agent
// (a command or a write may destroy anything) destructiveHint.
var catalog = []toolDef{
	def("proxmox_get_nodes", "Cluster nodes: status, cpu, memory, uptime.", true, false, true, false, (*tools).getNodes),
	def("proxmox_get_vms", "VMs and containers (type: qemu|lxc, default both) of a node or the cluster.", true, false, true, false, (*tools).listGuests),
	def("proxmox_get_vm_status", "A guest's status, cpu, memory, uptime.", true, false, true, false, (*tools).guestStatus),
	def("proxmox_execute_vm_command", "Run a command in a VM through the guest agent (waits up to 50 s); exit code, stdout, stderr.", false, true, false, true, (*tools).executeCommand),
	def("proxmox_get_storage", "Storages of a node (or every node): type, content, use.", true, false, true, false, (*tools).getStorage),
	def("proxmox_get_cluster_status", "Cluster name, quorum and node membership.", true, false, true, false, (*tools).clusterStatus),
	def("proxmox_guest_list", "VMs and containers (type: qemu|lxc, default both) of a node or the cluster.", true, false, true, false, (*tools).listGuests),
	def("proxmox_guest_status", "A guest's status, cpu, memory, uptime.", true, false, true, false, (*tools).guestStatus),
	def("proxmox_guest_config", "A guest's configuration, as Proxmox stores it.", true, false, true, false, (*tools).guestConfig),
	def("proxmox_guest_pending", "A VM's changes waiting for its next start: a running VM takes cores, memory... only then.", true, false, true, false, (*tools).guestPending),
	def("proxmox_guest_start", "Start a guest.", false, false, false, true, (*tools).start),
	def("proxmox_guest_stop", "Stop a guest at once (pulls the plug).", false, true, true, true, (*tools).stop),
	def("proxmox_guest_shutdown", "Shut a guest down cleanly.", false, false, true, true, (*tools).shutdown),
	def("proxmox_guest_reboot", "Reboot a running guest.", false, false, false, true, (*tools).reboot),
	def("proxmox_guest_clone", "Clone a VM or template (newid default: next free id).", false, false, false, true, (*tools).clone),
	def("proxmox_guest_delete", "Destroy a stopped guest and its disks.", false, true, false, true, (*tools).delete),
	def("proxmox_guest_config_update", "Set VM options: config is {option: value}, e.g. {\"cores\": 2, \"delete\": \"tags\"}.", false, true, false, true, (*tools).configUpdate),
	def("proxmox_guest_resize", "Grow a VM disk: size like 20G or +4G.", false, false, false, true, (*tools).resize),
	def("proxmox_get_next_vmid", "A free VM id (not reserved).", true, false, false, false, (*tools).nextID),
	def("proxmox_node_task", "A node's tasks: action list, or status|log of upid.", true, false, true, false, (*tools).nodeTask, "list", "status", "log"),
	def("proxmox_storage_content", "Volumes on a storage: disks, ISOs, templates, backups.", true, false, true, false, (*tools).storageContent),
	def("proxmox_guest_snapshot", "VM snapshots: action list|create|rollback|delete (rollback stops the VM).", false, true, false, true, (*tools).snapshot, "list", "create", "rollback", "delete"),
	def("proxmox_agent_exec", "Run a command in a VM through the guest agent (waits up to 50 s).", false, true, false, true, (*tools).agentExec),
	def("proxmox_agent_file", "Read (up to 16 MiB) or write a file in a VM through the guest agent.", false, true, false, true, (*tools).agentFile, "read", "write"),
}

// Register adds the toolset to an MCP server.
func Register(s *mcp.Server, cfg Config) error {
	if cfg.Client == nil {
		return errors.New("pvetools: no Proxmox client")
	}
	if cfg.Wait <= 0 || cfg.Wait > MaxWait {
		cfg.Wait = MaxWait
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &tools{cfg: cfg, c: cfg.Client, log: cfg.Logger}
	ts := mcpserver.NewTools(s, cfg.Logger, "the Proxmox API")
	for _, d := range catalog {
		d.add(ts, t, &mcp.Tool{Name: d.name, Description: d.desc,
			Annotations: annotations(d.readOnly, d.destructive, d.idempotent)})
	}
	return nil
}

// elevated refuses a change unless the server allows them.
func (t *tools) elevated() error {
	if !t.cfg.AllowElevated {
		return errElevated
	}
	return nil
}

// deadline is when a tool called now must stop waiting.
func (t *tools) deadline() time.Time { return time.Now().Add(t.cfg.Wait) }

var nodeRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?$`) })

func checkNode(node string, optional bool) error {
	if node == "" && optional {
		return nil
	}
	if !nodeRe().MatchString(node) {
		return argErr("node", "must be a node name like pve1 (got %q; proxmox_get_nodes lists them)", node)
	}
	return nil
}

func checkVMID(field string, id int) error {
	if id < 100 || id > 999_999_999 {
		return argErr(field, "must be a VM id from 100 to 999999999 (got %d)", id)
	}
	return nil
}

// guestType reads a type argument: qemu (the default) or lxc.
func guestType(s string) (pve.GuestType, error) {
	switch pve.GuestType(s) {
	case "", pve.QEMU:
		return pve.QEMU, nil
	case pve.LXC:
		return pve.LXC, nil
	}
	return "", argErr("type", "must be qemu or lxc (got %q)", s)
}

// Guest names a VM or a container.
type Guest struct {
	Node string `json:"node"`
	VMID int    `json:"vmid"`
	Type string `json:"type,omitempty" jsonschema:"default qemu"`
}

// check validates the reference and returns its type.
func (g *Guest) check() (pve.GuestType, error) {
	if err := checkNode(g.Node, false); err != nil {
		return "", err
	}
	if err := checkVMID("vmid", g.VMID); err != nil {
		return "", err
	}
	return guestType(g.Type)
}

// TaskOut is what a tool that started a Proxmox task returns.
type TaskOut struct {
	UPID string `json:"upid"`
	// Status is stopped, or running when the task outlived the wait:
	// proxmox_node_task follows it then.
	Status     string `json:"status"`
	ExitStatus string `json:"exitstatus,omitempty"`
	// VMID is the new VM's id (clone).
	VMID int `json:"vmid,omitempty"`
}

// wait follows a task until it ends or the deadline passes. A failed
// task is an error with Proxmox's exit status.
func (t *tools) wait(ctx context.Context, node, upid string, deadline time.Time) (TaskOut, error) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := t.c.WaitTask(wctx, node, upid)
	var te *pve.TaskError
	switch {
	case err == nil:
		return TaskOut{UPID: upid, Status: "stopped", ExitStatus: "OK"}, nil
	case errors.As(err, &te):
		// The guest's state or the cluster's refused it: Proxmox's words.
		return TaskOut{}, answer(delegate.ErrConflict, "Proxmox task %s failed: %s (upid %s; proxmox_node_task action log shows its log)",
			te.Type, te.ExitStatus, upid)
	case ctx.Err() == nil && wctx.Err() != nil:
		return TaskOut{UPID: upid, Status: "running"}, nil
	}
	return TaskOut{}, proxmoxError(err)
}

// started waits for a task a call just started (err is the call's).
func (t *tools) started(ctx context.Context, node, upid string, err error, deadline time.Time) (TaskOut, error) {
	if err != nil {
		return TaskOut{}, proxmoxError(err)
	}
	return t.wait(ctx, node, upid, deadline)
}

// proxmoxError words an API error for an agent: Proxmox's message first
// (its parameter errors too), then the request. It is of the kind the
// answer is (apiKind), so that the error table shows it: the agent
// administers this cluster, and Proxmox's words are what it acts on. An
// error that is no answer of the API's (the connection, TLS, a time-out)
// stays of no kind: logged, and the agent told that the call failed.
func proxmoxError(err error) error {
	var api *pve.APIError
	if !errors.As(err, &api) {
		return err
	}
	var b strings.Builder
	b.WriteString("Proxmox: " + api.Reason)
	for _, k := range slices.Sorted(maps.Keys(api.Errors)) {
		fmt.Fprintf(&b, "; %s: %s", k, strings.TrimSpace(api.Errors[k]))
	}
	fmt.Fprintf(&b, " (HTTP %d, %s %s)", api.StatusCode, api.Method, api.Path)
	if api.StatusCode == 403 {
		b.WriteString("; the API token lacks this privilege (docs/PROXMOX.md lists what each tool needs)")
	}
	return &answerError{msg: b.String(), kind: apiKind(api, err)}
}

// apiKind is the kind of an answer of the API: a refused parameter, or a
// body too large for pveproxy (501), is invalid; a refused privilege
// forbidden; a guest or node or task that is not there not found; a
// proxy that reaches no node (502, 503, 595...) unavailable; anything
// else (Proxmox answers 500 for a guest that is running, locked, a
// template...) collides with the state of what the call names.
func apiKind(api *pve.APIError, err error) error {
	switch {
	case pve.IsNotFound(err):
		return &delegate.NotFoundError{Resource: "proxmox", ID: api.Path}
	case api.StatusCode == 400 || api.StatusCode == 501:
		return delegate.ErrInvalid
	case api.StatusCode == 401 || api.StatusCode == 403:
		return delegate.ErrForbidden
	case api.StatusCode > 501:
		return delegate.ErrUnavailable
	}
	return delegate.ErrConflict
}
