package proxmox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// fakeCluster answers the few calls a clone makes, the way Proxmox does,
// and records what it was asked.
type fakeCluster struct {
	mu       sync.Mutex
	nextIDs  []int          // what /cluster/nextid answers, in turn
	taskFail map[int]string // newid -> the clone task's exit status
	names    map[int]string // vmid -> name, for config reads
	linked   bool           // linked clones are refused
	calls    []string
}

func (f *fakeCluster) handler(w http.ResponseWriter, r *http.Request) {
	r.ParseForm()
	var body map[string]any
	json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	defer f.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, "/api2/json")
	f.calls = append(f.calls, r.Method+" "+path+" "+fmt.Sprint(body["newid"], body["full"]))
	reply := func(data any) { json.NewEncoder(w).Encode(map[string]any{"data": data}) }
	switch {
	case path == "/cluster/nextid":
		id := f.nextIDs[0]
		if len(f.nextIDs) > 1 {
			f.nextIDs = f.nextIDs[1:]
		}
		reply(strconv.Itoa(id))
	case strings.HasSuffix(path, "/clone"):
		newid := int(body["newid"].(float64))
		if f.linked && body["full"] == float64(0) {
			failWith(w, 500, "Linked clone feature is not supported for 'local:base-9000-disk-0' (scsi0)")
			return
		}
		reply(fmt.Sprintf("UPID:pve1:00001000:00000001:6B000000:qmclone:%d:root@pam!t:", newid))
	case strings.Contains(path, "/tasks/") && strings.HasSuffix(path, "/status"):
		upid := strings.TrimSuffix(strings.TrimPrefix(path, "/nodes/pve1/tasks/"), "/status")
		newid, _ := strconv.Atoi(strings.Split(upid, ":")[6])
		exit := "OK"
		if msg, ok := f.taskFail[newid]; ok {
			exit = msg
		}
		reply(map[string]any{"upid": upid, "status": "stopped", "exitstatus": exit, "type": "qmclone", "id": "9000"})
	case strings.Contains(path, "/tasks/") && strings.HasSuffix(path, "/log"):
		reply([]map[string]any{{"n": 1, "t": "TASK ERROR"}})
	case strings.HasPrefix(path, "/nodes/pve1/qemu/") && strings.HasSuffix(path, "/config"):
		vmid, _ := strconv.Atoi(strings.Split(path, "/")[4])
		name, ok := f.names[vmid]
		if !ok {
			failWith(w, 500, fmt.Sprintf("Configuration file 'nodes/pve1/qemu-server/%d.conf' does not exist", vmid))
			return
		}
		reply(map[string]any{"name": name, "digest": "x"})
	default:
		failWith(w, 501, "Method '"+r.Method+" "+path+"' not implemented")
	}
}

// failWith answers an error as Proxmox does: the message in the reason
// phrase (net/http cannot set one, hence the hijack).
func failWith(w http.ResponseWriter, code int, reason string) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	body := `{"data":null}`
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", code, reason, len(body), body)
	buf.Flush()
}

func (f *fakeCluster) backend(t *testing.T) *Backend {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(f.handler))
	t.Cleanup(srv.Close)
	c := pinnedClient(t, srv, pve.Config{RetryDelay: time.Millisecond})
	b, err := New(c, Config{Instance: "abcd1234", PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fakeCluster) called(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

// TestCloneCollision: nextid hands out a vmid another server's clone
// takes first; the clone task fails, the VM with that id (not ours) is
// left alone, and the clone is retried with another id.
func TestCloneCollision(t *testing.T) {
	t.Parallel()
	f := &fakeCluster{nextIDs: []int{100, 101},
		taskFail: map[int]string{100: "unable to create VM 100: config file already exists"},
		names:    map[int]string{100: "delegate-ffff0000-job-other", 101: "delegate-abcd1234-job-mine"}}
	b := f.backend(t)
	h := b.placer.reserve("pve1", pve.Resource{VMID: 9000, Node: "pve1", Name: "tpl"}, &templateInfo{}, false, 512, 1)
	vmid, err := b.cloner.clone(context.Background(), h, owner{"abcd1234", "job-mine"})
	if err != nil || vmid != 101 {
		t.Fatalf("clone: %d %v", vmid, err)
	}
	if got := f.called("POST /nodes/pve1/qemu/9000/clone"); len(got) != 2 {
		t.Errorf("clones %v", got)
	}
	if got := f.called("GET /nodes/pve1/qemu/100/config"); len(got) != 1 {
		t.Errorf("the owner of VM 100 was not checked: %v", f.calls)
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "DELETE") || strings.Contains(c, "/status/stop") {
			t.Errorf("touched a VM that is not ours: %s", c)
		}
	}
}

// TestCloneLockTimeout: a time-out on the new VM's lock is a collision
// too; once the attempts are spent the error says what happened.
func TestCloneLockTimeout(t *testing.T) {
	t.Parallel()
	msg := "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout"
	f := &fakeCluster{nextIDs: []int{100}, taskFail: map[int]string{100: msg}, names: map[int]string{}}
	b := f.backend(t)
	h := b.placer.reserve("pve1", pve.Resource{VMID: 9000, Node: "pve1", Name: "tpl"}, &templateInfo{}, false, 512, 1)
	_, err := b.cloner.clone(context.Background(), h, owner{"abcd1234", "job-mine"})
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("err = %v", err)
	}
	if got := f.called("POST /nodes/pve1/qemu/9000/clone"); len(got) != maxCloneAttempts {
		t.Errorf("%d clones, want %d", len(got), maxCloneAttempts)
	}
}

// TestCloneLinkedFallback: where the storage cannot link, the clone is
// made full, and later clones of that template go full at once.
func TestCloneLinkedFallback(t *testing.T) {
	t.Parallel()
	f := &fakeCluster{nextIDs: []int{100}, linked: true, names: map[int]string{}}
	b := f.backend(t)
	info := &templateInfo{}
	h := b.placer.reserve("pve1", pve.Resource{VMID: 9000, Node: "pve1", Name: "tpl"}, info, false, 512, 1)
	if _, err := b.cloner.clone(context.Background(), h, owner{"abcd1234", "job-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cloner.clone(context.Background(), h, owner{"abcd1234", "job-b"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"POST /nodes/pve1/qemu/9000/clone 100 0", "POST /nodes/pve1/qemu/9000/clone 100 1", "POST /nodes/pve1/qemu/9000/clone 100 1"}
	if got := f.called("POST"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("clones %q, want %q", got, want)
	}
	if !b.tpls.isFull(info) {
		t.Error("the template is not remembered as full-clone only")
	}
}
