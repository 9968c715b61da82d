package pvesim

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// Options configure a Server. The zero value is a one-node cluster with
// fast tasks, usable in tests.
type Options struct {
	// Listen is the address to listen on; default 127.0.0.1:0.
	Listen string
	// Hostnames go into the certificate besides localhost, 127.0.0.1 and
	// ::1 (the address clients use to reach the simulator).
	Hostnames []string
	// Nodes are the cluster's nodes; default DefaultNodes(1). The first
	// node is the one clients talk to (it answers /nodes, /cluster/...).
	Nodes []NodeSpec
	// Pools that exist (clone's pool parameter must name one).
	Pools []string
	// Version is what /version reports; default "9.1.1" (the schema is
	// PVE 9.x).
	Version string

	// TaskDelay is how long a task runs before it ends; default 50ms.
	// TaskDelays overrides it per task type (qmclone, qmstart, qmstop,
	// qmshutdown, qmdestroy, qmconfig, resize).
	TaskDelay  time.Duration
	TaskDelays map[string]time.Duration
	// BootDelay is the time from a finished start task to a guest agent
	// that answers; default 200ms.
	BootDelay time.Duration
	// AuthFailureDelay delays every 401 like pveproxy does (3 s). Zero
	// means the real 3 s; negative means no delay.
	AuthFailureDelay time.Duration
	// MaxRequestLog bounds the request log (Requests); the oldest go
	// first. Default 100000.
	MaxRequestLog int

	// Faults to inject from the start; see SetFaults.
	Faults Faults
	// Seed for the random fault injection; 0 picks one.
	Seed int64

	// Backend runs the guests; default a local backend in SandboxDir.
	Backend sandbox.Backend
	// SandboxDir holds the guests' local sandboxes when Backend is nil;
	// default a new temporary directory, removed by Close.
	SandboxDir string
	Logger     *slog.Logger
}

// NodeSpec is one cluster node and its capacity.
type NodeSpec struct {
	Name        string
	CPUs        int   // host cores (a VM may not have more vCPUs)
	MemoryBytes int64 // what running VMs may use in total
}

// DefaultNodes returns n nodes pve1..pveN with 8 cores and 32 GiB each.
func DefaultNodes(n int) []NodeSpec {
	out := make([]NodeSpec, n)
	for i := range out {
		out[i] = NodeSpec{Name: fmt.Sprintf("pve%d", i+1), CPUs: 8, MemoryBytes: 32 << 30}
	}
	return out
}

// Faults are the failures the simulator injects on purpose.
type Faults struct {
	// ErrorRate is the share (0..1) of requests (authenticated, to a
	// method the simulator serves) answered with a 500 "pvesim: injected
	// fault" before anything is checked or done.
	ErrorRate float64
	// TaskFailures makes every task of a type (qmclone, qmstart, ...) fail
	// with that exit status instead of doing its work.
	TaskFailures map[string]string
	// AgentDown: guest agents never come up (calls answer "QEMU guest
	// agent is not running" although the VM runs).
	AgentDown bool
	// OfflineNodes are unreachable: "offline" in /nodes and
	// /cluster/resources, their VMs "unknown", calls to them answer 595.
	OfflineNodes []string
}

func (f Faults) clone() Faults {
	out := f
	out.TaskFailures = map[string]string{}
	for k, v := range f.TaskFailures {
		out.TaskFailures[k] = v
	}
	out.OfflineNodes = append([]string(nil), f.OfflineNodes...)
	return out
}

func (f Faults) offline(node string) bool {
	for _, n := range f.OfflineNodes {
		if n == node {
			return true
		}
	}
	return false
}

// Token is an API token: the header is
// "PVEAPIToken=<ID>=<Secret>" with ID "user@realm!name".
type Token struct {
	ID         string
	Secret     string
	Privileges []string // what it may do, on every path (see the Role lists)
}

// Privilege sets of PVE's built-in roles (PVE 9), for Token.Privileges.
var (
	// RoleAdministrator has every privilege.
	RoleAdministrator = []string{
		"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
		"Group.Allocate", "Mapping.Audit", "Mapping.Modify", "Mapping.Use", "Permissions.Modify",
		"Pool.Allocate", "Pool.Audit", "Realm.Allocate", "Realm.AllocateUser",
		"SDN.Allocate", "SDN.Audit", "SDN.Use",
		"Sys.AccessNetwork", "Sys.Audit", "Sys.Console", "Sys.Incoming", "Sys.Modify", "Sys.PowerMgmt", "Sys.Syslog",
		"User.Modify",
		"VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
		"VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
		"VM.Config.Options", "VM.Console", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead",
		"VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted",
		"VM.Migrate", "VM.PowerMgmt", "VM.Replicate", "VM.Snapshot", "VM.Snapshot.Rollback",
	}
	// RolePVEAuditor may only look.
	RolePVEAuditor = []string{
		"Datastore.Audit", "Mapping.Audit", "Pool.Audit", "SDN.Audit", "Sys.Audit", "VM.Audit",
	}
	// RolePVEVMAdmin manages VMs (and uses storage for them).
	RolePVEVMAdmin = []string{
		"Datastore.AllocateSpace", "Datastore.Audit", "Pool.Audit", "SDN.Use", "Sys.Audit",
		"VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
		"VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
		"VM.Config.Options", "VM.Console", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead",
		"VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted",
		"VM.Migrate", "VM.PowerMgmt", "VM.Snapshot", "VM.Snapshot.Rollback",
	}
)

// TemplateSpec describes a template VM made by AddTemplate.
type TemplateSpec struct {
	Cores     int    // default 2
	MemoryMiB int    // default 2048
	DiskSize  string // scsi0 size, default "8G"
	Tags      string // e.g. "delegate;template"
	// Agent sets the agent option; default "1" (templates for delegate
	// must have the guest agent enabled).
	Agent string
	// Rootfs, if set, is the root filesystem directory its guests' local
	// sandboxes use (sandbox.Spec.Template); default the host's view.
	Rootfs string
}

func (o *Options) setDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if len(o.Nodes) == 0 {
		o.Nodes = DefaultNodes(1)
	}
	if o.Version == "" {
		o.Version = "9.1.1"
	}
	if o.TaskDelay == 0 {
		o.TaskDelay = 50 * time.Millisecond
	}
	if o.BootDelay == 0 {
		o.BootDelay = 200 * time.Millisecond
	}
	if o.MaxRequestLog <= 0 {
		o.MaxRequestLog = 100_000
	}
	switch {
	case o.AuthFailureDelay == 0:
		o.AuthFailureDelay = 3 * time.Second
	case o.AuthFailureDelay < 0:
		o.AuthFailureDelay = 0
	}
}
