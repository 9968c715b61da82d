package pvesim

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// TestHTTPErrors checks status, reason phrase and body of error answers
// through raw HTTP, as Proxmox sends them.
func TestHTTPErrors(t *testing.T) {
	s := newSim(t, Options{})
	if err := s.AddToken(Token{ID: "audit@pve!ro", Secret: "ro-secret", Privileges: RolePVEAuditor}); err != nil {
		t.Fatal(err)
	}
	const ro = "PVEAPIToken=audit@pve!ro=ro-secret"
	tests := []struct {
		name       string
		method     string
		path       string
		auth       string // "" the admin token, "-" none
		ct, body   string
		status     int
		reason     string
		errors     map[string]string // the 400's errors
		noBody     bool
		hasMessage bool
	}{
		{name: "unknown parameter", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/clone",
			ct: "application/x-www-form-urlencoded", body: "newid=101&linked=1",
			status: 400, reason: "Parameter verification failed.", hasMessage: true,
			errors: map[string]string{"linked": "property is not defined in schema and the schema does not allow additional properties"}},
		{name: "bad enum (JSON body)", method: "GET", path: "/api2/json/cluster/resources?type=qemu",
			status: 400, reason: "Parameter verification failed.", hasMessage: true,
			errors: map[string]string{"type": "value 'qemu' does not have a value in the enumeration 'vm, storage, node, sdn'"}},
		{name: "bad type (JSON)", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/clone",
			ct: "application/json", body: `{"newid":"x101","full":"true"}`,
			status: 400, reason: "Parameter verification failed.", hasMessage: true,
			errors: map[string]string{"newid": "type check ('integer') failed - got 'x101'", "full": "type check ('boolean') failed - got 'true'"}},
		{name: "no token", method: "GET", path: "/api2/json/version", auth: "-",
			status: 401, reason: "No ticket", noBody: true},
		{name: "wrong secret", method: "GET", path: "/api2/json/version", auth: "PVEAPIToken=" + testTokenID + "=nope",
			status: 401, reason: "Authentication failed!", noBody: true},
		{name: "unknown token", method: "GET", path: "/api2/json/version", auth: "PVEAPIToken=root@pam!other=" + testTokenSecret,
			status: 401, reason: "Authentication failed!", noBody: true},
		{name: "ticket cookie", method: "GET", path: "/api2/json/version", auth: "PVEAuthCookie=PVE:root@pam:619510AC::sig",
			status: 401, reason: "Authentication failed!", noBody: true},
		{name: "read-only token clones", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/clone", auth: ro,
			ct: "application/x-www-form-urlencoded", body: "newid=101",
			status: 403, reason: "Permission check failed (/vms/9000, VM.Clone)", hasMessage: true},
		{name: "read-only token starts", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/status/start", auth: ro,
			status: 403, reason: "Permission check failed (/vms/9000, VM.PowerMgmt)", hasMessage: true},
		// PVEAuditor has VM.GuestAgent.Audit on PVE 9, so it may ping, not exec.
		{name: "read-only token pings the agent", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/agent/ping", auth: ro,
			status: 500, reason: "VM 9000 is not running", hasMessage: true},
		{name: "read-only token runs a command", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/agent/exec", auth: ro,
			status: 403, reason: "Permission check failed (/vms/9000, VM.GuestAgent.Unrestricted)", hasMessage: true},
		// Permissions come before parameters, as in pve-manager.
		{name: "403 before 400", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/clone", auth: ro,
			ct: "application/x-www-form-urlencoded", body: "bogus=1",
			status: 403, reason: "Permission check failed (/vms/9000, VM.Clone)", hasMessage: true},
		{name: "no such method", method: "GET", path: "/api2/json/nodes/pve1/nonsense",
			status: 501, reason: "Method 'GET /nodes/pve1/nonsense' not implemented", hasMessage: true},
		{name: "real but not simulated", method: "GET", path: "/api2/json/nodes/pve1/network",
			status: 501, reason: "Method 'GET /nodes/pve1/network' not implemented", hasMessage: true},
		{name: "body on GET", method: "GET", path: "/api2/json/version", ct: "application/x-www-form-urlencoded", body: "a=1",
			status: 501, reason: "Unexpected content for method 'GET'", noBody: true},
		{name: "too large", method: "POST", path: "/api2/json/nodes/pve1/qemu/100/agent/file-write",
			ct: "application/x-www-form-urlencoded", body: "file=/tmp/x&content=" + strings.Repeat("a", 600<<10),
			status: 501, reason: "for data too large", noBody: true},
		{name: "other format", method: "GET", path: "/api2/extjs/version",
			status: 501, reason: "no formatter for uri /version, extjs", noBody: true},
		{name: "no such VM", method: "GET", path: "/api2/json/nodes/pve1/qemu/4242/config",
			status: 500, reason: "Configuration file 'nodes/pve1/qemu-server/4242.conf' does not exist", hasMessage: true},
		{name: "VM on another node", method: "GET", path: "/api2/json/nodes/pve2/qemu/9000/config",
			status: 500, reason: "hostname lookup 'pve2' failed - failed to get address info for: pve2: Name or service not known", hasMessage: true},
		{name: "skiplock is root's", method: "POST", path: "/api2/json/nodes/pve1/qemu/9000/status/start",
			ct: "application/json", body: `{"skiplock":1}`,
			status: 400, reason: "Parameter verification failed.", hasMessage: true,
			errors: map[string]string{"skiplock": "Only root may use this option."}},
		{name: "nextid taken", method: "GET", path: "/api2/json/cluster/nextid?vmid=9000",
			status: 400, reason: "Parameter verification failed.", hasMessage: true,
			errors: map[string]string{"vmid": "VM 9000 already exists"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.raw(t, tt.method, tt.path, tt.auth, tt.ct, tt.body)
			if r.Status != tt.status || r.Reason != tt.reason {
				t.Fatalf("got %d %q, want %d %q\n%s", r.Status, r.Reason, tt.status, tt.reason, r.Raw)
			}
			if !strings.Contains(r.Raw, "Server: pve-api-daemon/3.0\r\n") {
				t.Errorf("no Server header:\n%s", r.Raw)
			}
			if tt.noBody {
				if r.Body != nil {
					t.Errorf("body %v, want none", r.Body)
				}
				return
			}
			if d, ok := r.Body["data"]; !ok || d != nil {
				t.Errorf("data = %v, want null", d)
			}
			if tt.hasMessage && !strings.HasPrefix(r.Body["message"].(string), tt.reason) {
				t.Errorf("message %q", r.Body["message"])
			}
			if tt.errors != nil {
				got := map[string]string{}
				for k, v := range r.Body["errors"].(map[string]any) {
					got[k] = v.(string)
				}
				if !reflect.DeepEqual(got, tt.errors) {
					t.Errorf("errors %q, want %q", got, tt.errors)
				}
			} else if _, ok := r.Body["errors"]; ok {
				t.Errorf("unexpected errors %v", r.Body["errors"])
			}
		})
	}
}

