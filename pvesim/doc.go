// Package pvesim is a Proxmox VE API simulator, faithful enough to prove
// delegate's Proxmox backend without a Proxmox host: an HTTPS server with
// a self-signed certificate (clients pin its SHA-256 fingerprint) that
// speaks the API's JSON format under /api2/json, for the methods the
// backend and an administrator setting it up use.
//
// The simulator is a claim about Proxmox: each rule below names where
// Proxmox does the same (the repositories are github.com/proxmox/...; the
// messages are Proxmox's own). It is never kinder or harsher than the
// real thing on purpose; where it differs, "Known differences" says so.
//
// # Releases
//
// Options.PVEVersion (delegate pve-sim --pve-version) chooses 8.2, 8.4 or
// 9.1. It decides the schema subset (PVE 8.4's for 8.x, 9's for 9.1:
// schema/), the privileges (pve-access-control src/PVE/AccessControl.pm
// $privgroups: PVE 8's VM.Monitor is PVE 9's VM.GuestAgent.Audit,
// .FileRead, .FileWrite, .FileSystemMgmt and .Unrestricted, and agent
// exec needs VM.GuestAgent.Unrestricted), the request body cap (64 KiB
// before libpve-http-server-perl 5.2.1, 512 KiB from PVE 8.4: pve-http-
// server src/PVE/APIServer/AnyEvent.pm $limit_max_post, fix #6230) and
// what /version reports.
//
// # What it checks, like the real server
//
// Every request goes through pveproxy's order of checks: the /api2/json
// prefix and method (501), the API token (401 "No ticket" or
// "Authentication failed!", delayed 3 s; the user must exist, be enabled
// and not expired, the token exist and not be expired: pve-manager
// PVE/HTTPServer.pm auth_handler, AccessControl.pm verify_token), body
// rules (501 for a body on GET/DELETE or over the release's cap), the
// route (501 "Method 'GET /x' not implemented"), parameters contradicting
// the path (400), the method's permissions (pve-access-control
// src/PVE/RPCEnvironment.pm check_api2_permissions and
// exec_api2_perm_check: perm, and, or, userid-param, userid-group,
// perm-modify; 403 "Permission check failed (/vms/100, VM.Allocate)"),
// the node (500 for an unknown node, 595 for an offline one), a pvedaemon
// worker for a "protected" method (see Workers), and then the parameters
// against the official schema: unknown parameters, missing
// ones, types (booleans are 0/1 or JSON booleans only; "true" is refused),
// enums, minimum/maximum, maxLength, patterns, the named formats that
// matter (pve-vmid, pve-node, dns-name, tags, MAC addresses, storage,
// pool, role, user and token ids, privileges of the release, config ids,
// CIDR, disk sizes...) and property strings (net0, agent, memory...), with
// PVE::JSONSchema's messages in a 400
// {"data":null,"errors":{param:msg},"message":"Parameter verification failed.\n"}.
// Errors carry their message in the HTTP reason phrase, as Proxmox does
// (the connection closes after an error, as pveproxy's does).
//
// # Access control
//
// user.cfg as pve-access-control has it (src/PVE/AccessControl.pm,
// src/PVE/RPCEnvironment.pm): users (root@pam always exists and may do
// everything), API tokens, roles, an ACL tree and pools.
//   - Built-in roles are made as create_roles makes them from the
//     release's privilege groups: PVE<Cat>Admin, PVE<Cat>User, PVEAuditor,
//     PVEAdmin (without Mapping.Modify), PVETemplateUser, NoAccess,
//     Administrator. PVEVMAdmin holds VM.* only: no Sys.Audit,
//     Datastore.AllocateSpace or SDN.Use.
//   - An ACL applies to its path and, with propagate, below; a token's or
//     user's entries replace what was inherited; NoAccess wins; a pool's
//     roles apply to its VMs (roles, $compile_acl_path).
//   - A privilege-separated token has what its ACLs and its user's have
//     in common (except root@pam's tokens); one without privsep has its
//     user's (permissions).
//   - The access API an administrator uses (src/PVE/API2/{Role,User,ACL,
//     AccessControl}.pm): GET/POST /access/roles, GET/PUT/DELETE
//     /access/roles/{roleid} (no "PVE" prefix; built-in roles cannot
//     change), GET/POST /access/users, GET/DELETE /access/users/{userid},
//     GET /access/users/{userid}/token, GET/POST/DELETE
//     .../token/{tokenid} (POST answers the secret "value", a UUID, and
//     "full-tokenid"; privsep defaults to 1), GET/PUT /access/acl (path,
//     roles, users, tokens, propagate, delete; without Permissions.Modify
//     only a subset of the caller's own privileges, never NoAccess), GET
//     /access/permissions. Each checks what Proxmox checks: Sys.Modify on
//     /access for roles, Realm.AllocateUser and User.Modify for users,
//     Permissions.Modify (or the object's allocate privilege) for ACLs.
//     Failures inside the user.cfg lock read "ACL update failed: ...".
//   - Config updates check each option (qemu-server src/PVE/API2/Qemu.pm
//     $check_vm_modify_config_perm): cores/sockets/cpu... VM.Config.CPU,
//     memory/balloon VM.Config.Memory, name/description/agent...
//     VM.Config.Options, netN VM.Config.Network (and SDN.Use on the
//     bridge: check_bridge_access), ipconfigN and cloud-init options
//     VM.Config.Cloudinit or VM.Config.Network, tags VM.Config.Options
//     (pve-guest-common src/PVE/GuestHelpers.pm assert_tag_permissions),
//     drives VM.Config.Disk (and Datastore.AllocateSpace on a new disk's
//     storage), options in no list root only ("only root can set 'args'
//     config"), deleted options too.
//   - A clone needs VM.Clone, VM.Allocate on the new id (or its pool),
//     Datastore.AllocateSpace on the storage of each disk and SDN.Use on
//     /sdn/zones/localnetwork/<bridge> of each NIC ($check_storage_access_clone,
//     check_bridge_access); an unknown pool is a 403 (check_pool_exist). A
//     resize needs Datastore.AllocateSpace on the disk's storage
//     (resize_vm).
//   - Without Sys.Audit on /nodes/<node>, /nodes and /cluster/resources
//     give a node's status and level only: no uptime, cpu, mem, disk,
//     maxcpu, maxmem, maxdisk (pve-manager PVE/API2Tools.pm
//     extract_node_stats, PVE/API2/Nodes.pm index, PVE/API2/Cluster.pm
//     resources). /cluster/resources lists VMs with VM.Audit, storages
//     with Datastore.Audit, the SDN zone with SDN.Audit, pools with
//     Pool.Audit. Others' tasks need Sys.Audit on the node (PVE/API2/
//     Tasks.pm).
//   - skiplock is root@pam's ("Only root may use this option."), and a
//     token is never root@pam.
//   - In a task, a permission error is reported as fork_worker writes a
//     PVE::Exception: "403 Permission check failed (...)" (pve-common
//     src/PVE/RESTEnvironment.pm, src/PVE/Exception.pm stringify).
//
// # Workers
//
// pveproxy hands every "protected" method (config changes, clones, power,
// agent calls, task status...: the schema's protected flag) to pvedaemon
// on the node the call names (pve-manager PVE/HTTPServer.pm, pve-http-
// server src/PVE/APIServer/AnyEvent.pm proxy_request), which has three
// workers (PVE/Service/pvedaemon.pm max_workers), each running one call at
// a time: the handler is synchronous inside the worker's event loop. So a
// node serves at most Options.DaemonWorkers such calls at once; the others
// wait (Request.Queued says how long). PeakCalls counts the calls to each
// node in flight at once.
//
// # What it simulates
//
// A cluster of nodes with their memory and cores, storages, VMs and tasks.
//   - Storages (Options.Storages, default local (dir) and local-lvm
//     (lvmthin) on each node) have a shared flag: nfs, cifs and rbd always
//     (pve-storage src/PVE/Storage/Plugin.pm @SHARED_STORAGE), dir and lvm
//     when set. GET /storage and GET /nodes/{node}/storage list those the
//     caller may audit or allocate on (src/PVE/API2/Storage/{Config,
//     Status}.pm), /cluster/resources has one entry per node with shared.
//     A template's disk is on any storage with the template feature (not
//     thick LVM).
//   - GET /cluster/nextid is the lowest unused id as a string and reserves
//     nothing (pve-manager PVE/API2/Cluster.pm nextid).
//   - A clone (qemu-server src/PVE/API2/Qemu.pm clone_vm) checks at once
//     what $load_and_check checks: pool, target node, storage (it must
//     hold images, and be shared for a target: "can't clone to
//     non-shared storage 'x'"), the source's lock, storage/format only for
//     full clones, privileges, "can't clone VM to node 'X' (VM uses local
//     storage)" for a target when a disk is on local storage, "unable to
//     create VM N: config file already exists" when the new id's config
//     exists on this node, and per disk the clone (linked) or copy (full)
//     feature: only base volumes of templates link, never on thick LVM
//     ("Linked clone feature is not supported for 'local-lvm:vm-200-disk-0'
//     (scsi0)"; pve-storage volume_has_feature). Then a qmclone task (its
//     id is the source's vmid) takes a shared lock on the source's config
//     and an exclusive one on the new id's, 1 s each ("can't lock file
//     '/var/lock/qemu-server/lock-N.conf' - got timeout": pve-common
//     src/PVE/Tools.pm lock_file_full), checks again and only then writes
//     the new config, locked "clone". So two clones given the same id by
//     nextid collide only when they overlap, and the loser's task fails:
//     with the lock time-out while the winner clones, with "config file
//     already exists" after, or with "close (rename) atomic file
//     '/etc/pve/nodes/pve2/qemu-server/N.conf' failed: File exists" when
//     the id is taken on another node (pve-cluster src/pmxcfs/memdb.c
//     refuses a vmid another node has; pve-common src/PVE/File.pm). Each
//     disk is cloned holding its storage's lock (pve-storage
//     src/PVE/Storage.pm vdisk_clone/vdisk_alloc, Plugin.pm
//     cluster_lock_storage): a node's flock for a local storage ("can't
//     lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got
//     timeout"), pmxcfs's for a shared one ("cfs-lock 'storage-ceph'
//     error: got lock request timeout", pve-cluster src/PVE/Cluster.pm
//     cfs_lock), 10 s each, for Options.StorageLockHold; a failure there
//     ends the task "clone failed: ..." and removes the new config. With a
//     target, the config moves to that node at the end.
//   - Config locks wait like flock: a start, stop, shutdown, destroy,
//     resize or config update takes its VM's config lock for the task's
//     length, waiting up to 10 s (pve-guest-common src/PVE/AbstractConfig.pm
//     lock_config), so a start during a clone waits for it. A config
//     update is refused at once while the config has a lock ("VM is
//     locked (clone)"), on a stale digest ("checksum mismatch (file change
//     by other user?)") and when the balloon would be larger than the
//     memory, the memory set or the config's ("balloon value too large
//     (must be smaller than assigned memory)", update_vm_api
//     $load_and_check_config), and checked again in the lock.
//   - A clone copies its source's options but a few (template, lock,
//     parent, unused disks; new MACs, smbios1 uuid, vmgenid, its own
//     cloud-init drive vm-<newid>-cloudinit): protection included
//     (qemu-server src/PVE/API2/Qemu.pm clone_vm), and a protected VM is
//     not destroyed ("can't remove VM 101 - protection mode enabled":
//     pve-guest-common src/PVE/AbstractConfig.pm check_protection).
//   - A destroy with destroy-unreferenced-disks lists every image storage
//     for the VM's disks after freeing its own (qemu-server
//     src/PVE/QemuServer.pm destroy_vm, pve-storage src/PVE/Storage.pm
//     vdisk_list): an offline storage (SetStorageOnline) fails the task
//     "storage 'nas' is not online" (activate_storage), every time.
//   - Config changes to a running VM go to its [PENDING] section and only
//     what qemu-server can hot-plug applies at once (src/PVE/QemuServer.pm
//     vmconfig_hotplug_pending: the $fast_plug_option list, cloud-init
//     options, cpulimit, cpuunits, agent, a balloon that stays on or off,
//     NICs and SCSI/VirtIO disks under the default hotplug network,disk,usb,
//     memory and vcpus only with memory or cpu hotplug); cores, sockets and
//     the rest wait for the next start (vm_start: vmconfig_apply_pending).
//     GET config shows the pending values unless current=1, GET pending
//     lists them (src/PVE/API2/Qemu.pm vm_config, vm_pending), the digest
//     covers them, and a snapshot rollback drops them (AbstractConfig.pm
//     __snapshot_apply_config makes the config afresh).
//   - A NIC deleted from a running VM under network hotplug is unplugged
//     while the call holds the config lock (QemuServer.pm vm_deviceunplug:
//     device_del, then qemu_devicedelverify looks for the device at once
//     and then once a second, 5 s at most): the call takes
//     Options.UnplugDelay (1 s in the real profile); a guest that does not
//     let it go (Faults.StuckUnplugs) fails the call after 6 of those with
//     the parameter error "net0: hotplug problem - error on hot-unplugging
//     device 'net0' - still busy in guest?" (raise_param_exc), the NIC
//     left in the config to be deleted, the call's other changes made.
//     Without network hotplug the deletion waits in [PENDING]. A guest
//     whose NIC is gone reaches nothing (network.go).
//   - Migration (qemu-server src/PVE/API2/Qemu.pm migrate_vm,
//     src/PVE/QemuMigrate.pm; pve-manager PVE/API2/Nodes.pm migrateall;
//     migrate.go): POST .../migrate refuses at once "target is local
//     node." (400), "no such cluster node 'x'" and a running VM without
//     online ("can't migrate running VM without --online"); its qmigrate
//     task writes "lock: migrate" into the config (phase1) while the VM
//     keeps running on its node, its guest, agent and commands going on
//     (an online migration), then moves the config to the target node and
//     clears the lock (phase3_cleanup, move_config_to_node): the old node
//     then answers "Configuration file ... does not exist" and
//     /cluster/resources lists the VM where it went. A running VM with a
//     disk on local storage is refused without with-local-disks ("can't
//     live migrate attached local disks without with-local-disks
//     option"); an offline target fails the task as QemuMigrate's ssh
//     test does. POST /nodes/{node}/migrateall starts one migration per
//     guest of the node (templates too; online for a running VM), at most
//     maxworkers at a time, logs those it could not start and waits for
//     them all.
//   - A VM's lock set by a task that died half-way (SetVMLock) stays: only
//     root clears it (qm unlock; skiplock is root@pam's).
//   - A VM has sockets x cores vCPUs (qemu-server src/PVE/QemuServer.pm
//     config_to_command): more than the node's cores fails the start
//     ("MAX 8 vcpus allowed per VM on this node"). Memory is not a reason
//     to refuse a start (no such check in qemu-server: QEMU maps guest RAM
//     lazily and Linux overcommits), except a VM larger than its node
//     ("kvm: cannot set up guest memory 'pc.ram': Cannot allocate
//     memory"). A node's maxmem is its memory (NodeSpec, delegate pve-sim
//     --node-memory); its mem is the host's use plus what running guests
//     touch (two fifths of their memory), not what they were given.
//   - pvestatd (Options.StatsInterval; 10 s in the real profile): /nodes
//     and /cluster/resources report the last cycle's figures, a VM made
//     since has only id, vmid, node, type, status "unknown" (and lock,
//     tags and pool, read from the config), pve-manager PVE/API2Tools.pm
//     extract_vm_stats; an offline node's last figures stay 5 minutes
//     (pve-cluster src/pmxcfs/status.c).
//   - Tags are stored as pve-guest-common's get_unique_tags writes them:
//     lower case, sorted, without duplicates.
//   - A reboot (qemu-server vm_reboot) is refused at once for a VM that
//     does not run ("VM 100 not running"); its qmreboot task shuts the
//     guest down and boots a new one. GET /nodes/{node}/qemu is
//     vmstatus's list (src/PVE/QemuServer.pm vmstatus): templates
//     included, "VM <id>" for a VM without a name.
//   - Containers (pve-container src/PVE/API2/LXC.pm, LXC/Status.pm,
//     src/PVE/LXC.pm vmstatus; AddContainer makes them) share the VMs' id
//     space (nextid skips them, and a VM clone onto a container's id fails
//     as pmxcfs refuses it) and their config locks ("CT is locked
//     (backup)"). Unlike a VM, a container that runs is refused a start at
//     once ("CT 200 already running"), one that does not run a stop or
//     shutdown ("CT 200 not running") and a reboot ("VM 200 not running":
//     pve-container's words); a running one is not destroyed without force
//     ("unable to destroy CT 200 - container is running"); a template does
//     not start ("you can't start a CT if it's a template"). Tasks are
//     vzstart, vzstop, vzshutdown, vzreboot and vzdestroy.
//   - Snapshots of VMs (pve-guest-common src/PVE/AbstractConfig.pm
//     snapshot_create, snapshot_rollback, snapshot_delete; qemu-server
//     src/PVE/API2/Qemu.pm snapshot, rollback, delsnapshot and
//     src/PVE/QemuConfig.pm): a snapshot is a copy of the config (without
//     lock, digest, description and unused disks) in the config file.
//     Creating one (qmsnapshot) locks the VM "snapshot" between its prepare
//     and commit steps; "current" and "pending" are reserved names, a
//     template has none ("you can't take a snapshot if it's a template"),
//     a name is used once ("snapshot name 's1' already used"), and every
//     disk must be on a storage that snapshots (pve-storage
//     volume_has_feature: LVM-thin, ZFS, RBD, qcow2 files on directory,
//     NFS and CIFS storages; not raw or vmdk files, not thick LVM's raw
//     volumes: "snapshot feature is not available"); the name is a
//     pve-configid of at most 40 characters (the schema). With the agent
//     enabled (and freeze-fs not off), a snapshot without RAM of a
//     running VM freezes the guest's file systems around the cut
//     (qemu-server QemuConfig.pm __snapshot_freeze), or logs "skipping
//     guest filesystem freeze - agent configured but not running?". The
//     snapshot keeps the VM's disk too: the guest's files, as they were
//     (vmdisk.go). A rollback (qmrollback) stops the VM, locks it
//     "rollback", and makes the snapshot's config the VM's again, keeping
//     its description and unused disks, with a new vmgenid and the
//     snapshot as parent, and its disk the snapshot's (the guest's files
//     as they were); a snapshot taken with RAM (vmstate), or start,
//     boots it afterwards (AbstractConfig.pm snapshot_rollback calls
//     __snapshot_rollback_vm_stop, and __snapshot_rollback_vm_start only
//     with vmstate; API2/Qemu.pm rollback starts it for start=1). On ZFS only the most recent snapshot rolls back
//     (ZFSPoolPlugin volume_rollback_is_possible: "can't rollback, 'a' is
//     not most recent snapshot on 'tank:vm-132-disk-0'"). Deleting one
//     (qmdelsnapshot) locks "snapshot-delete" and gives its children its
//     parent; its request is forked before anything is loaded, so an
//     unknown VM or snapshot fails the task, not the request.
//   - GET /nodes/{node}/tasks (pve-manager PVE/API2/Tasks.pm node_tasks):
//     finished tasks, the last ended first, with endtime and their exit
//     status (source active: the running ones, status RUNNING; all: both),
//     filtered by user, type, vmid, errors, start time and status type
//     (PVE::UPID normalize_status_type), paged by start and limit, with the
//     count of all that match as total; without Sys.Audit on the node a
//     caller sees its own tasks only.
//   - GET /nodes/{node}/storage/{storage}/content (pve-storage
//     src/PVE/API2/Storage/Content.pm, Storage.pm volume_list and
//     check_volume_access, Plugin.pm list_volumes): the guests' volumes
//     (images for a VM, rootdir for a container, vmid their owner), and
//     ISO images, container templates and backups put there by
//     AddVolume, sorted by volid; each as the caller may see it:
//     Datastore.Allocate sees all, ISOs and templates need
//     Datastore.AllocateSpace or Datastore.Audit, a disk Datastore.Audit
//     and VM.Config.Disk on its guest, a backup Datastore.AllocateSpace
//     and VM.Backup.
//   - GET /cluster/status (pve-manager PVE/API2/Cluster.pm get_status):
//     for a cluster (more than one node; Options.ClusterName) its name,
//     node count, config version and quorum (more than half the nodes
//     online), then each node with its id, whether it answered (the
//     first), whether it is online; a lone node is one entry, nodeid 0.
//     It needs Sys.Audit on /.
//   - The firewall (pve-firewall src/PVE/Firewall.pm and
//     src/PVE/API2/Firewall/{Cluster,Host,VM,Rules,IPSet,Groups}.pm;
//     firewall.go, secgroups.go): the datacenter's options (cluster.fw;
//     off until enable=1, and while it is off no rule of a node or VM
//     applies), a node's (host.fw; enable defaults to 1, and switches the
//     host's rules only: VM rules apply whatever it says, as update makes
//     the guests' chains whenever the datacenter's firewall is on;
//     nftables=1 hands the node to proxmox-firewall, which does the same),
//     the datacenter's security groups (a VM rule of type group brings
//     a group's rules in at its place), and a VM's (options, rules, IP
//     sets), which a clone copies (qemu-server's clone calls
//     clone_vmfw_conf). A rule is checked as verify_rule checks it for a
//     VM: type in or out (group needs a security group that exists:
//     "no such security group 'x'"), action ACCEPT, DROP or REJECT,
//     iface netN, a macro of the ones simulated (SSH, HTTP, HTTPS, Web,
//     DNS, NTP, Ping, SMTP, Ceph), dport
//     and sport only with a protocol that has ports ("missing property -
//     'dport' requires this property", "protocol 'icmp' does not support
//     ports"), addresses by parse_address_list (one IP version, a range
//     alone, "+set" only for an IP set the VM has); it is disabled unless
//     enable is given, and goes first (create_rule unshifts). An IP set's
//     name is taken once ("IPSet 'x' already exists"), an entry once
//     ("address '10.0.0.5/32' already exists"), never a /0. The formats
//     IPorCIDRorAlias, pve-fw-addr-spec, pve-fw-dport-spec and
//     pve-fw-protocol-spec are checked. SetFirewall turns the
//     datacenter's or a node's firewall on or off.
//   - Each node answers for the cluster on an address of its own
//     (ListenNode, as each node's pveproxy does), which refuses
//     connections while the node is down.
//   - The HA manager's status (ha.go; pve-ha-manager
//     src/PVE/API2/HA/Status.pm manager_status): each node "online",
//     "maintenance" (SetNodeMaintenance: ha-manager crm-command
//     node-maintenance enable) or "unknown" when down; Sys.Audit on /.
//     A node's config (pve-manager PVE/API2/NodeConfig.pm): its notes
//     (description) and digest, read with Sys.Audit on /, written with
//     Sys.Modify on / ("detected modified configuration - file changed by
//     other user? Try again." for a stale digest).
//   - Each node's network configuration (nodenet.go; pve-manager
//     PVE/API2/Network.pm): eno1 and the bridge vmbr0 on it, with the
//     node's address (10.0.0.11, .12...) and gateway, as the installer
//     makes them, and Options.Bridges; GET /nodes/{node}/network/{iface}
//     reads one ("interface does not exist" otherwise), and a VM whose
//     NIC names a bridge its node lacks does not start ("bridge 'x' does
//     not exist").
//   - The guests' network (network.go): a VM with a NIC has a network
//     namespace of its own whose connections land on the simulator, which
//     judges each by the VM's firewall as pve-firewall's last cycle
//     compiled it (Options.FirewallInterval; pve-firewall's daemon runs
//     update every 10 s, proxmox-firewall every 5 s: src/PVE/Firewall.pm
//     ruleset_create_vm_chain: ipfilter, then the out rules in order, then
//     policy_out) and carries the ones it lets out to Options.Hosts. DHCP
//     answers Options.DHCPDelay after the guest agent: until then eth0
//     has its link-local address only (qemu-ga's
//     guest-network-get-interfaces lists what the guest has), and a guest
//     with Docker lists docker0 first.
//   - Long operations (clone, start, stop, shutdown, reboot, destroy,
//     resize, config by POST, snapshots) return a UPID and run as tasks; task status has no
//     endtime and an exitstatus only once stopped; task logs end with
//     "TASK OK" or "TASK ERROR: ..."; booleans are 0/1, config integers
//     are numbers and memory a string, and bytes in JSON strings are one
//     character per byte, like Perl writes them.
//
// # Timings
//
// Options.Latency "fast" (the default) makes tasks take 50 ms and guests
// boot in 200 ms, for tests. "real" (delegate pve-sim --latency real) is
// a real cluster's, measured on real hardware: every request 10-50 ms, a
// guest-agent call at least 25 ms, a clone ~2 s, a start ~1 s then ~10 s
// of boot and ~3 s until the agent answers, a stop ~2 s, other tasks
// 300 ms, and pvestatd's 10 s cycle; a ping to a guest still booting
// waits 3 s (AgentPingTimeout; 50 ms in the fast profile). Each figure can
// be set on its own (TaskDelay(s), BootDelay, RequestLatency, AgentLatency,
// AgentPingTimeout, StatsInterval, StorageLockHold); LockTimeoutScale
// shortens PVE's lock time-outs for tests.
//
// # Guests
//
// A started VM gets a sandbox of its own from a sandbox.Backend (by
// default the local namespace backend, so tests must call local.Reexec
// first in TestMain), sized by its vCPUs, memory and disk; after
// Options.BootDelay its guest agent answers. Where Debian's
// qemu-guest-agent is installed (AgentKind says), the guest runs the real
// qemu-ga: its sandbox's one process is a small init that runs
// "qemu-ga -m unix-listen -p /workspace/.qga/sock -t STATEDIR" (with -b for
// the commands a template's agent blocks) in a process group of its own
// and starts it again when it ends, as systemd restarts its service; the
// simulator speaks QGA's JSON protocol to it over that socket as
// qemu-server's QMPClient does through QEMU's chardev (src/PVE/QMPClient.pm:
// guest-sync-delimited first, one command at a time, 5 s per command).
// Exec (argv, input-data, capture-output with out-truncated at 16 MiB),
// exec-status, the file calls, ping, info and the blocklist are then the
// real agent's, errors in its words. Elsewhere a POSIX shell loop emulates
// it (qga.go), and the simulator logs a warning at start.
//
// Each agent call is qemu-server's agent_cmd (src/PVE/QemuServer/Agent.pm):
// assert_agent_available — the agent option present ("No QEMU guest agent
// configured" only when absent; with agent: 0 QEMU has no agent socket and
// the agent is "not running"), the VM running, and a guest-ping answered
// within 3 s (qga_check_running: a booting guest makes it wait all of
// it) — then the command; file-write is three of them (open, write,
// close), file-read reads 1 MiB chunks and says truncated until the end
// of the file (src/PVE/API2/Qemu/Agent.pm). A template's qemu-ga may block
// commands (TemplateSpec.AgentDisabledRPCs; RHELAgentDisabledRPCs is the
// RHEL family's default): they fail "Agent error: Command guest-exec has
// been disabled" (qemu's qmp-dispatch, reported by check_agent_error),
// and agent/info shows them disabled.
//
// Suspend and resume (status/suspend, status/resume; qemu-server's
// vm_suspend and vm_resume, PVE/QemuServer.pm, QMP "stop" and "cont"): a
// qmsuspend task stops a running VM's vCPUs, its RAM kept: the guest's
// processes are frozen (the cgroup freezer of its sandbox), its status
// stays "running" with qmpstatus "paused" (vmstatus reads QMP's
// query-status), and its guest agent, frozen with it, answers no ping
// (agent calls fail as for an agent that is down). A qmresume task lets
// it go on; resuming a running VM changes nothing; both refuse a stopped
// VM ("VM N not running"). Both need VM.PowerMgmt (the schema). Suspend
// to disk (todisk, hibernation) is not simulated and is refused saying so.
//
// RestartAgent stops a guest's agent as an upgrade would: its process
// group dies, and what the agent started with it; what left the group
// (setsid) lives on. Stopping or destroying the VM destroys its sandbox
// and kills everything in it.
//
// # Known differences from a real cluster
//
//   - The agent's socket and state (and, emulated, its spool of requests
//     and outputs) are in /workspace/.qga: the guest's commands see them.
//   - Commands run as the sandbox's user (uid 1000), not root, in "/", with
//     the agent's environment (PATH, LANG=C.UTF-8): what needs root fails
//     (a resumed VM's clock is not set: date -s is refused, and delegate
//     logs so).
//   - The guest's file system is the host's programs (read-only), its
//     disk (/workspace, and /var, where the guest makes /var/tmp (1777),
//     /var/lib, /var/cache, /var/log and /var/spool at boot, as a Debian
//     guest has them: sandbox.Spec.DiskVar) and a /tmp tmpfs of half the
//     VM's memory, as a Debian 13 guest's (systemd's units/tmp.mount,
//     size=50%,nr_inodes=1m, which Debian 13 enables: /tmp is RAM there;
//     sandbox.Spec.TmpBytes), where bulk data beyond that fails "No space
//     left on device". Both "disks" are the host's memory, each as big as
//     the VM's disk (and what the guest writes there is charged to its
//     memory, where a real VM's disk is not).
//   - The guest has no systemd: an agent restart kills the agent's process
//     group, which a setsid leaves, where systemd kills the service's
//     cgroup, which it does not (delegate's runner takes a systemd scope
//     where systemd runs; the simulator cannot show that branch).
//   - The guest has no syslog: qemu-ga's log of each exec's argument list
//     goes nowhere. Requests shows every argument list the agent got.
//   - The emulated agent (without qemu-guest-agent) reports death by
//     signal N as exit status 128+N; the simulator reports codes 129..192
//     as signal N, so a command that exits with such a code on purpose is
//     reported killed.
//   - The guest's network is the simulator's: only TCP to Options.Hosts
//     on ports 80, 443, 3128 and Options.CallbackPort (delegate's
//     callback server, whence job VMs fetch their workspaces) reaches
//     anything, UDP and DNS nothing; a connection the firewall
//     drops is accepted and closed at once (a real DROP leaves the client
//     waiting for its time-out), and one to an unfiltered address that
//     is not a host is closed too (a real one is refused or times out).
//     network-get-interfaces reports loopback, docker0 if the template
//     has Docker, and ethN per netN with the VM's MAC (its IPv4 lease,
//     10.10.x.y from the vmid, on eth0 only). Without root (no network
//     namespace) a guest boots without a network, and the log says so.
//   - A VM's disk is its guest's /workspace (vmdisk.go): the rest of
//     the guest is its template's root file system, which a guest's
//     changes do not outlive; processes and /tmp are gone at a stop. A
//     full clone's disk starts empty, as a linked clone's does.
//   - A migration copies no disk: a VM with a disk on local storage (a
//     template on local-lvm, say) is not migrated (the task fails, saying
//     so), where Proxmox copies the disk offline, or online with
//     with-local-disks. Containers are not migrated.
//   - Memory and vCPUs of a running VM count as started (pending changes
//     do not).
//   - Only API tokens authenticate (no tickets), so nothing is ever
//     root@pam itself; groups and realms other than pam and pve do not
//     exist.
//   - Guests touch a fixed share of their memory and the host does not
//     run out: an overcommitted node never swaps or kills a guest. The
//     node has no swap: a VM larger than its RAM does not start.
//   - A container runs nothing: it has a status, an uptime, memory
//     figures and a config, but no processes (the API has no exec for
//     containers, so nothing a client does could see inside one). It is
//     made by AddContainer, not through POST /nodes/{node}/lxc, and has no
//     snapshots, clones or config changes.
//   - A snapshot taken with RAM boots the VM afresh at a rollback instead
//     of resuming it. The guest's file systems are frozen for a snapshot
//     by its cgroup freezer, not by qemu-ga's guest-fsfreeze-freeze (which
//     would freeze the host's).
//   - Quorum is reported, not enforced: a cluster without quorum still
//     accepts changes (a real one answers "cluster not ready - no
//     quorum?").
//   - A PVE 8.2 cluster uses the PVE 8.4 schema subset (the methods used
//     are the same).
//   - Methods outside the subset answer 501 although real PVE has them
//     (the simulator logs a warning naming them).
//
// # Faults
//
// Options.Faults and SetFaults inject failures: a share of requests
// answered 500 before they act (ErrorRate), tasks of a type that fail
// with a given exit status and leave no trace (TaskFailures), guest
// agents that never come up (AgentDown), offline nodes (also
// SetNodeOnline), and clones that lose their vmid to another node's clone
// (CloneRaces: pmxcfs's "close (rename) atomic file ... File exists").
// Options.TaskDelays makes tasks of a type slow; HoldStorageLock holds a
// storage's lock (a shared one's is pmxcfs's: "cfs-lock 'storage-ceph'
// error: got lock request timeout" for the clones that wait on it);
// SetStorageOnline takes a storage offline. TemplateSpec makes the
// templates of real clusters: protected, with a cloud-init drive on local
// storage, with an agent that blocks exec and files, with agent: 0, with
// NIC options (firewall, rate, mtu), UEFI (bios: ovmf, an efidisk0 with
// Secure Boot keys), with a TPM state (tpmstate0), with Docker (docker0
// listed first), and of the RHEL family with SELinux confining qemu-ga
// (virt_qemu_ga_run_unconfined off: its exec fails "Failed to execute
// child process “/bin/sh” (Permission denied)", its file calls work). An efidisk0 or
// tpmstate0 is checked against its own format, which has no backup,
// cache or iothread key (qemu-server src/PVE/QemuServer/Drive.pm
// $efidisk_fmt and $tpmstate_fmt; the schema's efidisk0 and tpmstate0):
// "invalid key in comma-separated list property: backup".
//
// # Introspection
//
// VMs, Tasks and Requests show the state and every request received
// (method, path, parameters, status, reason), so a test can check each
// request a client sent against the schema with Schema.Validate.
// AddToken makes an API token whose privileges hold everywhere;
// CreateJobToken makes, through the access API, the least-privilege token
// the documentation describes (JobRolePrivileges, JobACLPaths,
// PveumCommands).
package pvesim
