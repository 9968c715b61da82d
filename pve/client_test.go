package pve

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	testUser   = "delegate@pve"
	testToken  = "ci"
	testSecret = "8d3f1c2e-1111-4222-8333-444455556666"
)

// fakePVE is an httptest TLS server whose handler answers like Proxmox.
type fakePVE struct {
	*httptest.Server
	calls atomic.Int32
}

func newFake(t *testing.T, h http.HandlerFunc) *fakePVE {
	t.Helper()
	f := &fakePVE{}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// client returns a client pinned to the fake's certificate.
func (f *fakePVE) client(t *testing.T, tune ...func(*Config)) *Client {
	t.Helper()
	host, port, _ := net.SplitHostPort(f.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	sum := sha256.Sum256(f.Certificate().Raw)
	cfg := Config{Host: host, Port: p, User: testUser, TokenName: testToken, TokenValue: testSecret,
		SSLMode: SSLVerify, Fingerprint: formatFingerprint(sum[:]),
		RetryDelay: time.Millisecond, TaskPollInterval: time.Millisecond, RateLimit: -1}
	for _, fn := range tune {
		fn(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// reply answers data in the envelope.
func reply(w http.ResponseWriter, data any, extra ...any) {
	env := map[string]any{"data": data}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i].(string)] = extra[i+1]
	}
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	json.NewEncoder(w).Encode(env)
}

// fail answers an error the Proxmox way: the message in the reason
// phrase (which net/http cannot set, hence the hijack), and a body.
func fail(w http.ResponseWriter, code int, reason string, errs map[string]string) {
	body, _ := json.Marshal(map[string]any{"data": nil, "errors": errs, "message": reason + "\n"})
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, reason, len(body), body)
	buf.Flush()
}

func TestAuthHeaderAndEncoding(t *testing.T) {
	var got struct {
		auth, method, path, query, ct string
		body                          map[string]any
	}
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		got.auth, got.method, got.path, got.query, got.ct = r.Header.Get("Authorization"), r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type")
		got.body = nil
		json.NewDecoder(r.Body).Decode(&got.body)
		reply(w, "UPID:pve1:00001234:0001E240:65000000:qmclone:9000:delegate@pve!ci:")
	})
	c := f.client(t)
	ctx := context.Background()
	full := false
	upid, err := c.CloneVM(ctx, "pve1", 9000, CloneOptions{NewID: 101, Name: "job-1", Full: &full})
	if err != nil {
		t.Fatal(err)
	}
	if want := "PVEAPIToken=delegate@pve!ci=" + testSecret; got.auth != want {
		t.Errorf("Authorization %q, want %q", got.auth, want)
	}
	if got.method != "POST" || got.path != "/api2/json/nodes/pve1/qemu/9000/clone" || got.ct != "application/json" {
		t.Errorf("request %+v", got)
	}
	// Booleans as 0/1, numbers as numbers, nothing unset sent.
	if want := map[string]any{"newid": float64(101), "name": "job-1", "full": float64(0)}; !reflect.DeepEqual(got.body, want) {
		t.Errorf("body %v, want %v", got.body, want)
	}
	if u, err := ParseUPID(upid); err != nil || u.Type != "qmclone" {
		t.Errorf("upid %q %v", upid, err)
	}
	c.ClusterResources(ctx, ResourceVM)
	if got.method != "GET" || got.query != "type=vm" || got.body != nil {
		t.Errorf("GET %+v", got)
	}
	c.DeleteVM(ctx, "pve1", 101, DeleteOptions{Purge: true})
	if got.method != "DELETE" || got.query != "purge=1" {
		t.Errorf("DELETE %+v", got)
	}
	c.AgentExec(ctx, "pve1", 101, []string{"/bin/sh", "-c", ""}, []byte{0, 'a', 0xff})
	if cmd := got.body["command"]; !reflect.DeepEqual(cmd, []any{"/bin/sh", "-c", ""}) || got.body["input-data"] != "\x00a\u00ff" {
		t.Errorf("exec body %q", got.body)
	}
	c.AgentFileWrite(ctx, "pve1", 101, "/tmp/x", []byte{0xff, 0})
	if got.body["encode"] != float64(0) || got.body["content"] != "/wA=" {
		t.Errorf("file-write body %v", got.body)
	}
}

