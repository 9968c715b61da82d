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
	// ClusterName is the cluster's name in /cluster/status when it has
	// more than one node; default "pvesim".
	ClusterName string
	// PVEVersion is the release to behave like: "8.2", "8.4" or "9.1"
	// (the default). It chooses the schema (PVE 8.4's or 9's), the
	// privileges (PVE 8's VM.Monitor or PVE 9's VM.GuestAgent.*), the
	// request body cap (64 KiB before 8.4) and what /version reports.
	PVEVersion string
	// Storages of the cluster; default DefaultStorages() (local and
	// local-lvm on each node). Add SharedStorage("ceph") for templates
	// every node can clone.
	Storages []StorageSpec

	// Latency is a profile of timings: "fast" (the default, for tests) or
	// "real" (a real cluster's: see RealLatency). Fields set here win over
	// the profile.
	Latency string
	// TaskDelay is how long a task runs before it ends; default 50ms.
	// TaskDelays overrides it per task type (qmclone, qmstart, qmstop,
	// qmshutdown, qmreboot, qmdestroy, qmconfig, resize, qmsnapshot,
	// qmrollback, qmdelsnapshot, vzstart, vzstop, vzshutdown, vzreboot,
	// vzdestroy).
	TaskDelay  time.Duration
	TaskDelays map[string]time.Duration
	// BootDelay is the time from a finished start task to a guest agent
	// that answers; default 200ms.
	BootDelay time.Duration
	// RequestLatency: every API request takes this long (uniformly
	// between Min and Max) before it is answered; default none.
	RequestLatency Span
	// AgentLatency is the least a guest-agent call takes (QMP to qemu-ga
	// and back); default none.
	AgentLatency time.Duration
	// AgentPingTimeout is how long the guest-ping before each agent call
	// waits for an agent that does not answer (a guest still booting):
	// 3 s in the real profile (qemu-server's qga_check_running), 50 ms by
	// default.
	AgentPingTimeout time.Duration
	// AgentEmulation runs the shell emulation of the guest agent even
	// where qemu-ga is installed.
	AgentEmulation bool
	// DaemonWorkers is how many pvedaemon workers each node has (3, the
	// default: pve-manager PVE/Service/pvedaemon.pm max_workers): the
	// calls pveproxy hands to pvedaemon ("protected" methods: agent,
	// config changes, clones, power, task status...) wait for a free one
	// and hold it while they run. Negative: no limit.
	DaemonWorkers int
	// StatsInterval is pvestatd's cycle: /nodes and /cluster/resources
	// report the node and VM figures (status, name, memory, cpu...) of the
	// last cycle, and a VM created since has none of them yet. Zero (the
	// default) reports them live.
	StatsInterval time.Duration
	// DHCPDelay is how long after its guest agent first answers a VM's
	// NIC gets its IPv4 address by DHCP (network.go): a guest agent
	// answers before DHCP is done; default 300 ms, 3 s in the real
	// profile.
	DHCPDelay time.Duration
	// UnplugDelay is how long a NIC's hot-unplug from a running VM takes
	// (vmconfig.go unplugNICs: qemu-server looks for the device again
	// a second after device_del); default 20 ms, 1 s in the real profile.
	UnplugDelay time.Duration
	// FirewallInterval is pve-firewall's cycle (network.go): a VM's
	// firewall as configured is in force from the next one on; default
	// 200 ms, 10 s in the real profile (proxmox-firewall's is 5 s).
	FirewallInterval time.Duration
	// Hosts are what guests reach (network.go): a connection a VM's
	// firewall lets out to one of these addresses ("10.0.0.5:3128") is
	// carried to the host address it maps to ("127.0.0.1:41234", a test's
	// stand-in for delegate's egress proxy); any other is closed.
	Hosts map[string]string
	// CallbackPort is a port guests' connections are taken on besides
	// the proxy's (3128) and the web's (80, 443), which are all a guest's
	// network has (the local backend's egress listeners): delegate's
	// callback server's, which job VMs reach for their workspaces
	// (proxmox/transfer.go); 0: none.
	CallbackPort int
	// Bridges every node has besides vmbr0 (nodenet.go).
	Bridges []BridgeSpec
	// StorageLockHold is how long a clone holds its storage's lock for
	// each disk (lvcreate and friends); default a quarter of the qmclone
	// task's time. Parallel clones from one storage wait for each other,
	// and give up after 10 s.
	StorageLockHold time.Duration
	// LockTimeoutScale multiplies PVE's lock time-outs (1 s for a
	// clone's config locks, 10 s for the others), so tests can see them
	// without waiting; default 1.
	LockTimeoutScale float64
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
	MemoryBytes int64 // its RAM, reported as maxmem (starts are not refused for overcommit)
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
	// CloneRaces: the next N clones lose their new vmid to a clone another
	// node makes at the same moment (a stopped VM appears there), so that
	// pmxcfs refuses their config ("close (rename) atomic file ... failed:
	// File exists"). Needs two nodes.
	CloneRaces int
	// StuckUnplugs: guests never let a hot-unplugged device go (no ACPI
	// PCI hotplug in the guest): a NIC's unplug fails after qemu-server's
	// 5 s of looking, the NIC left in the config (vmconfig.go unplugNICs).
	StuckUnplugs bool
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

