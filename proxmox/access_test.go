package proxmox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
)

// syncBuf is a log sink tests read.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPVEVMAdminToken: PVEVMAdmin holds VM.* only. Without Sys.Audit the
// nodes' memory is hidden, so placement is blind (and says why) and the
// job goes to its template's node, where Proxmox refuses the clone for
// the privilege it lacks: the job's error names it, as Proxmox does.
func TestPVEVMAdminToken(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(2), nil)
	c, _ := client(t, sim, "vmadmin@pve", pvesim.RolePVEVMAdmin)
	var logs syncBuf
	s := newServer(t, c, proxmox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, engine.Config{})
	j := s.submit(t, "echo never", "", 0)
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusFailed || !strings.Contains(got.Error, "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)") ||
		!strings.Contains(got.Error, "the API token lacks Datastore.AllocateSpace on /storage/local-lvm") ||
		strings.Contains(got.Error, "MiB free") {
		t.Fatalf("%s: %s", got.Status, got.Error)
	}
	if l := logs.String(); !strings.Contains(l, "placement is blind") || !strings.Contains(l, "Sys.Audit") {
		t.Errorf("log: %s", l)
	}
	noJobVMs(t, sim)
}

// TestLeastPrivilegeToken: the token the README describes, made through
// the simulator's access API (a privilege-separated token with the
// DelegateJobs role on /vms, /nodes, the storage and the bridge, and its
// user with the same), runs jobs on PVE 8 and on PVE 9: with and without
// a NIC, with a disk grown beyond the template's; and checkpoints,
// rolls back and forks a kept sandbox.
func TestLeastPrivilegeToken(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"8.4", "9.1"} {
		t.Run(version, func(t *testing.T) {
			sim := newSim(t, pvesim.DefaultNodes(2), func(o *pvesim.Options) { o.PVEVersion = version })
			admin := pvesim.Token{ID: "root@pam!admin", Secret: "admin-secret", Privileges: pvesim.RoleAdministrator}
			if err := sim.AddToken(admin); err != nil {
				t.Fatal(err)
			}
			jt, err := sim.CreateJobToken(context.Background(), admin)
			if err != nil {
				t.Fatal(err)
			}
			if want := pvesim.JobRolePrivileges(version); strings.Join(jt.Privileges, ",") != strings.Join(want, ",") {
				t.Fatalf("role %v, want %v", jt.Privileges, want)
			}
			c := clientFor(t, sim, jt.User, jt.TokenName, jt.Secret)
			s := newServer(t, c, proxmox.Config{Bridge: "vmbr0", CheckpointDir: t.TempDir()}, engine.Config{})
			plain := s.submit(t, "echo plain", "", 0)
			m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "echo net", Network: delegate.Egress(),
				Resources: &delegate.Resources{Disk: "9G"}}
			netJob, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for id, want := range map[string]string{plain.ID: "plain\n", netJob.ID: "net\n"} {
				if got := s.wait(t, id); got.Status != delegate.StatusSuccess || s.output(t, id) != want {
					t.Errorf("job %s: %s %s %q", id, got.Status, got.Error, s.output(t, id))
				}
			}
			checkpointAll(t, s.eng)
			noJobVMs(t, sim)
			// Not one request was refused for a privilege.
			for _, r := range sim.Requests() {
				if r.Status == 403 {
					t.Errorf("%s %s: %d %s", r.Method, r.Path, r.Status, r.Reason)
				}
			}
		})
	}
}

