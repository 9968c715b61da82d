package pvesim

import (
	"strconv"
	"strings"
)

// handlers serve the methods of the schema subset, by "METHOD path".
var handlers map[string]func(*call) (any, error)

func init() {
	const p = "/nodes/{node}/qemu/{vmid}"
	const ct = "/nodes/{node}/lxc/{vmid}"
	handlers = map[string]func(*call) (any, error){
		"GET /version":                                  hVersion,
		"GET /nodes":                                    hNodes,
		"GET /cluster/resources":                        hResources,
		"GET /cluster/nextid":                           hNextID,
		"POST " + p + "/clone":                          hClone,
		"GET " + p + "/config":                          hGetConfig,
		"POST " + p + "/config":                         func(c *call) (any, error) { return setConfig(c, true) },
		"PUT " + p + "/config":                          func(c *call) (any, error) { return setConfig(c, false) },
		"GET " + p + "/status/current":                  hStatusCurrent,
		"POST " + p + "/status/start":                   hStart,
		"POST " + p + "/status/stop":                    func(c *call) (any, error) { return stopVM(c, "qmstop") },
		"POST " + p + "/status/shutdown":                func(c *call) (any, error) { return stopVM(c, "qmshutdown") },
		"POST " + p + "/status/suspend":                 hSuspend,
		"POST " + p + "/status/resume":                  hResume,
		"DELETE " + p:                                   hDelete,
		"PUT " + p + "/resize":                          hResize,
		"GET /nodes/{node}/tasks/{upid}/status":         hTaskStatus,
		"GET /nodes/{node}/tasks/{upid}/log":            hTaskLog,
		"POST " + p + "/agent/ping":                     hAgentPing,
		"POST " + p + "/agent/exec":                     hAgentExec,
		"GET " + p + "/agent/exec-status":               hAgentExecStatus,
		"POST " + p + "/agent/file-write":               hAgentFileWrite,
		"GET " + p + "/agent/file-read":                 hAgentFileRead,
		"GET " + p + "/agent/network-get-interfaces":    hAgentNetwork,
		"GET " + p + "/agent/info":                      hAgentInfo,
		"GET " + p + "/pending":                         hPending,
		"GET /storage":                                  hStorageIndex,
		"GET /nodes/{node}/storage":                     hNodeStorage,
		"GET /access/roles":                             hRoles,
		"POST /access/roles":                            hCreateRole,
		"GET /access/roles/{roleid}":                    hRole,
		"PUT /access/roles/{roleid}":                    hUpdateRole,
		"DELETE /access/roles/{roleid}":                 hDeleteRole,
		"GET /access/users":                             hUsers,
		"POST /access/users":                            hCreateUser,
		"GET /access/users/{userid}":                    hUser,
		"DELETE /access/users/{userid}":                 hDeleteUser,
		"GET /access/users/{userid}/token":              hTokens,
		"GET /access/users/{userid}/token/{tokenid}":    hToken,
		"POST /access/users/{userid}/token/{tokenid}":   hCreateToken,
		"DELETE /access/users/{userid}/token/{tokenid}": hDeleteToken,
		"GET /access/acl":                               hACL,
		"PUT /access/acl":                               hUpdateACL,
		"GET /access/permissions":                       hPermissions,
		"GET /nodes/{node}/qemu":                        hVMList,
		"POST " + p + "/status/reboot":                  hReboot,
		"POST " + p + "/migrate":                        hMigrate,
		"POST /nodes/{node}/migrateall":                 hMigrateAll,
		"GET " + p + "/snapshot":                        hSnapshotList,
		"POST " + p + "/snapshot":                       hSnapshotCreate,
		"DELETE " + p + "/snapshot/{snapname}":          hSnapshotDelete,
		"POST " + p + "/snapshot/{snapname}/rollback":   hSnapshotRollback,
		"GET /nodes/{node}/lxc":                         hCTList,
		"GET " + ct + "/config":                         hCTConfig,
		"GET " + ct + "/status/current":                 hCTStatus,
		"POST " + ct + "/status/start":                  hCTStart,
		"POST " + ct + "/status/stop":                   func(c *call) (any, error) { return stopCT(c, "vzstop") },
		"POST " + ct + "/status/shutdown":               func(c *call) (any, error) { return stopCT(c, "vzshutdown") },
		"POST " + ct + "/status/reboot":                 hCTReboot,
		"DELETE " + ct:                                  hCTDelete,
		"GET /nodes/{node}/tasks":                       hTaskList,
		"GET /nodes/{node}/storage/{storage}/content":   hStorageContent,
		"GET /cluster/status":                           hClusterStatus,
		"GET /cluster/firewall/options":                 hClusterFWOptions,
		"GET /cluster/ha/status/manager_status":         hHAManagerStatus,
		"GET /nodes/{node}/config":                      hNodeConfig,
		"PUT /nodes/{node}/config":                      hSetNodeConfig,
		"GET /cluster/firewall/groups":                  hSecGroups,
		"POST /cluster/firewall/groups":                 hCreateSecGroup,
		"GET /cluster/firewall/groups/{group}":          hSecGroupRules,
		"POST /cluster/firewall/groups/{group}":         hAddSecGroupRule,
		"PUT /cluster/firewall/options":                 hSetClusterFWOptions,
		"GET /nodes/{node}/firewall/options":            hNodeFWOptions,
		"GET /nodes/{node}/network/{iface}":             hNodeIface,
		"PUT /nodes/{node}/firewall/options":            hSetNodeFWOptions,
		"GET " + p + "/firewall/options":                hVMFWOptions,
		"PUT " + p + "/firewall/options":                hSetVMFWOptions,
		"GET " + p + "/firewall/rules":                  hVMFWRules,
		"POST " + p + "/firewall/rules":                 hAddVMFWRule,
		"GET " + p + "/firewall/ipset":                  hVMIPSets,
		"POST " + p + "/firewall/ipset":                 hCreateVMIPSet,
		"GET " + p + "/firewall/ipset/{name}":           hVMIPSet,
		"POST " + p + "/firewall/ipset/{name}":          hAddVMIPSet,
	}
}

// Parameter access, after validation: integers and booleans are strings
// of the right shape, or JSON booleans.

func (c *call) has(name string) bool {
	v, ok := c.params[name]
	return ok && v != nil
}

func (c *call) str(name string) string {
	switch v := c.params[name].(type) {
	case string:
		return v
	case bool:
		if v {
			return "1"
		}
		return "0"
	}
	return ""
}

func (c *call) int(name string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(c.str(name)))
	return n
}

func (c *call) intOr(name string, def int) int {
	if !c.has(name) {
		return def
	}
	return c.int(name)
}

func (c *call) boolOr(name string, def bool) bool {
	if !c.has(name) {
		return def
	}
	return c.str(name) == "1"
}

// noSkiplock refuses skiplock: only root@pam may use it, and a token
// never is root@pam.
func (c *call) noSkiplock() error {
	if c.boolOr("skiplock", false) {
		return paramErr("skiplock", "Only root may use this option.")
	}
	return nil
}

// latin1 is how PVE puts bytes into JSON: each byte becomes the character
// with that code (Perl's JSON encoder on a byte string), so a client must
// map characters back to bytes to get binary data.
func latin1(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

// fromLatin1 is the other way, as Perl's encode_base64 sees a decoded
// string: characters up to 0xFF are bytes, above that it dies.
func fromLatin1(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xFF {
			return nil, dieErr("Wide character in subroutine entry")
		}
		out = append(out, byte(r))
	}
	return out, nil
}