// Token is an API token added with AddToken: the header is
// "PVEAPIToken=<ID>=<Secret>" with ID "user@realm!name".
type Token struct {
	ID     string
	Secret string
	// Privileges hold on every path: AddToken grants them on "/" to the
	// token (privilege-separated) and to its user, through a built-in role
	// with exactly these privileges (RoleAdministrator becomes
	// Administrator, in the PVE 8 or 9 form) or a role made for them.
	Privileges []string
}

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
	// Sockets is the sockets option; default 1. A VM has sockets x cores
	// vCPUs.
	Sockets int
	// BalloonMiB, if set, is the balloon option (the minimum memory the
	// balloon driver may leave the guest).
	BalloonMiB int
	// Storage holds its disk; default local-lvm. It must have the
	// template feature (not thick LVM).
	Storage string
	// AgentDisabledRPCs are guest-agent commands the guest's qemu-ga does
	// not allow, as RHEL's does (see RHELAgentDisabledRPCs): the real
	// qemu-ga runs with --block-rpcs and refuses them ("Agent error:
	// Command guest-exec has been disabled"), and agent/info shows them
	// disabled.
	AgentDisabledRPCs []string
	// Protection sets protection: 1, which clones copy (qemu-server
	// clone_vm copies every option but a few): a protected VM is not
	// destroyed ("can't remove VM N - protection mode enabled").
	Protection bool
	// CloudInit, if set, is the storage of a cloud-init drive on ide2
	// (qm set --ide2 <storage>:cloudinit), as the standard cloud-init
	// template has it.
	CloudInit string
	// CIUpgrade sets ciupgrade (cloud-init upgrades packages at first
	// boot; PVE's default is 1 when unset).
	CIUpgrade string
	// Net0, if set, is its net0 (default "virtio=<MAC>,bridge=vmbr0,
	// firewall=1").
	Net0 string
	// OVMF makes a UEFI template, as "qm set --bios ovmf --machine q35
	// --efidisk0 <storage>:1,efitype=4m,pre-enrolled-keys=1" does (Secure
	// Boot keys enrolled): an efidisk0 on its disk's storage.
	OVMF bool
	// TPM gives it a TPM 2.0 state drive, as "qm set --tpmstate0
	// <storage>:1,version=v2.0" does (Windows 11 templates have one).
	TPM bool
	// Docker: its guests run Docker, whose bridge docker0 (172.17.0.1)
	// the guest agent reports before eth0 (network.go).
	Docker bool
	// SELinux: its guests are of the RHEL family with SELinux enforcing
	// and virt_qemu_ga_run_unconfined off: qemu-ga, confined, may execute
	// no program ("Failed to execute child process “/bin/sh” (Permission
	// denied)"), while its file calls work.
	SELinux bool
}