func TestEnvelopeDecoding(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api2/json/cluster/nextid":
			reply(w, "105") // a string, whatever the schema says
		case "/api2/json/nodes/pve1/qemu/101/config":
			reply(w, map[string]any{"cores": 2, "memory": "2048", "sockets": "1", "template": 1, "agent": "1",
				"tags": "delegate;job-1", "name": "job-1", "digest": "abc", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"})
		case "/api2/json/nodes/pve1/qemu/101/agent/exec-status":
			reply(w, map[string]any{"exited": 1, "exitcode": 0, "out-data": "caf\u00c3\u00a9\n", "out-truncated": 0})
		case "/api2/json/nodes/pve1/qemu/101/agent/file-read":
			reply(w, map[string]any{"content": "\u0000\u00ff", "bytes-read": 2, "truncated": 1})
		case "/api2/json/cluster/resources":
			reply(w, []any{map[string]any{"id": "qemu/101", "type": "qemu", "vmid": 101, "template": true, "tags": "a;b", "maxcpu": 2, "status": "running"}})
		case "/api2/json/nodes/pve1/tasks/U/log":
			reply(w, []any{map[string]any{"n": 1, "t": "TASK OK"}}, "total", 1)
		}
	})
	c := f.client(t)
	ctx := context.Background()
	if id, err := c.NextID(ctx); err != nil || id != 105 {
		t.Errorf("nextid %d %v", id, err)
	}
	conf, err := c.VMConfig(ctx, "pve1", 101)
	if err != nil || conf.Cores != 2 || conf.Sockets != 1 || conf.MemoryMiB() != 2048 || !bool(conf.Template) ||
		!reflect.DeepEqual(conf.TagList(), []string{"delegate", "job-1"}) || conf.Option("net0") == "" || conf.Option("cores") != "2" {
		t.Errorf("config %+v %v", conf, err)
	}
	st, err := c.AgentExecStatus(ctx, "pve1", 101, 7)
	if err != nil || !st.Exited || *st.ExitCode != 0 || st.Signal != nil || string(st.Stdout) != "café\n" {
		t.Errorf("exec status %+v %q %v", st, st.Stdout, err)
	}
	fc, err := c.AgentFileRead(ctx, "pve1", 101, "/x")
	if err != nil || !reflect.DeepEqual(fc.Data, []byte{0, 0xff}) || !fc.Truncated {
		t.Errorf("file %+v %v", fc, err)
	}
	res, err := c.ClusterResources(ctx, "")
	if err != nil || len(res) != 1 || res[0].VMID != 101 || !bool(res[0].Template) || res[0].MaxCPU != 2 {
		t.Errorf("resources %+v %v", res, err)
	}
	lines, total, err := c.TaskLog(ctx, "pve1", "U", 0, 50)
	if err != nil || total != 1 || lines[0].T != "TASK OK" {
		t.Errorf("log %v %d %v", lines, total, err)
	}
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name   string
		code   int
		reason string
		errs   map[string]string
		is     []func(error) bool
		isNot  []func(error) bool
		check  func(t *testing.T, err error)
	}{
		{name: "not found", code: 500, reason: "Configuration file 'nodes/pve1/qemu-server/117.conf' does not exist",
			is: []func(error) bool{IsNotFound}, isNot: []func(error) bool{IsLocked, IsParamError}},
		{name: "locked", code: 500, reason: "VM is locked (clone)", is: []func(error) bool{IsLocked},
			check: func(t *testing.T, err error) {
				if LockReason(err) != "clone" {
					t.Errorf("lock reason %q", LockReason(err))
				}
			}},
		{name: "agent not running", code: 500, reason: "QEMU guest agent is not running", is: []func(error) bool{IsAgentNotRunning},
			isNot: []func(error) bool{IsVMNotRunning, IsNotFound}},
		{name: "agent not configured", code: 500, reason: "No QEMU guest agent configured", is: []func(error) bool{IsAgentNotConfigured}},
		{name: "VM not running", code: 500, reason: "VM 100 is not running", is: []func(error) bool{IsVMNotRunning},
			isNot: []func(error) bool{IsAgentNotRunning}},
		{name: "agent error", code: 500, reason: "Agent error: failed to open file '/x' (mode: 'r'): No such file or directory",
			is: []func(error) bool{IsAgentError}},
		{name: "exists", code: 500, reason: "unable to create VM 101: config file already exists", is: []func(error) bool{IsAlreadyExists}},
		{name: "parameters", code: 400, reason: "Parameter verification failed.",
			errs: map[string]string{"newid": "invalid format - value does not look like a valid VM ID\n", "full": "type check ('boolean') failed - got 'true'"},
			is:   []func(error) bool{IsParamError},
			check: func(t *testing.T, err error) {
				var api *APIError
				errors.As(err, &api)
				if api.Errors["full"] != "type check ('boolean') failed - got 'true'" || api.Message != "Parameter verification failed.\n" {
					t.Errorf("%+v", api)
				}
				want := "proxmox: POST /nodes/pve1/qemu/9000/clone: 400 Parameter verification failed.: full: type check ('boolean') failed - got 'true', newid: invalid format - value does not look like a valid VM ID"
				if err.Error() != want {
					t.Errorf("message\n got %s\nwant %s", err, want)
				}
			}},
		{name: "vmid taken", code: 400, reason: "Parameter verification failed.", errs: map[string]string{"vmid": "VM 101 already exists"},
			is: []func(error) bool{IsParamError, IsAlreadyExists}},
		{name: "forbidden", code: 403, reason: "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)", is: []func(error) bool{IsForbidden},
			check: func(t *testing.T, err error) {
				if path, priv := MissingPrivilege(err); path != "/storage/local-lvm" || priv != "Datastore.AllocateSpace" {
					t.Errorf("missing privilege %q on %q", priv, path)
				}
			}},
		{name: "linked clone", code: 500, reason: "Linked clone feature is not supported for 'local:9000/base-9000-disk-0.raw' (scsi0)",
			is: []func(error) bool{IsLinkedCloneUnsupported}, isNot: []func(error) bool{IsAlreadyExists, IsLocked}},
		{name: "lock timeout", code: 500, reason: "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout",
			isNot: []func(error) bool{IsLocked, IsAlreadyExists},
			check: func(t *testing.T, err error) {
				if LockTimeout(err) != VMLockFile(101) {
					t.Errorf("lock file %q", LockTimeout(err))
				}
			}},
		{name: "unauthorized", code: 401, reason: "No ticket", is: []func(error) bool{IsUnauthorized}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fail(w, tt.code, tt.reason, tt.errs) })
			_, err := f.client(t).CloneVM(context.Background(), "pve1", 9000, CloneOptions{NewID: 101})
			var api *APIError
			if !errors.As(err, &api) || api.StatusCode != tt.code || api.Reason != tt.reason {
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(api.Errors, tt.errs) {
				t.Errorf("errors %v", api.Errors)
			}
			for i, is := range tt.is {
				if !is(err) {
					t.Errorf("helper %d says no", i)
				}
			}
			for i, is := range tt.isNot {
				if is(err) {
					t.Errorf("negative helper %d says yes", i)
				}
			}
			if tt.check != nil {
				tt.check(t, err)
			}
		})
	}
	// Task errors answer the same helpers.
	te := &TaskError{ExitStatus: "VM is locked (clone)"}
	if !IsLocked(te) || LockReason(fmt.Errorf("wrapped: %w", te)) != "clone" {
		t.Error("TaskError not seen as locked")
	}
}

