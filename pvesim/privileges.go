package pvesim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// privGroup is one category of privileges as pve-access-control's
// AccessControl.pm ($privgroups) groups them: the built-in roles are made
// from these lists (create_roles).
type privGroup struct {
	cat                      string
	root, admin, user, audit []string
}

// privGroups are the privilege categories of a PVE major release, read in
// pve-access-control src/PVE/AccessControl.pm: branch stable-bookworm for
// PVE 8 (8.2 onwards: Sys.AccessNetwork came with 8.2), master for PVE 9.
// PVE 9 drops VM.Monitor for the VM.GuestAgent.* privileges and adds
// VM.Replicate.
func privGroups(major int) []privGroup {
	vm := privGroup{cat: "VM",
		admin: []string{"VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
			"VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.Migrate", "VM.Monitor",
			"VM.Snapshot", "VM.Snapshot.Rollback"},
		user:  []string{"VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup", "VM.PowerMgmt"},
		audit: []string{"VM.Audit"},
	}
	if major >= 9 {
		vm.admin = []string{"VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
			"VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.GuestAgent.Unrestricted",
			"VM.Migrate", "VM.Replicate", "VM.Snapshot", "VM.Snapshot.Rollback"}
		vm.user = []string{"VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup",
			"VM.GuestAgent.FileRead", "VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.PowerMgmt"}
		vm.audit = []string{"VM.Audit", "VM.GuestAgent.Audit"}
	}
	return []privGroup{
		vm,
		{cat: "Sys", root: []string{"Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"},
			admin: []string{"Sys.Console", "Sys.Syslog"}, audit: []string{"Sys.Audit"}},
		{cat: "Datastore", admin: []string{"Datastore.Allocate", "Datastore.AllocateTemplate"},
			user: []string{"Datastore.AllocateSpace"}, audit: []string{"Datastore.Audit"}},
		{cat: "SDN", admin: []string{"SDN.Allocate", "SDN.Audit"}, user: []string{"SDN.Use"}, audit: []string{"SDN.Audit"}},
		{cat: "User", root: []string{"Realm.Allocate"}, admin: []string{"User.Modify", "Group.Allocate", "Realm.AllocateUser"}},
		{cat: "Pool", admin: []string{"Pool.Allocate"}, user: []string{"Pool.Audit"}, audit: []string{"Pool.Audit"}},
		{cat: "Mapping", admin: []string{"Mapping.Modify"}, user: []string{"Mapping.Use"}, audit: []string{"Mapping.Audit"}},
	}
}

// validPrivileges is every privilege of a release ($valid_privs):
// Permissions.Modify is in no category.
func validPrivileges(major int) map[string]bool {
	out := map[string]bool{"Permissions.Modify": true}
	for _, g := range privGroups(major) {
		for _, l := range [][]string{g.root, g.admin, g.user, g.audit} {
			for _, p := range l {
				out[p] = true
			}
		}
	}
	return out
}

// builtinRoles are the special roles of a release, made as
// AccessControl.pm's create_roles makes them: PVE<Cat>Admin (admin, user
// and audit of a category), PVE<Cat>User (user and audit, where the user
// list is not empty), PVEAuditor (every audit list), PVEAdmin (admin, user
// and audit of all, less Mapping.Modify), PVETemplateUser, NoAccess and
// Administrator (everything).
func builtinRoles(major int) map[string]map[string]bool {
	roles := map[string]map[string]bool{
		"NoAccess":        {},
		"Administrator":   validPrivileges(major),
		"PVEAdmin":        {},
		"PVEAuditor":      {},
		"PVETemplateUser": {"VM.Clone": true, "VM.Audit": true},
	}
	add := func(role string, lists ...[]string) {
		if roles[role] == nil {
			roles[role] = map[string]bool{}
		}
		for _, l := range lists {
			for _, p := range l {
				roles[role][p] = true
			}
		}
	}
	for _, g := range privGroups(major) {
		add("PVE"+g.cat+"Admin", g.admin, g.user, g.audit)
		add("PVEAdmin", g.admin, g.user, g.audit)
		if len(g.user) > 0 {
			add("PVE"+g.cat+"User", g.user, g.audit)
		}
		add("PVEAuditor", g.audit)
	}
	delete(roles["PVEAdmin"], "Mapping.Modify")
	return roles
}

// BuiltinRole returns the privileges of one of PVE's built-in roles
// (Administrator, PVEVMAdmin, PVEAuditor, ...) in a release ("8.2", "8.4",
// "9.1"), sorted; nil for an unknown role or release.
func BuiltinRole(pveVersion, role string) []string {
	rel, err := parseRelease(pveVersion)
	if err != nil {
		return nil
	}
	privs, ok := builtinRoles(rel.major)[role]
	if !ok {
		return nil
	}
	return slices.Sorted(maps.Keys(privs))
}

// JobRoleName is the name the documentation gives the least-privilege
// role of delegate's API token.
const JobRoleName = "DelegateJobs"