// RHELAgentDisabledRPCs are the commands RHEL/Rocky/Alma's qemu-ga
// leaves out by default (/etc/sysconfig/qemu-ga: BLOCK_RPCS, or an
// --allow-rpcs list from QEMU 8.1 on): exec and the file calls (seen in
// BassT23/Proxmox#256: "Agent error: Command guest-exec has been
// disabled: the command is not allowed"). guest-ping still answers. A
// template must allow them.
func RHELAgentDisabledRPCs() []string {
	return []string{"guest-exec", "guest-exec-status", "guest-file-open", "guest-file-close",
		"guest-file-read", "guest-file-write", "guest-file-seek", "guest-file-flush"}
}

// Span is a range of durations.
type Span struct{ Min, Max time.Duration }

// RealLatency is the "real" profile: what a real cluster takes, measured
// on real hardware (DESIGN.md): every API request 10-50 ms, a guest-agent
// call ~25 ms, a linked clone ~2 s, a start ~1 s and then ~10 s of boot
// and ~3 s more until the guest agent answers, a stop ~2 s, other tasks a
// few hundred ms, and pvestatd's 10 s cycle (a new VM's figures are
// missing for up to 10 s).
func RealLatency() Options {
	return Options{
		TaskDelay: 300 * time.Millisecond,
		TaskDelays: map[string]time.Duration{
			"qmclone": 2 * time.Second, "qmstart": time.Second, "qmstop": 2 * time.Second,
			"qmshutdown": 4 * time.Second, "qmdestroy": time.Second,
		},
		BootDelay:        12 * time.Second,
		RequestLatency:   Span{10 * time.Millisecond, 50 * time.Millisecond},
		AgentLatency:     25 * time.Millisecond,
		AgentPingTimeout: 3 * time.Second,
		StatsInterval:    10 * time.Second,
		DHCPDelay:        3 * time.Second,
		FirewallInterval: 10 * time.Second,
		UnplugDelay:      time.Second,
	}
}

func (o *Options) setDefaults() error {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if len(o.Nodes) == 0 {
		o.Nodes = DefaultNodes(1)
	}
	if o.ClusterName == "" {
		o.ClusterName = "pvesim"
	}
	if len(o.Storages) == 0 {
		o.Storages = DefaultStorages()
	}
	switch o.Latency {
	case "", "fast":
	case "real":
		real := RealLatency()
		if o.TaskDelay == 0 {
			o.TaskDelay = real.TaskDelay
		}
		delays := real.TaskDelays
		for k, v := range o.TaskDelays {
			delays[k] = v
		}
		o.TaskDelays = delays
		if o.BootDelay == 0 {
			o.BootDelay = real.BootDelay
		}
		if o.RequestLatency == (Span{}) {
			o.RequestLatency = real.RequestLatency
		}
		if o.AgentLatency == 0 {
			o.AgentLatency = real.AgentLatency
		}
		if o.AgentPingTimeout == 0 {
			o.AgentPingTimeout = real.AgentPingTimeout
		}
		if o.StatsInterval == 0 {
			o.StatsInterval = real.StatsInterval
		}
		if o.DHCPDelay == 0 {
			o.DHCPDelay = real.DHCPDelay
		}
		if o.FirewallInterval == 0 {
			o.FirewallInterval = real.FirewallInterval
		}
		if o.UnplugDelay == 0 {
			o.UnplugDelay = real.UnplugDelay
		}
	default:
		return fmt.Errorf("pvesim: latency %q: must be fast or real", o.Latency)
	}
	if o.TaskDelay == 0 {
		o.TaskDelay = 50 * time.Millisecond
	}
	if o.BootDelay == 0 {
		o.BootDelay = 200 * time.Millisecond
	}
	if o.AgentPingTimeout == 0 {
		o.AgentPingTimeout = 50 * time.Millisecond
	}
	if o.DHCPDelay == 0 {
		o.DHCPDelay = 300 * time.Millisecond
	}
	if o.FirewallInterval <= 0 {
		o.FirewallInterval = 200 * time.Millisecond
	}
	if o.UnplugDelay <= 0 {
		o.UnplugDelay = 20 * time.Millisecond
	}
	if o.DaemonWorkers == 0 {
		o.DaemonWorkers = 3
	}
	if o.RequestLatency.Max < o.RequestLatency.Min {
		o.RequestLatency.Max = o.RequestLatency.Min
	}
	if o.LockTimeoutScale <= 0 {
		o.LockTimeoutScale = 1
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
	return nil
}
