package pve

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
)

func TestRequestClass(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/nodes/pve1/qemu/123/clone", "POST /nodes/{node}/qemu/{vmid}/clone"},
		{"GET", "/nodes/pve-2/qemu/9001/agent/exec-status", "GET /nodes/{node}/qemu/{vmid}/agent/exec-status"},
		{"GET", "/nodes/pve1/tasks/UPID:pve1:0001:0002:0003:qmclone:123:root@pam:/status", "GET /nodes/{node}/tasks/{upid}/status"},
		{"GET", "/nodes/pve1/tasks/UPID%3Apve1%3A0001/log", "GET /nodes/{node}/tasks/{upid}/log"},
		{"DELETE", "/nodes/pve1/qemu/123", "DELETE /nodes/{node}/qemu/{vmid}"},
		{"GET", "/cluster/nextid", "GET /cluster/nextid"},
		{"GET", "/cluster/nextid?vmid=5", "GET /cluster/nextid"},
		{"GET", "/nodes", "GET /nodes"},
		{"GET", "/version", "GET /version"},
		// Snapshot and volume names are no labels: any name makes one.
		{"DELETE", "/nodes/pve1/qemu/123/snapshot/before-upgrade-2026", "DELETE /nodes/{node}/qemu/{vmid}/snapshot/{snapname}"},
		{"POST", "/nodes/pve1/qemu/123/snapshot/s1/rollback", "POST /nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback"},
		{"POST", "/nodes/pve1/qemu/123/snapshot", "POST /nodes/{node}/qemu/{vmid}/snapshot"},
		{"DELETE", "/nodes/pve1/storage/local/content/local:iso%2Fx.iso", "DELETE /nodes/{node}/storage/{storage}/content/{volume}"},
		// A node called "qemu" is still a node.
		{"GET", "/nodes/qemu/qemu/7/status/current", "GET /nodes/{node}/qemu/{vmid}/status/current"},
	} {
		if got := RequestClass(tc.method, tc.path); got != tc.want {
			t.Errorf("RequestClass(%s %s) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

func TestObserveHearsEveryAttempt(t *testing.T) {
	var calls int
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch r.URL.Path {
		case "/api2/json/version":
			if calls == 1 {
				fail(w, 503, "busy", nil) // retried
				return
			}
			reply(w, map[string]any{"version": "8.4.1", "release": "8.4", "repoid": "x"})
		default:
			fail(w, 403, "Permission check failed", nil)
		}
	})
	var (
		mu   sync.Mutex
		seen []string
	)
	c := f.client(t)
	c.Observe(func(class string, code int) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %d", class, code))
	})
	ctx := context.Background()
	if _, err := c.Version(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VMStatus(ctx, "pve1", 101); err == nil {
		t.Fatal("VMStatus: want the 403")
	}
	f.Close() // now no answer comes at all
	c.cfg.RetryAttempts = 0
	c.NextID(ctx)
	want := []string{"GET /version 503", "GET /version 200", "GET /nodes/{node}/qemu/{vmid}/status/current 403", "GET /cluster/nextid 0"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("observed\n%q\nwant\n%q", seen, want)
	}
}