// checkpointAll checkpoints a kept sandbox, rolls it back, forks it and
// deletes the checkpoint, then releases both sandboxes.
func checkpointAll(t *testing.T, eng *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	sb, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := eng.CheckpointSandbox(ctx, sb.ID, delegate.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RollbackSandbox(ctx, sb.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, forks[0].ID} {
		if _, _, err := eng.ReleaseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedStorage: a template on shared storage can be cloned to any
// node (with target), so a job goes where there is room; a template on
// local storage cannot: its job can only go to the template's node.
func TestSharedStorage(t *testing.T) {
	t.Parallel()
	sim := newSim(t, nil, func(o *pvesim.Options) {
		o.Nodes = pvesim.DefaultNodes(2)
		o.Storages = append(pvesim.DefaultStorages(), pvesim.SharedStorage("ceph"))
	})
	if err := sim.AddTemplate("pve1", 9100, "shared-job", pvesim.TemplateSpec{Storage: "ceph"}); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddTemplate("pve1", 9101, "local-job", pvesim.TemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	// pve1 has room for no 2G VM.
	s := newServer(t, c, proxmox.Config{NodeMemory: map[string]int64{"pve1": 1 << 30}}, engine.Config{})
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "sleep 1; echo moved", VMTemplate: "shared-job",
		Resources: &delegate.Resources{Memory: "2G"}}
	j, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var node string
	testkit.Eventually(t, 10*time.Second, "the job's VM running", func() bool {
		for _, v := range sim.VMs() {
			if strings.HasSuffix(v.Name, j.ID) && v.Status == "running" {
				node = v.Node
			}
		}
		return node != ""
	})
	if node != "pve2" {
		t.Errorf("the VM of a shared template ran on %q, not on the node with room", node)
	}
	if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "moved\n" {
		t.Fatalf("%s %s", got.Status, got.Error)
	}

	m.VMTemplate, m.Task = "local-job", "true"
	j, err = s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Its only node never has room for it: it fails at once, saying so,
	// rather than wait for ever (or clone to pve2, which Proxmox refuses).
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusFailed || !strings.Contains(got.Error, `resources.memory: 2048 MiB is more than any node that can run template "local-job" has for VMs (at most 1024 MiB`) {
		t.Fatalf("%s %q", got.Status, got.Error)
	}
	noJobVMs(t, sim)
}

// TestTemplateShapes: a template with two sockets and a balloon larger
// than the job's memory still gives the job what it asked for: one
// socket of the asked cores, and no balloon (which would be refused).
func TestTemplateShapes(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	if err := sim.AddTemplate("pve1", 9100, "big-job", pvesim.TemplateSpec{Sockets: 2, Cores: 2, MemoryMiB: 8192, BalloonMiB: 4096}); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{Template: "big-job"}, engine.Config{})
	j := s.submit(t, "nproc", "512M", 0)
	if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", got.Status, got.Error)
	}
	for _, r := range sim.Requests() {
		if r.Method == "PUT" && strings.HasSuffix(r.Path, "/config") {
			p := func(k string) string { return fmt.Sprint(r.Params[k]) }
			if p("sockets") != "1" || p("cores") != "1" || p("memory") != "512" || p("balloon") != "0" {
				t.Errorf("config %v", r.Params)
			}
		}
	}
}

// TestReadmeLeastPrivilege: the README gives exactly the role, user,
// token and ACL lines the simulator's access API makes in the test above
// (one definition: pvesim.PveumCommands), and says what each privilege
// is for.
func TestReadmeLeastPrivilege(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/PROXMOX.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, version := range []string{"8.4", "9.1"} {
		for _, line := range pvesim.PveumCommands(version, []string{"local-lvm"}, []string{"vmbr0"}) {
			if !strings.Contains(readme, "\n"+line+"\n") {
				t.Errorf("README lacks the line\n%s", line)
			}
		}
		for _, priv := range pvesim.JobRolePrivileges(version) {
			if !strings.Contains(readme, "| `"+priv+"`") && !strings.Contains(readme, "`"+priv+"` (") && !strings.Contains(readme, "/ `"+priv+"`") {
				t.Errorf("README does not say what %s is for", priv)
			}
		}
	}
}

// TestPVE9UpgradeHint (issue 39, 16): on PVE 9 a role made for PVE 8
// (VM.Monitor, which PVE 9 dropped) has no guest agent: the job fails
// saying what the upgrade took and what to add.
func TestPVE9UpgradeHint(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), func(o *pvesim.Options) { o.PVEVersion = "9.1" })
	privs := slices.DeleteFunc(pvesim.JobRolePrivileges("9.1"), func(p string) bool { return strings.HasPrefix(p, "VM.GuestAgent.") })
	c, _ := client(t, sim, "delegate@pve", privs)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.wait(t, s.submit(t, "true", "", 0).ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "PVE 9 replaced VM.Monitor with VM.GuestAgent.*") ||
		!strings.Contains(j.Error, "VM.GuestAgent.Unrestricted --append 1") {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
	noJobVMs(t, sim)
}