// TestHTTPSuccessShapes: the envelope, nextid as a string, form and JSON
// bodies, repeated form keys as an array.
func TestHTTPSuccessShapes(t *testing.T) {
	s := newSim(t, Options{})
	r := s.raw(t, "GET", "/api2/json/cluster/nextid", "", "", "")
	if r.Status != 200 || r.Body["data"] != "100" {
		t.Fatalf("nextid: %d %v (want the string \"100\")", r.Status, r.Body)
	}
	if !strings.Contains(r.Raw, "Content-Type: application/json;charset=UTF-8\r\n") {
		t.Errorf("content type:\n%s", r.Raw)
	}
	r = s.raw(t, "POST", "/api2/json/nodes/pve1/qemu/9000/clone", "", "application/x-www-form-urlencoded", "newid=123&name=form-clone&full=1")
	upid, _ := r.Body["data"].(string)
	if r.Status != 200 || !strings.HasPrefix(upid, "UPID:pve1:") || !strings.Contains(upid, ":qmclone:9000:"+testTokenID+":") {
		t.Fatalf("clone: %d %v", r.Status, r.Body)
	}
	// The task is visible at once, running, without exitstatus.
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/tasks/"+url.PathEscape(upid)+"/status", "", "", "")
	st := r.Body["data"].(map[string]any)
	if st["status"] != "running" || st["exitstatus"] != nil || st["endtime"] != nil {
		t.Errorf("running task: %v", st)
	}
	if st["user"] != "root@pam" || st["tokenid"] != "delegate" || st["id"] != "9000" || st["type"] != "qmclone" {
		t.Errorf("task identity: %v", st)
	}
	waitTask(t, s, upid)
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/tasks/"+url.PathEscape(upid)+"/log?start=0&limit=50", "", "", "")
	if r.Body["total"] == nil || len(r.Body["data"].([]any)) == 0 {
		t.Errorf("log: %v", r.Body)
	}
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/tasks/"+url.PathEscape(upid)+"/status", "", "", "")
	if st := r.Body["data"].(map[string]any); st["status"] != "stopped" || st["exitstatus"] != "OK" {
		t.Errorf("stopped task: %v", st)
	}
	// UPIDs work raw in the path too (PVE decodes the path).
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/tasks/"+upid+"/status", "", "", "")
	if r.Status != 200 {
		t.Errorf("raw UPID: %d %s", r.Status, r.Reason)
	}
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/tasks/UPID:pve1:00000001:00000001:00000001:qmstart:1:x@pam:/status", "", "", "")
	if r.Status != 400 || r.Body["errors"].(map[string]any)["upid"] != "no such task" {
		t.Errorf("unknown task: %d %v", r.Status, r.Body)
	}
	r = s.raw(t, "GET", "/api2/json/nodes/pve1/qemu/123/config", "", "", "")
	conf := r.Body["data"].(map[string]any)
	// Integers as numbers, memory (a property string) as a string.
	if conf["cores"] != float64(2) || conf["memory"] != "2048" || conf["name"] != "form-clone" || len(conf["digest"].(string)) != 40 {
		t.Errorf("config: %v", conf)
	}
	if _, ok := conf["template"]; ok {
		t.Errorf("a clone is no template: %v", conf)
	}
}