// JobRolePrivileges is exactly what delegate's Proxmox backend needs, read
// in qemu-server (src/PVE/API2/Qemu.pm clone_vm, $check_vm_modify_config_perm,
// resize_vm, vm_start/vm_stop, destroy_vm; src/PVE/API2/Qemu/Agent.pm) and
// pve-manager (PVE/API2/Nodes.pm, PVE/API2/Cluster.pm resources):
//
//   - VM.Clone on the template; VM.Allocate on the new VM (clone) and to
//     destroy it;
//   - Datastore.AllocateSpace on the storage of every disk a clone creates
//     (and to grow a disk), Datastore.Audit to see the storages and whether
//     they are shared;
//   - SDN.Use on the bridge of every NIC a clone copies or a config sets
//     (/sdn/zones/localnetwork/<bridge> without SDN);
//   - VM.Config.CPU (cores, sockets), VM.Config.Memory (memory, balloon),
//     VM.Config.Options (name, tags, description), VM.Config.Network (net0,
//     also to delete it), VM.Config.Disk (backup=0 on the disks, resize);
//   - VM.PowerMgmt (start, stop), VM.Audit (config, status, and seeing the
//     VMs in /cluster/resources);
//   - VM.Snapshot (checkpoints: snapshot, rollback, delsnapshot);
//   - the guest agent: VM.Monitor on PVE 8; on PVE 9
//     VM.GuestAgent.Unrestricted, which exec needs and which also covers
//     ping, file-read and file-write;
//   - Sys.Audit on the nodes, without which /nodes and /cluster/resources
//     leave out every node's memory and cpu (placement is blind).
//
// The result is sorted; nil for an unknown release.
func JobRolePrivileges(pveVersion string) []string {
	rel, err := parseRelease(pveVersion)
	if err != nil {
		return nil
	}
	privs := []string{
		"Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use", "Sys.Audit",
		"VM.Allocate", "VM.Audit", "VM.Clone", "VM.Config.CPU", "VM.Config.Disk", "VM.Config.Memory",
		"VM.Config.Network", "VM.Config.Options", "VM.PowerMgmt", "VM.Snapshot",
	}
	if rel.major >= 9 {
		privs = append(privs, "VM.GuestAgent.Unrestricted")
	} else {
		privs = append(privs, "VM.Monitor")
	}
	slices.Sort(privs)
	return privs
}

// JobACLPaths are the paths the job role is granted on (with propagation)
// for a token whose VMs use the given storages and bridges: /vms, each
// /storage/<id>, /nodes, and /sdn/zones/localnetwork/<bridge>.
func JobACLPaths(storages, bridges []string) []string {
	paths := []string{"/vms", "/nodes"}
	for _, s := range storages {
		paths = append(paths, "/storage/"+s)
	}
	for _, b := range bridges {
		paths = append(paths, "/sdn/zones/localnetwork/"+b)
	}
	return paths
}

// JobPoolACLPaths are the paths of the job role for a token whose VMs
// live in a resource pool: the pool (its VMs), /nodes, the storages and
// the bridges. The templates need PVETemplateUser (VM.Clone, VM.Audit) on
// /vms/<vmid>, or to be in the pool.
func JobPoolACLPaths(pool string, storages, bridges []string) []string {
	paths := JobACLPaths(storages, bridges)
	paths[0] = "/pool/" + pool
	return paths
}

// PveumPoolCommands are PveumCommands for VMs in a resource pool: the
// pool, the job role on it (and on /nodes, the storages, the bridges),
// PVETemplateUser on each template.
func PveumPoolCommands(pveVersion, pool string, templates []int, storages, bridges []string) []string {
	privs := JobRolePrivileges(pveVersion)
	if privs == nil {
		return nil
	}
	out := []string{
		fmt.Sprintf("pveum pool add %s", pool),
		fmt.Sprintf("pveum role add %s -privs %q", JobRoleName, strings.Join(privs, ",")),
		"pveum user add delegate@pve",
		"pveum user token add delegate@pve jobs --privsep 1",
	}
	for _, p := range JobPoolACLPaths(pool, storages, bridges) {
		out = append(out, fmt.Sprintf("pveum acl modify %s --roles %s --users delegate@pve --tokens 'delegate@pve!jobs'", p, JobRoleName))
	}
	for _, t := range templates {
		out = append(out, fmt.Sprintf("pveum acl modify /vms/%d --roles PVETemplateUser --users delegate@pve --tokens 'delegate@pve!jobs'", t))
	}
	return out
}

// PveumCommands are the shell lines an administrator runs on a PVE node to
// make a least-privilege token for delegate (user "delegate@pve", token
// "jobs", privilege-separated), for a release and the storages and bridges
// its VMs use. The simulator makes the same objects through its API (see
// Server.CreateJobToken).
func PveumCommands(pveVersion string, storages, bridges []string) []string {
	privs := JobRolePrivileges(pveVersion)
	if privs == nil {
		return nil
	}
	out := []string{
		fmt.Sprintf("pveum role add %s -privs %q", JobRoleName, strings.Join(privs, ",")),
		"pveum user add delegate@pve",
		"pveum user token add delegate@pve jobs --privsep 1",
	}
	for _, p := range JobACLPaths(storages, bridges) {
		out = append(out, fmt.Sprintf("pveum acl modify %s --roles %s --users delegate@pve --tokens 'delegate@pve!jobs'", p, JobRoleName))
	}
	return out
}

// Privilege sets of PVE 9's built-in roles, for Token.Privileges (kept for
// existing callers; BuiltinRole gives any release's). A token added with
// one of them gets that role, translated to the simulator's release.
var (
	// RoleAdministrator has every privilege.
	RoleAdministrator = BuiltinRole("9.1", "Administrator")
	// RolePVEAuditor may only look.
	RolePVEAuditor = BuiltinRole("9.1", "PVEAuditor")
	// RolePVEVMAdmin is every VM.* privilege and nothing else: no
	// Sys.Audit, Datastore.AllocateSpace or SDN.Use.
	RolePVEVMAdmin = BuiltinRole("9.1", "PVEVMAdmin")
)
