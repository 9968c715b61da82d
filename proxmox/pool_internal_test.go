package proxmox

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

func TestPoolListings(t *testing.T) {
	t.Parallel()
	const inst = "abcd1234"
	tests := []struct {
		name      string
		r         pve.Resource
		pool      bool
		sweepable string // listedJob
	}{
		{"ready", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-pool-1f2e", Tags: "delegate;delegate-abcd1234;delegate-pool;delegate-ready"}, true, ""},
		{"no name yet", pve.Resource{Type: "qemu", Tags: "delegate;delegate-abcd1234;delegate-pool"}, true, ""},
		{"not configured yet: the template's tags", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-pool-1f2e", Tags: "delegate;template"}, true, ""},
		// Claimed: the listing's name lags, the tags do not.
		{"taken by a job", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-pool-1f2e", Tags: "delegate;delegate-abcd1234;job-x1"}, false, ""},
		{"taken, listed by its new name", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-job-x1", Tags: "delegate;delegate-abcd1234;job-x1"}, false, "job-x1"},
		{"another instance's", pve.Resource{Type: "qemu", Name: "delegate-ffff0000-pool-1f2e", Tags: "delegate;delegate-ffff0000;delegate-pool"}, false, ""},
		{"a template", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-pool-1f2e", Template: true}, false, ""},
	}
	for _, tc := range tests {
		if got := isPoolListing(tc.r, inst); got != tc.pool {
			t.Errorf("%s: isPoolListing = %v", tc.name, got)
		}
		if got := listedJob(tc.r, inst); got != tc.sweepable {
			t.Errorf("%s: listedJob = %q, want %q", tc.name, got, tc.sweepable)
		}
	}
}

func TestPoolOwner(t *testing.T) {
	t.Parallel()
	o := owner{"abcd1234", "pool-1f2e"}
	if tags := o.tags(); !o.pool() || o.vmName() != "delegate-abcd1234-pool-1f2e" || strings.Join(tags[:3], ";") != "delegate;delegate-abcd1234;delegate-pool" || !stampedNow(tags[3]) {
		t.Fatalf("%v %q %v", o.pool(), o.vmName(), o.tags())
	}
	job := owner{"abcd1234", "job-x1"}
	if tags := job.tags(); job.pool() || strings.Join(tags[:3], ";") != "delegate;delegate-abcd1234;job-x1" || !stampedNow(tags[3]) {
		t.Fatalf("%v", job.tags())
	}
	// A pool VM is no job's, nor a legacy id's.
	cfg := pve.VMConfig{Name: o.vmName()}
	if job.owns(cfg) || (owner{"abcd1234", ""}).owns(cfg) || !o.owns(cfg) {
		t.Fatal("ownership of a pool VM")
	}
}

func TestShapes(t *testing.T) {
	t.Parallel()
	if s := shapeOf(1, 256<<20); s != (shape{cores: 1, memMiB: 256}) {
		t.Errorf("%+v", s)
	}
	if s := shapeOf(1.5, 1<<30+1); s != (shape{cores: 2, cpulimit: 1.5, memMiB: 1025}) {
		t.Errorf("%+v", s)
	}
	conf := func(kv map[string]any) pve.VMConfig {
		raw := map[string]json.RawMessage{}
		for k, v := range kv {
			b, _ := json.Marshal(v)
			raw[k] = b
		}
		b, _ := json.Marshal(kv)
		var c pve.VMConfig
		json.Unmarshal(b, &c)
		c.Raw = raw
		return c
	}
	tests := []struct {
		cfg  map[string]any
		want shape
		ok   bool
	}{
		{map[string]any{"cores": 2, "memory": "1025", "cpulimit": "1.50", "balloon": 0, "sockets": 1}, shape{2, 1.5, 1025}, true},
		{map[string]any{"cores": 2, "memory": "1025", "cpulimit": 1.5, "balloon": "0"}, shape{2, 1.5, 1025}, true},
		{map[string]any{"cores": 1, "memory": "256", "balloon": 0}, shape{1, 0, 256}, true},
		{map[string]any{"cores": 1, "memory": "256", "balloon": 128}, shape{1, 0, 256}, false}, // ballooning
		{map[string]any{"cores": 1, "memory": "256", "balloon": 0, "sockets": 2}, shape{1, 0, 256}, false},
	}
	for i, tc := range tests {
		if got, ok := shapeOfConfig(conf(tc.cfg)); got != tc.want || ok != tc.ok {
			t.Errorf("%d: %+v %v, want %+v %v", i, got, ok, tc.want, tc.ok)
		}
	}
	p := &pool{template: "debian", shape: shapeOf(1, 512<<20)}
	fit := sandbox.Spec{CPU: 1, MemoryBytes: 512 << 20}
	for _, tc := range []struct {
		spec sandbox.Spec
		want bool
	}{
		{fit, true},
		{sandbox.Spec{CPU: 1, MemoryBytes: 512 << 20, Template: "debian"}, true},
		{sandbox.Spec{CPU: 1, MemoryBytes: 512 << 20, Template: "alpine"}, false},
		{sandbox.Spec{CPU: 1, MemoryBytes: 512 << 20, Network: true}, false},
		{sandbox.Spec{CPU: 0.5, MemoryBytes: 512 << 20}, false},
		{sandbox.Spec{CPU: 1, MemoryBytes: 256 << 20}, false},
	} {
		if got := p.fits(tc.spec); got != tc.want {
			t.Errorf("fits(%+v) = %v", tc.spec, got)
		}
	}
	if m := poolDescRe().FindStringSubmatch(poolDescription(9000, "ab12")); m == nil || m[1] != "9000" || m[2] != "ab12" {
		t.Errorf("description %q", poolDescription(9000, "ab12"))
	}
}

// stampedNow: a tag is a seen stamp (gc.go) of the last minute.
func stampedNow(tag string) bool {
	seen, ok := lastSeen([]string{tag})
	return ok && time.Since(seen) < time.Minute
}