// TestRetry: GETs are retried on transient failures; POSTs only when the
// request never left; exec-status, a read the agent answers once, only
// when it cannot have reached the agent.
func TestRetry(t *testing.T) {
	tests := []struct {
		name      string
		post      bool
		exec      bool // exec-status
		fails     int  // answers before success
		code      int
		reason    string
		wantCalls int32
		wantErr   bool
	}{
		{name: "GET 503 twice", fails: 2, code: 503, reason: "Service Unavailable", wantCalls: 3},
		{name: "GET 595 node unreachable", fails: 1, code: 595, reason: "No route to host", wantCalls: 2},
		{name: "GET 500 transient", fails: 1, code: 500, reason: "got timeout", wantCalls: 2},
		{name: "GET 500 not found is final", fails: 1, code: 500, reason: "Configuration file 'nodes/pve1/qemu-server/1.conf' does not exist", wantCalls: 1, wantErr: true},
		{name: "GET 400 is final", fails: 1, code: 400, reason: "Parameter verification failed.", wantCalls: 1, wantErr: true},
		{name: "GET gives up", fails: 10, code: 503, reason: "Service Unavailable", wantCalls: 4, wantErr: true},
		{name: "POST 503 not retried", post: true, fails: 1, code: 503, reason: "Service Unavailable", wantCalls: 1, wantErr: true},
		{name: "POST 500 not retried", post: true, fails: 1, code: 500, reason: "got timeout", wantCalls: 1, wantErr: true},
		{name: "POST dropped after it was sent", post: true, fails: 1, code: -1, wantCalls: 1, wantErr: true},
		{name: "GET dropped connection", fails: 1, code: -1, wantCalls: 2},
		{name: "exec-status dropped after it was sent", exec: true, fails: 1, code: -1, wantCalls: 1, wantErr: true},
		{name: "exec-status 500 not retried", exec: true, fails: 1, code: 500, reason: "got timeout", wantCalls: 1, wantErr: true},
		{name: "exec-status 595 node unreachable", exec: true, fails: 1, code: 595, reason: "No route to host", wantCalls: 2},
		{name: "exec-status 503", exec: true, fails: 1, code: 503, reason: "Service Unavailable", wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int32
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				if int(n.Add(1)) <= tt.fails {
					if tt.code < 0 {
						conn, _, _ := w.(http.Hijacker).Hijack()
						conn.Close() // the request was read: it may have acted
						return
					}
					fail(w, tt.code, tt.reason, nil)
					return
				}
				if r.Method == "GET" {
					reply(w, map[string]any{"vmid": 100, "status": "running"})
					return
				}
				reply(w, "UPID:pve1:00001234:0001E240:65000000:qmstart:100:delegate@pve!ci:")
			})
			c := f.client(t)
			var err error
			switch {
			case tt.post:
				_, err = c.StartVM(context.Background(), "pve1", 100)
			case tt.exec:
				_, err = c.AgentExecStatus(context.Background(), "pve1", 100, 42)
			default:
				_, err = c.VMStatus(context.Background(), "pve1", 100)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("err = %v", err)
			}
			if got := f.calls.Load(); got != tt.wantCalls {
				t.Errorf("%d calls, want %d", got, tt.wantCalls)
			}
		})
	}
}