func waitTask(t *testing.T, s *sim, upid string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.c.TaskStatus(ctxT(t), "", upid)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Running() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("task %s did not end", upid)
}

// TestAuthFailureDelay: a 401 waits, like pveproxy's 3 s.
func TestAuthFailureDelay(t *testing.T) {
	s := newSim(t, Options{AuthFailureDelay: 300 * time.Millisecond})
	start := time.Now()
	r := s.raw(t, "GET", "/api2/json/version", "-", "", "")
	if r.Status != 401 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("401 after %v (status %d)", time.Since(start), r.Status)
	}
	bad := newClient(t, s.Server, "root@pam", "delegate", "wrong")
	if _, err := bad.Version(ctxT(t)); !pve.IsUnauthorized(err) {
		t.Errorf("client: %v", err)
	}
}

// TestFormExec: a form with repeated "command" keys runs argv.
func TestFormExec(t *testing.T) {
	s := newSim(t, Options{})
	id := cloneAndBoot(t, s, 130, nil)
	body := "command=%2Fbin%2Fsh&command=-c&command=printf+%27%25s%27+%22%241%22&command=x&command=a+b"
	r := s.raw(t, "POST", "/api2/json/nodes/pve1/qemu/130/agent/exec", "", "application/x-www-form-urlencoded", body)
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Reason)
	}
	pid := int(r.Body["data"].(map[string]any)["pid"].(float64))
	st := waitExec(t, s, id, pid)
	if string(st.Stdout) != "a b" {
		t.Errorf("stdout %q", st.Stdout)
	}
}
