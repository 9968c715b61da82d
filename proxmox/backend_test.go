package proxmox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/pve"
)

func TestHelpers(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"8G": 8 << 30, "512M": 512 << 20, "1.5T": 3 << 39, "100K": 100 << 10, "junk": 0} {
		if got := parseSize(in); got != want {
			t.Errorf("parseSize(%q) = %d, want %d", in, got, want)
		}
	}
	for in, want := range map[string]string{"job-abc123": "job-abc123", "Job_X!y": "job_xy"} {
		if got := tagOf(in); got != want {
			t.Errorf("tagOf(%q) = %q", in, got)
		}
	}
	raw := map[string]json.RawMessage{
		"ide2":  json.RawMessage(`"local:iso/x.iso,media=cdrom"`),
		"scsi0": json.RawMessage(`"local-lvm:base-9000-disk-0,size=8G"`),
		"net0":  json.RawMessage(`"virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0"`),
		"net2":  json.RawMessage(`"virtio,bridge=vmbr1"`),
		"netx":  json.RawMessage(`"1"`),
	}
	cfg := pve.VMConfig{Raw: raw}
	if disk, size := bootDisk(cfg); disk != "scsi0" || size != 8<<30 {
		t.Errorf("bootDisk = %s %d", disk, size)
	}
	if nets := netKeys(cfg); strings.Join(nets, ",") != "net0,net2" {
		t.Errorf("netKeys = %v", nets)
	}
}

func TestSandboxIDs(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"vm-99", "vm-x", "100", "", "vm-100-x", "vm-100-", "vm--job-1", "vm-100-pool-1"} {
		if _, _, err := parseID(id); err == nil {
			t.Errorf("parseID(%q) accepted", id)
		}
	}
	for _, tc := range []struct {
		vmid int
		job  string
	}{{123, "job-abc"}, {100, ""}, {999999999, "job-x-y"}, {105, "sbx-abc"}} {
		if n, job, err := parseID(sandboxID(tc.vmid, tc.job)); err != nil || n != tc.vmid || job != tc.job {
			t.Errorf("round trip of %d %q: %d %q %v", tc.vmid, tc.job, n, job, err)
		}
	}
}

func TestFindTemplates(t *testing.T) {
	t.Parallel()
	res := []pve.Resource{
		{Type: "qemu", VMID: 9000, Name: "deb", Node: "pve1", Template: true},
		{Type: "qemu", VMID: 9001, Name: "deb", Node: "pve2", Template: true},
		{Type: "qemu", VMID: 100, Name: "deb", Node: "pve1"}, // not a template
		{Type: "lxc", VMID: 200, Name: "deb", Node: "pve1", Template: true},
	}
	if got, err := findTemplates(res, "deb"); err != nil || len(got) != 2 {
		t.Fatalf("by name: %v %v", got, err)
	}
	if got, err := findTemplates(res, "9001"); err != nil || len(got) != 1 || got[0].Node != "pve2" {
		t.Fatalf("by vmid: %v %v", got, err)
	}
	if _, err := findTemplates(res, "100"); err == nil || !strings.Contains(err.Error(), "deb (9000)") {
		t.Fatalf("a VM that is no template: %v", err)
	}
}