// TestRetryPostNotSent: a connection that fails before the request is
// written (here: during the TLS handshake) may be retried, POST or not.
func TestRetryPostNotSent(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { reply(w, "UPID:x") })
	// A proxy in front of the fake that drops the first two connections
	// before a byte is exchanged.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	var wg sync.WaitGroup
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) <= 2 {
				conn.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				up, err := net.Dial("tcp", f.Listener.Addr().String())
				if err != nil {
					conn.Close()
					return
				}
				go func() { io.Copy(up, conn); up.Close() }()
				io.Copy(conn, up)
				conn.Close()
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	p, _ := strconv.Atoi(port)
	c := f.client(t, func(c *Config) { c.Port = p })
	if _, err := c.StartVM(context.Background(), "pve1", 100); err != nil {
		t.Fatalf("POST after two refused connections: %v", err)
	}
	if f.calls.Load() != 1 || accepted.Load() != 3 {
		t.Errorf("calls %d, connections %d", f.calls.Load(), accepted.Load())
	}
	c.Close()
	ln.Close()
	wg.Wait()
}

func TestRateLimit(t *testing.T) {
	// The bucket itself, on a fake clock.
	now := time.Unix(0, 0)
	b := newTokenBucket(10, 2)
	b.now = func() time.Time { return now }
	for i, want := range []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond} {
		if got := b.reserve(); got != want {
			t.Errorf("reserve %d: %v, want %v", i, got, want)
		}
	}
	now = now.Add(time.Second) // refills, up to the burst
	if got := b.reserve(); got != 0 {
		t.Errorf("after a second: %v", got)
	}
	if newTokenBucket(-1, 5) != nil {
		t.Error("a negative rate limits")
	}
	// Through the client: 5 requests at 20/s with a burst of 1 take 200ms.
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { reply(w, map[string]any{"version": "9.1.1"}) })
	c := f.client(t, func(c *Config) { c.RateLimit, c.RateBurst = 20, 1 })
	start := time.Now()
	for range 5 {
		if _, err := c.Version(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("5 requests in %v", d)
	}
	// A waiting caller gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	c2 := f.client(t, func(c *Config) { c.RateLimit, c.RateBurst = 0.1, 1 })
	c2.Version(context.Background())
	if _, err := c2.Version(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("limited call: %v", err)
	}
}

