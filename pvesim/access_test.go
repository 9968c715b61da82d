package pvesim

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// caller sends API requests as one token and returns status, reason
// phrase and data.
type caller struct {
	s    *Server
	auth string
	http *http.Client
}

func as(s *Server, id, secret string) *caller {
	return &caller{s: s, auth: "PVEAPIToken=" + id + "=" + secret, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
}

func root(s *Server) *caller { return as(s, testTokenID, testTokenSecret) }

// do sends kv (key, value, key, value...) as a form (or a query for GET
// and DELETE).
func (c *caller) do(t *testing.T, method, path string, kv ...string) (int, string, any) {
	t.Helper()
	form := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		form.Add(kv[i], kv[i+1])
	}
	u := c.s.URL() + "/api2/json" + path
	var body io.Reader
	if method == "GET" || method == "DELETE" {
		if len(form) > 0 {
			u += "?" + form.Encode()
		}
	} else {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, u, body)
	req.Header.Set("Authorization", c.auth)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env struct {
		Data any `json:"data"`
	}
	json.Unmarshal(raw, &env)
	reason := strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode)+" ")
	return resp.StatusCode, reason, env.Data
}

// ok sends a request that must succeed and returns its data.
func (c *caller) ok(t *testing.T, method, path string, kv ...string) any {
	t.Helper()
	code, reason, data := c.do(t, method, path, kv...)
	if code != 200 {
		t.Fatalf("%s %s %v: %d %s", method, path, kv, code, reason)
	}
	return data
}

// expect sends a request that must fail with this status and reason.
func (c *caller) expect(t *testing.T, status int, reason, method, path string, kv ...string) {
	t.Helper()
	code, got, _ := c.do(t, method, path, kv...)
	if code != status || got != reason {
		t.Errorf("%s %s %v: %d %q, want %d %q", method, path, kv, code, got, status, reason)
	}
}

