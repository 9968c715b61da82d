package proxmox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/delegate-dev/delegate/pve"
)

func TestListedJob(t *testing.T) {
	t.Parallel()
	const inst = "abcd1234"
	tests := []struct {
		name string
		r    pve.Resource
		want string
	}{
		{"named", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-job-x1"}, "job-x1"},
		{"named, tags of a template", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-job-x1", Tags: "delegate;template"}, "job-x1"},
		{"no name yet, our tags", pve.Resource{Type: "qemu", Tags: "delegate;delegate-abcd1234;job-x1"}, "job-x1"},
		{"a kept sandbox", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-sbx-k1"}, "sbx-k1"},
		{"a kept sandbox, no name yet", pve.Resource{Type: "qemu", Tags: "delegate;delegate-abcd1234;sbx-k1"}, "sbx-k1"},
		{"no name yet, a template's tags", pve.Resource{Type: "qemu", Tags: "delegate;template"}, ""},
		{"named otherwise, our tags copied", pve.Resource{Type: "qemu", Name: "my-vm", Tags: "delegate;delegate-abcd1234;job-x1"}, ""},
		{"another instance", pve.Resource{Type: "qemu", Name: "delegate-ffff0000-job-x1", Tags: "delegate;delegate-ffff0000;job-x1"}, ""},
		{"another instance, no name yet", pve.Resource{Type: "qemu", Tags: "delegate;delegate-ffff0000;job-x1"}, ""},
		{"a template", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-job-x1", Template: true}, ""},
		{"a container", pve.Resource{Type: "lxc", Name: "delegate-abcd1234-job-x1"}, ""},
		{"not a job", pve.Resource{Type: "qemu", Name: "delegate-abcd1234-pool"}, ""},
	}
	for _, tc := range tests {
		if got := listedJob(tc.r, inst); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestOwns(t *testing.T) {
	t.Parallel()
	cfg := func(name string, template bool) pve.VMConfig {
		return pve.VMConfig{Name: name, Template: pve.Bool(template)}
	}
	o := owner{"abcd1234", "job-x1"}
	if o.vmName() != "delegate-abcd1234-job-x1" {
		t.Fatalf("name %q", o.vmName())
	}
	tests := []struct {
		o    owner
		cfg  pve.VMConfig
		want bool
	}{
		{o, cfg("delegate-abcd1234-job-x1", false), true},
		{o, cfg("delegate-abcd1234-job-x2", false), false}, // the vmid now holds another job
		{o, cfg("delegate-ffff0000-job-x1", false), false},
		{o, cfg("delegate-abcd1234-job-x1", true), false},
		{o, cfg("", false), false},
		{owner{"abcd1234", ""}, cfg("delegate-abcd1234-job-x2", false), true}, // an id without its job
		{owner{"abcd1234", ""}, cfg("delegate-ffff0000-job-x2", false), false},
		{owner{"abcd1234", ""}, cfg("delegate-abcd1234-pool", false), false},
	}
	for _, tc := range tests {
		if got := tc.o.owns(tc.cfg); got != tc.want {
			t.Errorf("%+v owns %q (template %v): %v", tc.o, tc.cfg.Name, tc.cfg.Template, got)
		}
	}
	if tags := o.tags(); len(tags) != 4 || tags[1] != "delegate-abcd1234" || tags[2] != "job-x1" || !stampedNow(tags[3]) {
		t.Errorf("tags %v", tags)
	}
}

func TestStableInstanceID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Servers starting together on one data dir agree on one id.
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			id, err := StableInstanceID(dir)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || checkInstance(id) != nil {
			t.Fatalf("ids %v", ids)
		}
	}
	// A restart finds it again; another data dir gets its own.
	if again, err := StableInstanceID(dir); err != nil || again != ids[0] {
		t.Fatalf("again: %q %v", again, err)
	}
	if other, err := StableInstanceID(t.TempDir()); err != nil || other == ids[0] {
		t.Fatalf("another dir: %q %v", other, err)
	}
	if err := os.WriteFile(filepath.Join(dir, instanceFile), []byte("Not Valid!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := StableInstanceID(dir); err == nil {
		t.Fatal("a damaged instance file was accepted")
	}
}

func TestDiskStorages(t *testing.T) {
	t.Parallel()
	raw := map[string]json.RawMessage{
		"scsi0":    json.RawMessage(`"ceph:base-9000-disk-0,size=8G"`),
		"scsi1":    json.RawMessage(`"local-lvm:base-9000-disk-1,size=1G"`),
		"ide2":     json.RawMessage(`"local:iso/x.iso,media=cdrom"`),
		"efidisk0": json.RawMessage(`"ceph:base-9000-disk-2,size=4M"`),
		"sata0":    json.RawMessage(`"none,media=cdrom"`),
		"net0":     json.RawMessage(`"virtio,bridge=vmbr0"`),
	}
	// CD-ROMs and cloud-init drives on a storage count, as in Proxmox's
	// clone (none, and the host's drive, do not).
	got := diskStorages(pve.VMConfig{Raw: raw})
	if len(got) != 3 || got[0] != "ceph" || got[1] != "local" || got[2] != "local-lvm" {
		t.Fatalf("%v", got)
	}
	raw = map[string]json.RawMessage{
		"scsi0": json.RawMessage(`"ceph:base-9000-disk-0,size=8G"`),
		"ide2":  json.RawMessage(`"local-lvm:vm-9000-cloudinit,media=cdrom"`),
		"ide0":  json.RawMessage(`"cdrom,media=cdrom"`),
	}
	if got := diskStorages(pve.VMConfig{Raw: raw}); len(got) != 2 || got[0] != "ceph" || got[1] != "local-lvm" {
		t.Fatalf("cloud-init template: %v", got)
	}
}