func TestParseUPID(t *testing.T) {
	tests := []struct {
		in   string
		want UPID
		ok   bool
	}{
		{"UPID:proxmox2:000D7AA2:08D5A17C:63DF62A5:vzclone:200:root@pam!api_token:",
			UPID{Node: "proxmox2", PID: 0xD7AA2, PStart: 0x08D5A17C, StartTime: time.Unix(0x63DF62A5, 0), Type: "vzclone", ID: "200", User: "root@pam!api_token"}, true},
		// pstart may have 9 hex digits; the id may be empty.
		{"UPID:pve:00001234:1000ABCDE:65000000:aptupdate::root@pam:",
			UPID{Node: "pve", PID: 0x1234, PStart: 0x1000ABCDE, StartTime: time.Unix(0x65000000, 0), Type: "aptupdate", User: "root@pam"}, true},
		{"UPID:pve:00001234:0001E240:65000000:qmstart:100:root@pam", UPID{}, false}, // no trailing colon
		{"UPID:pve:1234:0001E240:65000000:qmstart:100:root@pam:", UPID{}, false},
		{"task-1", UPID{}, false},
	}
	for _, tt := range tests {
		got, err := ParseUPID(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v", tt.in, err)
			continue
		}
		if !tt.ok {
			continue
		}
		got.raw = ""
		if got != tt.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.in, got, tt.want)
		}
		if got.String() != tt.in {
			t.Errorf("String() = %s", got.String())
		}
	}
}

func TestWaitTask(t *testing.T) {
	const upid = "UPID:pve1:00001234:0001E240:65000000:qmstart:100:delegate@pve!ci:"
	newTaskFake := func(t *testing.T, polls int, exit string, logLines int) *fakePVE {
		var n atomic.Int32
		return newFake(t, func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/log") {
				start, _ := strconv.Atoi(r.URL.Query().Get("start"))
				limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
				var lines []any
				for i := start; i < logLines && i < start+limit; i++ {
					text := fmt.Sprintf("line %d", i+1)
					if i == logLines-1 {
						text = "TASK ERROR: " + exit
					}
					lines = append(lines, map[string]any{"n": i + 1, "t": text})
				}
				reply(w, lines, "total", logLines)
				return
			}
			if !strings.HasPrefix(r.URL.Path, "/api2/json/nodes/pve1/tasks/UPID:pve1:") {
				t.Errorf("status asked at %s", r.URL.Path)
			}
			st := map[string]any{"upid": upid, "type": "qmstart", "id": "100", "status": "running"}
			if int(n.Add(1)) > polls {
				st["status"], st["exitstatus"] = "stopped", exit
			}
			reply(w, st)
		})
	}
	ctx := context.Background()
	f := newTaskFake(t, 2, "OK", 1)
	if err := f.client(t).WaitTask(ctx, "", upid); err != nil || f.calls.Load() != 3 {
		t.Errorf("OK task: %v after %d calls", err, f.calls.Load())
	}
	f = newTaskFake(t, 0, "WARNINGS: 2", 1)
	if err := f.client(t).WaitTask(ctx, "pve1", upid); err != nil {
		t.Errorf("task with warnings: %v", err)
	}
	f = newTaskFake(t, 1, "start failed: QEMU exited with code 1", 30)
	err := f.client(t).WaitTask(ctx, "pve1", upid)
	var te *TaskError
	if !errors.As(err, &te) || te.ExitStatus != "start failed: QEMU exited with code 1" || te.Type != "qmstart" || te.ID != "100" {
		t.Fatalf("failed task: %v", err)
	}
	if len(te.Log) != logTail || te.Log[0] != "line 11" || te.Log[logTail-1] != "TASK ERROR: start failed: QEMU exited with code 1" {
		t.Errorf("log tail %q", te.Log)
	}
	f = newTaskFake(t, 1000000, "", 0)
	ctx2, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := f.client(t).WaitTask(ctx2, "pve1", upid); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("endless task: %v", err)
	}
	if err := f.client(t).WaitTask(ctx, "pve1", ""); err != nil {
		t.Errorf("no task: %v", err)
	}
	// WaitTaskEvery does not back off: 6 polls 20 ms apart end well
	// within a second, where WaitTask's would take 3.9 s.
	f = newTaskFake(t, 5, "OK", 1)
	ctx3, cancel3 := context.WithTimeout(ctx, time.Second)
	defer cancel3()
	if err := f.client(t).WaitTaskEvery(ctx3, "pve1", upid, 20*time.Millisecond); err != nil || f.calls.Load() != 6 {
		t.Errorf("WaitTaskEvery: %v after %d calls", err, f.calls.Load())
	}
}