// waitOK waits for a task that must succeed.
func (c *caller) waitOK(t *testing.T, upid any) {
	t.Helper()
	u, _ := upid.(string)
	for range 3000 {
		st := c.ok(t, "GET", "/nodes/"+strings.Split(u, ":")[1]+"/tasks/"+url.PathEscape(u)+"/status").(map[string]any)
		if st["status"] == "stopped" {
			if st["exitstatus"] != "OK" {
				t.Fatalf("task %s: %v", u, st["exitstatus"])
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("task %s did not end", u)
}

// waitFail waits for a task that must fail and returns its exit status.
func (c *caller) waitFail(t *testing.T, upid any) string {
	t.Helper()
	u, _ := upid.(string)
	for range 3000 {
		st := c.ok(t, "GET", "/nodes/"+strings.Split(u, ":")[1]+"/tasks/"+url.PathEscape(u)+"/status").(map[string]any)
		if st["status"] == "stopped" {
			if st["exitstatus"] == "OK" {
				t.Fatalf("task %s succeeded", u)
			}
			return st["exitstatus"].(string)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("task %s did not end", u)
	return ""
}

// makeToken creates user and privilege-separated token through the API
// and grants role on each path to both; it returns the token's caller.
func makeToken(t *testing.T, s *sim, user, name, role string, paths ...string) *caller {
	t.Helper()
	r := root(s.Server)
	if code, _, _ := r.do(t, "GET", "/access/users/"+user); code != 200 {
		r.ok(t, "POST", "/access/users", "userid", user)
	}
	tok := r.ok(t, "POST", "/access/users/"+user+"/token/"+name).(map[string]any)
	full := tok["full-tokenid"].(string)
	for _, p := range paths {
		r.ok(t, "PUT", "/access/acl", "path", p, "roles", role, "users", user, "tokens", full)
	}
	return as(s.Server, full, tok["value"].(string))
}

// TestBuiltinRoles: the built-in roles of PVE 8 and PVE 9, from the same
// privilege groups as pve-access-control, agree with each release's
// schema, and PVE 9 splits VM.Monitor into VM.GuestAgent.*.
func TestBuiltinRoles(t *testing.T) {
	for _, v := range Releases() {
		t.Run(v, func(t *testing.T) {
			schema, err := LoadSchemaFor(v)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := parseRelease(v)
			valid := validPrivileges(rel.major)
			if got := schema.Privileges(); len(got) != len(valid) {
				t.Errorf("schema privileges %v, tables %v", got, valid)
			} else {
				for p := range valid {
					if !got[p] {
						t.Errorf("%s: not in the PVE %s schema", p, v)
					}
				}
			}
			vmAdmin := BuiltinRole(v, "PVEVMAdmin")
			for _, p := range vmAdmin {
				if !strings.HasPrefix(p, "VM.") {
					t.Errorf("PVEVMAdmin has %s", p)
				}
			}
			monitor := slices.Contains(vmAdmin, "VM.Monitor")
			agent := slices.Contains(vmAdmin, "VM.GuestAgent.Unrestricted")
			if monitor != (rel.major == 8) || agent != (rel.major == 9) {
				t.Errorf("PVE %s PVEVMAdmin: %v", v, vmAdmin)
			}
			if slices.Contains(BuiltinRole(v, "PVEAdmin"), "Mapping.Modify") {
				t.Error("PVEAdmin has Mapping.Modify")
			}
			if got := BuiltinRole(v, "PVETemplateUser"); !slices.Equal(got, []string{"VM.Audit", "VM.Clone"}) {
				t.Errorf("PVETemplateUser %v", got)
			}
			for _, p := range JobRolePrivileges(v) {
				if !valid[p] {
					t.Errorf("job role: %s is no PVE %s privilege", p, v)
				}
			}
			// The API shows them.
			s := newSim(t, Options{PVEVersion: v})
			role := root(s.Server).ok(t, "GET", "/access/roles/PVEVMAdmin").(map[string]any)
			if len(role) != len(vmAdmin) {
				t.Errorf("GET PVEVMAdmin: %v", role)
			}
		})
	}
}

// TestLeastPrivilegeToken: the token CreateJobToken makes through the
// access API, with the documented role, runs a whole job on PVE 8 and 9:
// nextid, linked clone, config, resize, start, guest agent (ping, files,
// exec), status, stop, destroy; and it sees node memory and storages.
func TestLeastPrivilegeToken(t *testing.T) {
	for _, v := range []string{"8.4", "9.1"} {
		t.Run(v, func(t *testing.T) {
			s := newSim(t, Options{PVEVersion: v})
			jt, err := s.CreateJobToken(ctxT(t), Token{ID: testTokenID, Secret: testTokenSecret})
			if err != nil {
				t.Fatal(err)
			}
			want := PveumCommands(v, []string{"local-lvm"}, []string{"vmbr0"})
			if !strings.Contains(want[0], strings.Join(jt.Privileges, ",")) || len(jt.Paths) != len(want)-3 {
				t.Errorf("token %+v does not match the documented commands %q", jt, want)
			}
			c := newClient(t, s.Server, jt.User, jt.TokenName, jt.Secret)
			ctx := ctxT(t)
			nodes, err := c.Nodes(ctx)
			if err != nil || nodes[0].MaxMem == 0 {
				t.Fatalf("nodes without their memory: %+v %v", nodes, err)
			}
			res, err := c.ClusterResources(ctx, pve.ResourceAll)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, r := range res {
				seen[r.Type] = true
			}
			if !seen["qemu"] || !seen["node"] || !seen["storage"] {
				t.Errorf("resources: %+v", res)
			}
			id, _ := c.NextID(ctx)
			upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: id, Name: "job-1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.WaitTask(ctx, "", upid); err != nil {
				t.Fatal(err)
			}
			desc := "job 1"
			if err := c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Cores: 1, Sockets: 1, MemoryMiB: 1024,
				Tags: []string{"delegate", "job-1"}, Description: &desc, Options: map[string]string{"balloon": "0"},
				Delete: []string{"net0"}}); err != nil {
				t.Fatal(err)
			}
			if upid, err = c.ResizeDisk(ctx, "pve1", id, "scsi0", "+1G"); err == nil {
				err = c.WaitTask(ctx, "", upid)
			}
			if err != nil {
				t.Fatal(err)
			}
			if upid, err = c.StartVM(ctx, "pve1", id); err == nil {
				err = c.WaitTask(ctx, "", upid)
			}
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(20 * time.Second); ; {
				err := c.AgentPing(ctx, "pve1", id)
				if err == nil {
					break
				}
				if !pve.IsAgentNotRunning(err) || time.Now().After(deadline) {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := c.AgentFileWrite(ctx, "pve1", id, "/workspace/in", []byte("hi")); err != nil {
				t.Fatal(err)
			}
			if f, err := c.AgentFileRead(ctx, "pve1", id, "/workspace/in"); err != nil || string(f.Data) != "hi" {
				t.Fatalf("file-read: %q %v", f.Data, err)
			}
			pid, err := c.AgentExec(ctx, "pve1", id, []string{"cat", "/workspace/in"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			for {
				st, err := c.AgentExecStatus(ctx, "pve1", id, pid)
				if err != nil {
					t.Fatal(err)
				}
				if st.Exited {
					if string(st.Stdout) != "hi" {
						t.Errorf("exec: %+v", st)
					}
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := c.VMStatus(ctx, "pve1", id); err != nil {
				t.Fatal(err)
			}
			if upid, err = c.StopVM(ctx, "pve1", id); err == nil {
				err = c.WaitTask(ctx, "", upid)
			}
			if err != nil {
				t.Fatal(err)
			}
			if upid, err = c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{Purge: true}); err == nil {
				err = c.WaitTask(ctx, "", upid)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVMAdminOnlyToken: PVEVMAdmin holds VM.* only, so a clone is refused
// for the storage (never for lack of memory), and the nodes show no
// memory or cpu without Sys.Audit.
func TestVMAdminOnlyToken(t *testing.T) {
	s := newSim(t, Options{})
	c := makeToken(t, s, "vmadmin@pve", "jobs", "PVEVMAdmin", "/")
	c.expect(t, 403, "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)",
		"POST", "/nodes/pve1/qemu/9000/clone", "newid", "100")
	nodes := c.ok(t, "GET", "/nodes").([]any)
	n := nodes[0].(map[string]any)
	for _, k := range []string{"mem", "maxmem", "cpu", "maxcpu", "uptime", "disk", "maxdisk"} {
		if _, ok := n[k]; ok {
			t.Errorf("/nodes shows %s without Sys.Audit: %v", k, n)
		}
	}
	if n["status"] != "online" || n["level"] != "" || n["node"] != "pve1" {
		t.Errorf("/nodes: %v", n)
	}
	for _, r := range c.ok(t, "GET", "/cluster/resources").([]any) {
		e := r.(map[string]any)
		switch e["type"] {
		case "node":
			if _, ok := e["maxmem"]; ok {
				t.Errorf("resources show a node's memory without Sys.Audit: %v", e)
			}
		case "storage", "sdn", "pool":
			t.Errorf("resources show %v without audit privileges", e)
		}
	}
	// With the storage (and the bridge) granted, the clone goes through.
	root(s.Server).ok(t, "PUT", "/access/acl", "path", "/storage/local-lvm", "roles", "PVEDatastoreUser",
		"users", "vmadmin@pve", "tokens", "vmadmin@pve!jobs")
	c.expect(t, 403, "Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)",
		"POST", "/nodes/pve1/qemu/9000/clone", "newid", "100")
	root(s.Server).ok(t, "PUT", "/access/acl", "path", "/sdn/zones/localnetwork", "roles", "PVESDNUser",
		"users", "vmadmin@pve", "tokens", "vmadmin@pve!jobs")
	c.waitOK(t, c.ok(t, "POST", "/nodes/pve1/qemu/9000/clone", "newid", "100"))
}

// TestPrivsep: a privilege-separated token has what its ACLs and its
// user's have in common; one without privilege separation has its user's.
func TestPrivsep(t *testing.T) {
	s := newSim(t, Options{})
	r := root(s.Server)
	r.ok(t, "POST", "/access/users", "userid", "ops@pve")
	r.ok(t, "PUT", "/access/acl", "path", "/vms", "roles", "PVEVMUser", "users", "ops@pve")
	sep := r.ok(t, "POST", "/access/users/ops@pve/token/sep").(map[string]any)
	r.ok(t, "PUT", "/access/acl", "path", "/", "roles", "Administrator", "tokens", "ops@pve!sep")
	full := r.ok(t, "POST", "/access/users/ops@pve/token/full", "privsep", "0").(map[string]any)
	if info := full["info"].(map[string]any); info["privsep"] != float64(0) {
		t.Errorf("token info %v", info)
	}
	perms := func(tokenid, path string) map[string]any {
		p := r.ok(t, "GET", "/access/permissions", "userid", tokenid, "path", path).(map[string]any)
		return p[path].(map[string]any)
	}
	vms := perms("ops@pve!sep", "/vms/100")
	if vms["VM.PowerMgmt"] == nil || vms["VM.Allocate"] != nil || len(perms("ops@pve!sep", "/nodes")) != 0 {
		t.Errorf("privsep token: /vms/100 %v, /nodes %v", vms, perms("ops@pve!sep", "/nodes"))
	}
	if got := perms("ops@pve!full", "/vms/100"); len(got) != len(vms) {
		t.Errorf("token without privsep: %v, want its user's %v", got, vms)
	}
	c := as(s.Server, "ops@pve!sep", sep["value"].(string))
	c.expect(t, 403, "Permission check failed (/vms/9000, VM.Allocate)", "DELETE", "/nodes/pve1/qemu/9000")
	c.expect(t, 403, "Permission check failed (/access, Sys.Modify)", "POST", "/access/roles", "roleid", "x")
}

// TestACLPaths: an ACL applies to its path and, when it propagates, below;
// NoAccess wins; a token's ACL replaces its user's on the way down.
func TestACLPaths(t *testing.T) {
	s := newSim(t, Options{})
	r := root(s.Server)
	r.ok(t, "POST", "/access/users", "userid", "acl@pve")
	r.ok(t, "PUT", "/access/acl", "path", "/vms", "roles", "PVEAuditor", "users", "acl@pve", "propagate", "0")
	r.ok(t, "PUT", "/access/acl", "path", "/storage", "roles", "PVEDatastoreUser", "users", "acl@pve")
	r.ok(t, "PUT", "/access/acl", "path", "/storage/local", "roles", "NoAccess", "users", "acl@pve")
	perms := func(path string) map[string]any {
		p := r.ok(t, "GET", "/access/permissions", "userid", "acl@pve", "path", path).(map[string]any)
		return p[path].(map[string]any)
	}
	if perms("/vms")["VM.Audit"] == nil || len(perms("/vms/100")) != 0 {
		t.Errorf("propagate=0: /vms %v, /vms/100 %v", perms("/vms"), perms("/vms/100"))
	}
	if perms("/storage/local-lvm")["Datastore.AllocateSpace"] != float64(1) || len(perms("/storage/local")) != 0 {
		t.Errorf("propagation and NoAccess: %v, %v", perms("/storage/local-lvm"), perms("/storage/local"))
	}
	acl := r.ok(t, "GET", "/access/acl").([]any)
	if len(acl) < 3 {
		t.Errorf("GET /access/acl: %v", acl)
	}
	r.expect(t, 400, "Parameter verification failed.", "PUT", "/access/acl", "path", "/nonsense", "roles", "PVEAuditor", "users", "acl@pve")
	r.expect(t, 500, "ACL update failed: role 'Nope' does not exist", "PUT", "/access/acl", "path", "/vms", "roles", "Nope", "users", "acl@pve")
	r.expect(t, 500, "ACL update failed: user 'nobody@pve' does not exist", "PUT", "/access/acl", "path", "/vms", "roles", "PVEAuditor", "users", "nobody@pve")
}

// TestAccessAPIRules: what each access endpoint checks, with PVE's
// messages.
func TestAccessAPIRules(t *testing.T) {
	s := newSim(t, Options{})
	r := root(s.Server)
	r.expect(t, 400, "Parameter verification failed.", "POST", "/access/roles", "roleid", "PVEMine")
	r.expect(t, 400, "Parameter verification failed.", "POST", "/access/roles", "roleid", "Mine", "privs", "VM.Monitor")
	r.ok(t, "POST", "/access/roles", "roleid", "Mine", "privs", "VM.Audit,VM.Allocate")
	r.expect(t, 500, "create role failed: role 'Mine' already exists", "POST", "/access/roles", "roleid", "Mine")
	r.expect(t, 500, "auto-generated role 'PVEVMAdmin' cannot be modified", "PUT", "/access/roles/PVEVMAdmin", "privs", "VM.Audit")
	r.ok(t, "PUT", "/access/roles/Mine", "privs", "VM.Console", "append", "1")
	if role := r.ok(t, "GET", "/access/roles/Mine").(map[string]any); len(role) != 3 {
		t.Errorf("appended role: %v", role)
	}
	r.ok(t, "POST", "/access/users", "userid", "alloc@pve")
	r.expect(t, 500, "create user failed: user 'alloc@pve' already exists", "POST", "/access/users", "userid", "alloc@pve")
	r.expect(t, 400, "Parameter verification failed.", "POST", "/access/users/alloc@pve/token/bad!name")

	// VM.Allocate on a VM lets a user hand out the privileges it has there,
	// and no more (qemu-server's perm-modify; ACL.pm update_acl).
	r.ok(t, "PUT", "/access/acl", "path", "/vms/100", "roles", "Mine", "users", "alloc@pve")
	c := makeToken(t, &sim{Server: s.Server}, "alloc@pve", "tk", "Mine", "/vms/100")
	r.ok(t, "POST", "/access/users", "userid", "friend@pve")
	r.ok(t, "POST", "/access/roles", "roleid", "Viewer", "privs", "VM.Audit")
	c.ok(t, "PUT", "/access/acl", "path", "/vms/100", "roles", "Viewer", "users", "friend@pve", "propagate", "0")
	c.expect(t, 500, "ACL update failed: 400 Parameter verification failed.", "PUT", "/access/acl",
		"path", "/vms/100", "roles", "PVEVMAdmin", "users", "friend@pve", "propagate", "0")
	c.expect(t, 403, "Permission check failed (/vms/101, Permissions.Modify|VM.Allocate)", "PUT", "/access/acl",
		"path", "/vms/101", "roles", "Viewer", "users", "friend@pve")
	c.expect(t, 403, "Permission check failed (/access/realm/pve, Realm.AllocateUser)", "POST", "/access/users", "userid", "x@pve")
	c.expect(t, 403, "Permission check failed", "POST", "/access/users/friend@pve/token/tk")
	users := c.ok(t, "GET", "/access/users").([]any)
	if len(users) != 0 {
		t.Errorf("a token without User.Modify lists users: %v", users)
	}
	r.ok(t, "DELETE", "/access/users/alloc@pve/token/tk")
	code, reason, _ := c.do(t, "GET", "/version")
	if code != 401 || reason != "Authentication failed!" {
		t.Errorf("deleted token: %d %s", code, reason)
	}
}

// TestConfigPrivileges: each option of a config update needs its own
// privilege (qemu-server's $check_vm_modify_config_perm).
func TestConfigPrivileges(t *testing.T) {
	s := newSim(t, Options{})
	r := root(s.Server)
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/9000/clone", "newid", "100"))
	r.ok(t, "POST", "/access/roles", "roleid", "CPUOnly", "privs", "VM.Audit,VM.Config.CPU")
	c := makeToken(t, s, "cpu@pve", "tk", "CPUOnly", "/vms")
	const vm = "/nodes/pve1/qemu/100/config"
	c.ok(t, "PUT", vm, "cores", "3", "sockets", "1")
	for _, tc := range []struct {
		kv     []string
		status int
		reason string
	}{
		{[]string{"memory", "1024"}, 403, "Permission check failed (/vms/100, VM.Config.Memory)"},
		{[]string{"balloon", "0"}, 403, "Permission check failed (/vms/100, VM.Config.Memory)"},
		{[]string{"name", "x"}, 403, "Permission check failed (/vms/100, VM.Config.Options)"},
		{[]string{"delete", "net0"}, 403, "Permission check failed (/vms/100, VM.Config.Network)"},
		{[]string{"ipconfig0", "ip=dhcp"}, 403, "Permission check failed (/vms/100, VM.Config.Cloudinit|VM.Config.Network)"},
		{[]string{"tags", "a"}, 403, "Permission check failed (/vms/100, VM.Config.Options)"},
		{[]string{"scsi1", "local-lvm:1"}, 403, "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"},
		{[]string{"args", "-no-reboot"}, 500, "only root can set 'args' config"},
		{[]string{"delete", "nonsense"}, 400, "Parameter verification failed."},
	} {
		c.expect(t, tc.status, tc.reason, "PUT", vm, tc.kv...)
	}
	// In a task, a refused privilege is the exit status, with its code.
	r.ok(t, "POST", "/access/roles", "roleid", "CPUDisk", "privs", "VM.Audit,VM.Config.CPU,Datastore.AllocateSpace")
	d := makeToken(t, s, "disk@pve", "tk", "CPUDisk", "/vms", "/storage")
	if got := d.waitFail(t, d.ok(t, "POST", vm, "scsi1", "local-lvm:1")); got != "403 Permission check failed (/vms/100, VM.Config.Disk)" {
		t.Errorf("disk without VM.Config.Disk: %q", got)
	}
}

// TestBalloonAndSockets: a balloon larger than the memory is refused, on
// the balloon set or on the memory lowered below the config's balloon;
// vCPUs are sockets x cores.
func TestBalloonAndSockets(t *testing.T) {
	s := newSim(t, Options{})
	if err := s.AddTemplate("pve1", 9100, "big", TemplateSpec{MemoryMiB: 8192, BalloonMiB: 4096, Sockets: 2, Cores: 2}); err != nil {
		t.Fatal(err)
	}
	r := root(s.Server)
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/9100/clone", "newid", "100"))
	const vm = "/nodes/pve1/qemu/100"
	const tooLarge = "balloon value too large (must be smaller than assigned memory)"
	r.expect(t, 500, tooLarge, "PUT", vm+"/config", "memory", "2048")
	r.expect(t, 500, tooLarge, "POST", vm+"/config", "balloon", "9000")
	r.expect(t, 500, tooLarge, "PUT", vm+"/config", "memory", "2048", "delete", "balloon")
	r.ok(t, "PUT", vm+"/config", "memory", "2048", "balloon", "0")
	r.ok(t, "PUT", vm+"/config", "memory", "2048", "balloon", "2048")
	st := r.ok(t, "GET", vm+"/status/current").(map[string]any)
	if st["cpus"] != float64(4) || st["maxmem"] != float64(2048<<20) {
		t.Errorf("status: %v", st)
	}
	for _, e := range r.ok(t, "GET", "/cluster/resources", "type", "vm").([]any) {
		if e := e.(map[string]any); e["vmid"] == float64(100) && e["maxcpu"] != float64(4) {
			t.Errorf("maxcpu %v, want sockets x cores", e)
		}
	}
}

// TestSharedStorage: storages say whether they are shared; a template on
// shared storage clones to any node, one on local storage only to its own.
func TestSharedStorage(t *testing.T) {
	s := newSim(t, Options{Nodes: DefaultNodes(2), Storages: append(DefaultStorages(), SharedStorage("ceph"))})
	if err := s.AddTemplate("pve1", 9100, "shared-tpl", TemplateSpec{Storage: "ceph"}); err != nil {
		t.Fatal(err)
	}
	r := root(s.Server)
	shared := map[string]any{}
	for _, e := range r.ok(t, "GET", "/storage").([]any) {
		e := e.(map[string]any)
		shared[e["storage"].(string)] = e["shared"]
	}
	if shared["ceph"] != float64(1) || shared["local-lvm"] != nil || len(shared) != 3 {
		t.Errorf("GET /storage: %v", shared)
	}
	n := 0
	for _, e := range r.ok(t, "GET", "/cluster/resources", "type", "storage").([]any) {
		e := e.(map[string]any)
		if e["storage"] == "ceph" && e["shared"] == float64(1) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("ceph on %d nodes in /cluster/resources", n)
	}
	st := r.ok(t, "GET", "/nodes/pve2/storage", "content", "images").([]any)
	if len(st) != 2 {
		t.Errorf("/nodes/pve2/storage?content=images: %v", st)
	}
	// Linked clone to another node from shared storage.
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/9100/clone", "newid", "100", "target", "pve2"))
	if v, ok := s.VM(100); !ok || v.Node != "pve2" || !strings.HasPrefix(v.Config["scsi0"], "ceph:base-9100-disk-0/vm-100-disk-0,") {
		t.Errorf("clone on pve2: %+v", v)
	}
	r.expect(t, 500, "can't clone VM to node 'pve2' (VM uses local storage)", "POST", "/nodes/pve1/qemu/9000/clone",
		"newid", "101", "target", "pve2")
	r.expect(t, 500, "can't clone VM to node 'pve2' (VM uses local storage)", "POST", "/nodes/pve1/qemu/9000/clone",
		"newid", "101", "target", "pve2", "full", "1")
	r.expect(t, 500, "can't clone to non-shared storage 'local-lvm'", "POST", "/nodes/pve1/qemu/9100/clone",
		"newid", "101", "target", "pve2", "full", "1", "storage", "local-lvm")
	// A VM's id is cluster-wide: pve2 cannot take the id of a VM on pve1.
	if err := s.AddTemplate("pve2", 9200, "tpl2", TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	got := r.waitFail(t, r.ok(t, "POST", "/nodes/pve2/qemu/9200/clone", "newid", "9100"))
	if got != "close (rename) atomic file '/etc/pve/nodes/pve2/qemu-server/9100.conf' failed: File exists" {
		t.Errorf("clone onto another node's vmid: %q", got)
	}
	// No template on thick LVM: it lacks the template feature.
	s2 := newSim(t, Options{Storages: append(DefaultStorages(), StorageSpec{ID: "san", Type: "lvm", Shared: true})})
	if err := s2.AddTemplate("pve1", 9100, "lvm-tpl", TemplateSpec{Storage: "san"}); err == nil {
		t.Error("a template on thick LVM")
	}
}

// TestRHELAgent: a guest whose qemu-ga leaves exec and the file calls out
// of its allow-list answers ping, and refuses the rest as qemu-ga does.
func TestRHELAgent(t *testing.T) {
	for _, emulation := range []bool{false, true} {
		t.Run(fmt.Sprintf("emulation=%v", emulation), func(t *testing.T) { testRHELAgent(t, emulation) })
	}
}

func testRHELAgent(t *testing.T, emulation bool) {
	s := newSim(t, Options{AgentEmulation: emulation})
	if err := s.AddTemplate("pve1", 9100, "rocky", TemplateSpec{AgentDisabledRPCs: RHELAgentDisabledRPCs()}); err != nil {
		t.Fatal(err)
	}
	r := root(s.Server)
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/9100/clone", "newid", "100"))
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/100/status/start"))
	waitAgent(t, s, 100)
	const vm = "/nodes/pve1/qemu/100/agent"
	// qemu-ga 7.2's words (8.1 and later add ": the command is not
	// allowed" for what --allow-rpcs leaves out).
	r.expect(t, 500, "Agent error: Command guest-exec has been disabled", "POST", vm+"/exec", "command", "true")
	r.expect(t, 500, "Agent error: Command guest-file-open has been disabled", "POST", vm+"/file-write",
		"file", "/tmp/x", "content", "x")
	r.expect(t, 500, "Agent error: Command guest-file-open has been disabled", "GET", vm+"/file-read",
		"file", "/etc/hostname")
	r.ok(t, "GET", vm+"/network-get-interfaces")
	r.ok(t, "POST", vm+"/ping")
	// agent/info says what it refuses.
	var info struct {
		Result struct {
			Commands []struct {
				Name    string `json:"name"`
				Enabled bool   `json:"enabled"`
			} `json:"supported_commands"`
		} `json:"result"`
	}
	raw, _ := json.Marshal(r.ok(t, "GET", vm+"/info"))
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	disabled := map[string]bool{}
	for _, c := range info.Result.Commands {
		if !c.Enabled {
			disabled[c.Name] = true
		}
	}
	for _, c := range []string{"guest-exec", "guest-file-open", "guest-file-write"} {
		if !disabled[c] {
			t.Errorf("agent/info: %s enabled (disabled: %v)", c, disabled)
		}
	}
	if disabled["guest-ping"] || len(info.Result.Commands) < 5 {
		t.Errorf("agent/info: %+v", info.Result.Commands)
	}
}

// TestReleases: PVE 8.2 and 8.4 speak the PVE 8 schema and privileges
// (the guest agent needs VM.Monitor), 8.2 caps request bodies at 64 KiB.
func TestReleases(t *testing.T) {
	body := strings.Repeat("a", 100<<10)
	for _, tc := range []struct {
		version, reported string
		bodyOK            bool
	}{
		{"8.2", "8.2.4", false},
		{"8.4", "8.4.1", true},
		{"9.1", "9.1.1", true},
	} {
		t.Run(tc.version, func(t *testing.T) {
			s := newSim(t, Options{PVEVersion: tc.version})
			r := root(s.Server)
			if v := r.ok(t, "GET", "/version").(map[string]any); v["version"] != tc.reported {
				t.Errorf("version %v", v)
			}
			code, reason, _ := r.do(t, "POST", "/nodes/pve1/qemu/9000/config", "description", body)
			if tc.bodyOK != (code != 501) {
				t.Errorf("100 KiB body: %d %s", code, reason)
			}
			if tc.version != "9.1" {
				r.expect(t, 400, "Parameter verification failed.", "POST", "/access/roles", "roleid", "A", "privs", "VM.GuestAgent.Audit")
				r.ok(t, "POST", "/access/roles", "roleid", "Agent", "privs", "VM.Audit,VM.Monitor")
			} else {
				r.expect(t, 400, "Parameter verification failed.", "POST", "/access/roles", "roleid", "A", "privs", "VM.Monitor")
				r.ok(t, "POST", "/access/roles", "roleid", "Agent", "privs", "VM.Audit,VM.GuestAgent.Audit")
			}
			// A PVE 9 admin token added by AddToken is an Administrator on 8 too.
			c := newClient(t, s.Server, "root@pam", "delegate", testTokenSecret)
			if _, err := c.AgentExec(ctxT(t), "pve1", 9000, []string{"true"}, nil); reasonOf(err) != "VM 9000 is not running" {
				t.Errorf("exec as administrator: %v", err)
			}
			a := makeToken(t, s, "agent@pve", "tk", "Agent", "/vms")
			want := "Permission check failed (/vms/9000, VM.GuestAgent.Unrestricted)"
			if tc.version != "9.1" {
				want = "VM 9000 is not running" // VM.Monitor is all the agent needs on PVE 8
			}
			code, reason, _ = a.do(t, "POST", "/nodes/pve1/qemu/9000/agent/exec", "command", "true")
			if reason != want {
				t.Errorf("exec with the agent role: %d %s, want %s", code, reason, want)
			}
		})
	}
}

// TestStatsLag: with a pvestatd cycle, a new VM shows in
// /cluster/resources at once but without figures (status unknown, no
// name, no maxmem) until the next cycle.
func TestStatsLag(t *testing.T) {
	s := newSim(t, Options{StatsInterval: 700 * time.Millisecond})
	r := root(s.Server)
	r.waitOK(t, r.ok(t, "POST", "/nodes/pve1/qemu/9000/clone", "newid", "100", "name", "fresh"))
	find := func() map[string]any {
		for _, e := range r.ok(t, "GET", "/cluster/resources", "type", "vm").([]any) {
			if e := e.(map[string]any); e["vmid"] == float64(100) {
				return e
			}
		}
		return nil
	}
	e := find()
	if e == nil || e["status"] != "unknown" || e["name"] != nil || e["maxmem"] != nil {
		t.Errorf("new VM before pvestatd's cycle: %v", e)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e = find(); e["name"] == nil && time.Now().Before(deadline); e = find() {
		time.Sleep(50 * time.Millisecond)
	}
	if e["name"] != "fresh" || e["status"] != "stopped" || e["maxmem"] != float64(2048<<20) {
		t.Errorf("after a cycle: %v", e)
	}
}

// TestRealLatency: with the real profile, every request takes 10-50 ms.
func TestRealLatency(t *testing.T) {
	s := newSim(t, Options{Latency: "real"})
	r := root(s.Server)
	for range 5 {
		start := time.Now()
		r.ok(t, "GET", "/version")
		if d := time.Since(start); d < 10*time.Millisecond {
			t.Errorf("a request took %v", d)
		}
	}
	// Fields set explicitly (newSim's task and boot delays) win.
	if s.taskDelay("qmclone") != 2*time.Second || s.opts.StatsInterval != 10*time.Second || s.opts.AgentLatency != 25*time.Millisecond {
		t.Errorf("real profile: %+v", s.opts)
	}
	if _, err := New(Options{Latency: "slow"}); err == nil || !strings.Contains(err.Error(), "fast or real") {
		t.Errorf("bad latency: %v", err)
	}
}
