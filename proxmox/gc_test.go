package proxmox_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
)

// keptVM opens a kept sandbox on a server and returns its VM's id.
func keptVM(t *testing.T, s *server) int {
	t.Helper()
	ctx := context.Background()
	sb, err := s.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := s.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Sandbox: sb.ID}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j := s.wait(t, j.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
	got, err := s.eng.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	vmid, _, _ := strings.Cut(strings.TrimPrefix(got.Instance, "vm-"), "-")
	return atoiT(t, vmid)
}

// age sets a VM's stamp to d ago, as if its server had not seen it since.
func age(t *testing.T, c *pve.Client, sim *pvesim.Server, vmid int, d time.Duration) {
	t.Helper()
	v, _ := sim.VM(vmid)
	var tags []string
	for _, tag := range strings.Split(v.Config["tags"], ";") {
		if !strings.HasPrefix(tag, proxmox.SeenTagPrefix) {
			tags = append(tags, tag)
		}
	}
	tags = append(tags, proxmox.SeenTagPrefix+strconv.FormatInt(time.Now().Add(-d).Unix(), 10))
	if err := c.SetVMConfig(context.Background(), v.Node, vmid, pve.VMConfigUpdate{Tags: tags}); err != nil {
		t.Fatal(err)
	}
}

// TestGC (issue 39, 13): each server stamps its VMs as seen; gc takes the
// VMs of an instance that has not stamped them for --older-than, judged
// by Proxmox alone: a dry run says what and why, --act removes them; a
// live server's VMs (stamped again though their stamp was old), other
// VMs and templates are left alone.
func TestGC(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	admin, _ := client(t, sim, "admin@pve", pvesim.RoleAdministrator)
	gone := newServer(t, c, proxmox.Config{Instance: "aaaa1111"}, engine.Config{})
	live := newServer(t, c, proxmox.Config{Instance: "bbbb2222", StampInterval: 500 * time.Millisecond}, engine.Config{})
	dead, alive := keptVM(t, gone), keptVM(t, live)
	upid, err := admin.CloneVM(context.Background(), "pve1", 9000, pve.CloneOptions{NewID: 700, Name: "someones"})
	if err == nil {
		err = admin.WaitTask(context.Background(), "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The first server is gone for good (its data dir lost): nothing
	// stamps its VM any more; two days pass.
	gone.eng.Close()
	gone.backend.Close()
	age(t, admin, sim, dead, 48*time.Hour)
	age(t, admin, sim, alive, 48*time.Hour)
	// The live server stamps its VM again within an interval.
	testkit.Eventually(t, 20*time.Second, "the live server's VM stamped again", func() bool {
		v, _ := sim.VM(alive)
		return time.Since(stampOf(v.Config["tags"])) < time.Hour
	})
	ctx := context.Background()
	items, err := proxmox.GC(ctx, admin, proxmox.GCOptions{OlderThan: 24 * time.Hour})
	if err != nil || len(items) != 1 || items[0].VMID != dead || items[0].Removed ||
		!strings.Contains(items[0].String(), "would remove VM "+strconv.Itoa(dead)) || !strings.Contains(items[0].Why, "instance aaaa1111 last saw it 48h0m0s ago") {
		t.Fatalf("dry run: %v %v", items, err)
	}
	if _, ok := sim.VM(dead); !ok {
		t.Fatal("the dry run removed the VM")
	}
	items, err = proxmox.GC(ctx, admin, proxmox.GCOptions{OlderThan: 24 * time.Hour, Act: true, PollInterval: 50 * time.Millisecond})
	if err != nil || len(items) != 1 || !items[0].Removed {
		t.Fatalf("act: %v %v", items, err)
	}
	for vmid, want := range map[int]bool{dead: false, alive: true, 700: true, 9000: true} {
		if _, ok := sim.VM(vmid); ok != want {
			t.Errorf("VM %d exists: %v, want %v", vmid, ok, want)
		}
	}
	if _, err := proxmox.GC(ctx, admin, proxmox.GCOptions{OlderThan: time.Minute}); err == nil {
		t.Error("an --older-than shorter than two stamp intervals was accepted")
	}
}

// stampOf reads a VM's tags' stamp (zero if none).
func stampOf(tags string) time.Time {
	for _, tag := range strings.Split(tags, ";") {
		if s, ok := strings.CutPrefix(tag, proxmox.SeenTagPrefix); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return time.Unix(n, 0)
			}
		}
	}
	return time.Time{}
}
