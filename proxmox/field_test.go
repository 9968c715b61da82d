package proxmox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/testsim"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sqlite"
)

// Proxmox as it is in the field: templates, limits and failures of real
// clusters (issue 20), each shown by a fixture of the simulator.

// simWith is a fast simulated cluster with one template, made to spec,
// on the first node.
func simWith(t *testing.T, nodes []pvesim.NodeSpec, spec pvesim.TemplateSpec, tune func(*pvesim.Options)) *pvesim.Server {
	t.Helper()
	sim := testsim.Start(t, nodes, tune)
	if spec.Tags == "" {
		spec.Tags = "delegate;template"
	}
	if err := sim.AddTemplate(nodes[0].Name, 9000, "debian-job", spec); err != nil {
		t.Fatal(err)
	}
	return sim
}

func (s *server) submitManifest(t *testing.T, m delegate.Manifest) *delegate.Job {
	t.Helper()
	j, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func clones(sim *pvesim.Server) int {
	n := 0
	for _, task := range sim.Tasks() {
		if task.Type == "qmclone" {
			n++
		}
	}
	return n
}

// logBuffer is a slog handler's output, safe to read while written.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// TestProtectedTemplate (1): a clone copies the template's protection;
// the job's VM loses it, so it is destroyed when the job ends.
func TestProtectedTemplate(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Protection: true}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.wait(t, s.submit(t, "echo hi", "", 0).ID)
	if j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "hi\n" {
		t.Fatalf("%s %s %q", j.Status, j.Error, s.output(t, j.ID))
	}
	noJobVMs(t, sim)
	if v, _ := sim.VM(9000); v.Config["protection"] != "1" {
		t.Error("the template lost its protection")
	}
}

// TestLargeTasks (2, 6): a 200 KiB task runs on PVE 9.1 and a 34 KiB one
// on PVE 8.2 (whose pveproxy refuses bodies over 64 KiB), through the
// engine; no argument list the agent sees, nor any in the guest while the
// job runs, holds the task, an env value or a secret; the job gets its
// env, its secret and its task.
func TestLargeTasks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version   string
		size      int
		emulation bool // the agent's emulation, where qemu-ga is missing
	}{{"9.1", 200 << 10, false}, {"8.2", 34 << 10, false}, {"9.1", 200 << 10, true}} {
		t.Run(fmt.Sprintf("%s emulation=%v", tc.version, tc.emulation), func(t *testing.T) {
			sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, func(o *pvesim.Options) {
				o.PVEVersion, o.AgentEmulation = tc.version, tc.emulation
			})
			c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
			const secret, envValue, taskMark = "s3cret-0f1e2d", "env-value-9a8b7c", "task-mark-5d4c3b"
			s := newServer(t, c, proxmox.Config{}, engine.Config{Secret: func(name string) (string, bool) {
				return secret, name == "API_TOKEN"
			}})
			// The job prints its env and secret, and the size of its own
			// task (in $DELEGATE_TASK, or the file $DELEGATE_INPUTS/task when
			// too large for one environment string).
			script := `if [ -n "${DELEGATE_TASK+x}" ]; then n=${#DELEGATE_TASK}; else n=$(wc -c <"$DELEGATE_INPUTS/task"); fi
echo "env=$FOO secret=$(printf %s "$API_TOKEN" | tr a-z A-Z) task=$n"
# ` + taskMark + ` `
			task := script + strings.Repeat("x", tc.size-len(script)-1) + "\n"
			j := s.wait(t, s.submitManifest(t, delegate.Manifest{AgentType: delegate.AgentScript, Task: task,
				Env: map[string]string{"FOO": envValue}, Secrets: []string{"API_TOKEN"}}).ID)
			// (The secret in upper case: the engine redacts it in the output.)
			want := fmt.Sprintf("env=%s secret=%s task=%d\n", envValue, strings.ToUpper(secret), len(task))
			if j.Status != delegate.StatusSuccess || s.output(t, j.ID) != want {
				t.Fatalf("%s %s %q, want %q", j.Status, j.Error, s.output(t, j.ID), want)
			}
			for _, r := range sim.Requests() {
				if !strings.HasSuffix(r.Path, "/agent/exec") {
					continue
				}
				argv := fmt.Sprint(r.Params["command"])
				for _, m := range []string{secret, envValue, taskMark, "xxxxxxxx"} {
					if strings.Contains(argv, m) {
						t.Errorf("an agent/exec holds %q: %.300s", m, argv)
					}
				}
				if len(argv) > 4096 {
					t.Errorf("an agent/exec of %d bytes: %.300s", len(argv), argv)
				}
			}
		})
	}
}

// TestArgumentListsInGuest (6): while a job runs, no process of its guest
// shows the task, an env value or a secret in its argument list.
func TestArgumentListsInGuest(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	const secret, envValue, taskMark = "s3cret-77aa", "env-value-88bb", "task-mark-99cc"
	s := newServer(t, c, proxmox.Config{}, engine.Config{Secret: func(name string) (string, bool) { return secret, name == "API_TOKEN" }})
	task := "# " + taskMark + "\nsleep 0.3; for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' <\"$f\"; echo; done"
	j := s.wait(t, s.submitManifest(t, delegate.Manifest{AgentType: delegate.AgentScript, Task: task,
		Env: map[string]string{"FOO": envValue}, Secrets: []string{"API_TOKEN"}}).ID)
	out := s.output(t, j.ID)
	if j.Status != delegate.StatusSuccess || !strings.Contains(out, "qemu-ga") && !strings.Contains(out, "/bin/sh") {
		t.Fatalf("%s %s %q", j.Status, j.Error, out)
	}
	for _, m := range []string{secret, envValue, taskMark} {
		if strings.Contains(out, m) {
			t.Errorf("an argument list in the guest holds %q:\n%s", m, out)
		}
	}
}

// TestCloudInitTemplate (3): a template whose disks are on shared storage
// but whose cloud-init drive is on local storage cannot be cloned to
// another node: a job that does not fit on its node waits for room there.
func TestCloudInitTemplate(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(2), pvesim.TemplateSpec{Storage: "ceph", CloudInit: "local-lvm"}, func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.SharedStorage("ceph"))
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{NodeMemory: map[string]int64{"pve1": 3 << 30}}, engine.Config{MaxConcurrent: 2})
	a := s.submit(t, "sleep 1; echo a", "2G", 0)
	b := s.submit(t, "sleep 1; echo b", "2G", 0)
	for _, j := range []*delegate.Job{s.wait(t, a.ID), s.wait(t, b.ID)} {
		if j.Status != delegate.StatusSuccess {
			t.Errorf("job %s: %s %s", j.ID, j.Status, j.Error)
		}
	}
	for _, r := range sim.Requests() {
		if strings.HasSuffix(r.Path, "/clone") && r.Params["target"] != nil {
			t.Errorf("a clone to another node: %v (%s)", r.Params, r.Reason)
		}
	}
}

// TestRHELTemplate (4): a template whose qemu-ga blocks exec and the file
// calls (while ping answers) fails its first job with the template and
// the fix named, and is refused at once from then on: no more clones.
func TestRHELTemplate(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{AgentDisabledRPCs: pvesim.RHELAgentDisabledRPCs()}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.wait(t, s.submit(t, "echo hi", "", 0).ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "debian-job (9000)") || !strings.Contains(j.Error, "guest-exec") ||
		!strings.Contains(j.Error, "BLOCK_RPCS") {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
	noJobVMs(t, sim)
	made := clones(sim)
	_, err := s.eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", VMTemplate: "debian-job"}, delegate.SubmitOptions{})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || fe.Field != "manifest.vmTemplate" || !strings.Contains(fe.Rule, "does not allow") {
		t.Fatalf("second submission: %v", err)
	}
	// The default template: accepted (the server's), failed at once.
	j = s.wait(t, s.submit(t, "echo hi", "", 0).ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "does not allow") || clones(sim) != made {
		t.Fatalf("%s %q, %d clones (was %d)", j.Status, j.Error, clones(sim), made)
	}
}

// TestTemplateWithoutAgent (12): a template with agent: 0 fails its jobs
// at once, without a clone, instead of after the agent time-out.
func TestTemplateWithoutAgent(t *testing.T) {
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Agent: "0"}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{AgentTimeout: 20 * time.Second}, engine.Config{})
	start := time.Now()
	j := s.wait(t, s.submit(t, "echo hi", "", 0).ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "no QEMU guest agent enabled") || clones(sim) != 0 || time.Since(start) > 15*time.Second {
		t.Fatalf("%s %q, %d clones, after %s", j.Status, j.Error, clones(sim), time.Since(start))
	}
	_, err := s.eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", VMTemplate: "9000"}, delegate.SubmitOptions{})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || fe.Field != "manifest.vmTemplate" || !strings.Contains(fe.Rule, "agent") {
		t.Fatalf("submission naming it: %v", err)
	}
}

// TestCloudInitWarnings (10): the template check warns on what costs
// jobs dearly: cloud-init's package upgrade at every first boot.
func TestCloudInitWarnings(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{CloudInit: "local-lvm"}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	var logs logBuffer
	s := newServer(t, c, proxmox.Config{Logger: logs.logger()}, engine.Config{})
	if j := s.wait(t, s.submit(t, "true", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", j.Status, j.Error)
	}
	if !strings.Contains(logs.String(), "ciupgrade") {
		t.Fatalf("no warning about ciupgrade:\n%s", logs.String())
	}

	sim = simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{CloudInit: "local-lvm", CIUpgrade: "0"}, nil)
	c, _ = client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	var quiet logBuffer
	s = newServer(t, c, proxmox.Config{Logger: quiet.logger()}, engine.Config{})
	if j := s.wait(t, s.submit(t, "true", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", j.Status, j.Error)
	}
	if strings.Contains(quiet.String(), "ciupgrade") {
		t.Fatalf("a warning with ciupgrade 0:\n%s", quiet.String())
	}
}

// TestJobBridgeKeepsNICOptions (11): a job's NIC on PROXMOX_JOB_BRIDGE
// keeps the template's firewall, rate and mtu.
func TestJobBridgeKeepsNICOptions(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Net0: "virtio=BC:24:11:00:00:09,bridge=vmbr0,firewall=1,rate=50,mtu=1400"}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{Bridge: "vmbr0", VLAN: 20}, engine.Config{})
	j := s.submitManifest(t, delegate.Manifest{AgentType: delegate.AgentScript, Task: "sleep 1", Network: delegate.Egress()})
	var net string
	testkit.Eventually(t, 10*time.Second, "the job's VM running", func() bool {
		for _, v := range sim.VMs() {
			if !v.Template && v.Status == "running" {
				net = v.Config["net0"]
			}
		}
		return net != ""
	})
	if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", got.Status, got.Error)
	}
	for _, want := range []string{"bridge=vmbr0", "tag=20", "firewall=1", "rate=50", "mtu=1400"} {
		if !strings.Contains(","+net+",", ","+want+",") {
			t.Errorf("net0 %q lacks %s", net, want)
		}
	}
	if strings.Contains(net, "BC:24:11:00:00:09") {
		t.Errorf("net0 %q has the template's MAC", net)
	}
}

// TestCoresPlacement (13): a job goes only to a node with at least its
// cores; one asking more than any node has is refused at submission;
// with an overcommit ratio, vCPUs are reserved across jobs.
func TestCoresPlacement(t *testing.T) {
	t.Parallel()
	nodes := []pvesim.NodeSpec{{Name: "pve1", CPUs: 4, MemoryBytes: 64 << 30}, {Name: "pve2", CPUs: 8, MemoryBytes: 16 << 30}}
	sim := simWith(t, nodes, pvesim.TemplateSpec{Storage: "ceph"}, func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.SharedStorage("ceph"))
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{MaxConcurrent: 4})
	six := func(task string) delegate.Manifest {
		return delegate.Manifest{AgentType: delegate.AgentScript, Task: task, Resources: &delegate.Resources{CPU: 6}}
	}
	j := s.wait(t, s.submitManifest(t, six("nproc")).ID)
	if j.Status != delegate.StatusSuccess {
		t.Fatalf("6 cores: %s %s", j.Status, j.Error)
	}
	for _, task := range sim.Tasks() {
		if task.Type == "qmstart" && task.ExitStatus != "OK" {
			t.Errorf("a start failed: %s", task.ExitStatus)
		}
	}
	_, err := s.eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Resources: &delegate.Resources{CPU: 12}}, delegate.SubmitOptions{})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || fe.Field != "manifest.resources.cpu" || !strings.Contains(fe.Rule, "at most 8") {
		t.Fatalf("12 cores: %v", err)
	}

	// An overcommit ratio of 1: two 6-core jobs take turns on pve2.
	o := newServer(t, c, proxmox.Config{CPUOvercommit: 1, Instance: "cafe0001"}, engine.Config{MaxConcurrent: 4})
	a, b := o.submitManifest(t, six("sleep 1")), o.submitManifest(t, six("sleep 1"))
	ja, jb := o.wait(t, a.ID), o.wait(t, b.ID)
	if ja.Status != delegate.StatusSuccess || jb.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s; %s %s", ja.Status, ja.Error, jb.Status, jb.Error)
	}
	if ja.StartedAt.After(jb.StartedAt) {
		ja, jb = jb, ja
	}
	waited := false
	for _, p := range o.store.steps(jb.ID) {
		waited = waited || strings.Contains(p, "vCPUs")
	}
	if jb.StartedAt.Before(ja.FinishedAt) || !waited {
		t.Errorf("the jobs overlapped or did not wait for vCPUs: %q", o.store.steps(jb.ID))
	}
}

// TestCloneCollisions (8): a clone that loses its vmid to another node's
// clone (pmxcfs's "close (rename) atomic file ... File exists") and one
// that waits too long for a shared storage's cluster lock ("cfs-lock
// 'storage-ceph' error: got lock request timeout") are retried.
func TestCloneCollisions(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(2), pvesim.TemplateSpec{Storage: "ceph"}, func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.SharedStorage("ceph"))
		o.Faults.CloneRaces = 2
		o.LockTimeoutScale = 0.05 // PVE's 10 s waits for a storage lock become 0.5 s
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	if j := s.wait(t, s.submit(t, "echo one", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("after vmid races: %s %s", j.Status, j.Error)
	}
	if err := sim.HoldStorageLock("pve1", "ceph", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if j := s.wait(t, s.submit(t, "echo two", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("after a storage lock time-out: %s %s", j.Status, j.Error)
	}
	var renames, cfs int
	for _, task := range sim.Tasks() {
		renames += strings.Count(task.ExitStatus, "atomic file")
		cfs += strings.Count(task.ExitStatus, "cfs-lock 'storage-ceph' error: got lock request timeout")
	}
	if renames != 2 || cfs == 0 {
		t.Errorf("%d rename collisions, %d cfs-lock time-outs", renames, cfs)
	}
	// The VMs the other node's clones made are left alone.
	others := 0
	for _, v := range sim.VMs() {
		if strings.HasPrefix(v.Name, "other-clone-") {
			others++
		}
	}
	if others != 2 {
		t.Errorf("%d of the other clones' VMs left", others)
	}
}

// TestOfflineStorage (9): a job's VM is destroyed while an image storage
// of the cluster is offline.
func TestOfflineStorage(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, func(o *pvesim.Options) {
		o.Storages = append(pvesim.DefaultStorages(), pvesim.StorageSpec{ID: "nas", Type: "nfs", Content: "images"})
	})
	if err := sim.SetStorageOnline("nas", false); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	if j := s.wait(t, s.submit(t, "true", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", j.Status, j.Error)
	}
	noJobVMs(t, sim)
}

// TestAgentRestartKeepsJob (6): a restart of the guest agent (an upgrade)
// does not kill the job: the runner is in a unit of its own.
func TestAgentRestartKeepsJob(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, nil)
	if !strings.HasPrefix(sim.AgentKind(), "qemu-ga") {
		if os.Getenv("DELEGATE_REQUIRE_QEMU_GA") != "" {
			t.Fatalf("guests run %s: qemu-guest-agent is not installed", sim.AgentKind())
		}
		t.Skip("needs the real qemu-ga (Debian's qemu-guest-agent)")
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, `echo before; echo "half way" > "$DELEGATE_STATUS_FILE"; sleep 2; echo after`, "", 0)
	vmid := 0
	testkit.Eventually(t, 10*time.Second, "the job running", func() bool {
		cur, _ := s.eng.Get(context.Background(), j.ID)
		if cur.Status == delegate.StatusRunning {
			fmt.Sscanf(cur.SandboxID, "vm-%d", &vmid)
		}
		return vmid != 0
	})
	// Its command runs (its first line is out) when the agent restarts.
	testkit.Eventually(t, 10*time.Second, "the job's first line", func() bool { return strings.Contains(s.output(t, j.ID), "before") })
	if err := sim.RestartAgent(context.Background(), vmid); err != nil {
		t.Fatal(err)
	}
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "before\nafter\n" {
		t.Fatalf("%s %s %q", got.Status, got.Error, s.output(t, j.ID))
	}
}

// TestResourcePool (5): with PROXMOX_RESOURCE_POOL, a token whose job role
// is on /pool/<name> only (PVETemplateUser on the template) runs jobs:
// their VMs are cloned into the pool, with backup=0 on their disks; the
// token can touch no other VM.
func TestResourcePool(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"8.4", "9.1"} {
		t.Run(version, func(t *testing.T) {
			sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, func(o *pvesim.Options) {
				o.PVEVersion, o.Pools = version, []string{"delegate-jobs"}
			})
			admin := pvesim.Token{ID: "root@pam!admin", Secret: "admin-secret", Privileges: pvesim.RoleAdministrator}
			if err := sim.AddToken(admin); err != nil {
				t.Fatal(err)
			}
			jt, err := sim.CreatePoolJobToken(context.Background(), admin, "delegate-jobs", []int{9000})
			if err != nil {
				t.Fatal(err)
			}
			c := clientFor(t, sim, jt.User, jt.TokenName, jt.Secret)
			s := newServer(t, c, proxmox.Config{ResourcePool: "delegate-jobs"}, engine.Config{})
			j := s.submit(t, "sleep 0.5; echo pooled", "", 0)
			var disk string
			testkit.Eventually(t, 10*time.Second, "the job's VM running", func() bool {
				for _, v := range sim.VMs() {
					if !v.Template && v.Status == "running" && v.Name != "" && !strings.HasPrefix(v.Name, "other") {
						disk = v.Config["scsi0"]
					}
				}
				return disk != ""
			})
			if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "pooled\n" {
				t.Fatalf("%s %s %q", got.Status, got.Error, s.output(t, j.ID))
			}
			if !strings.Contains(disk, ",backup=0") {
				t.Errorf("the job VM's disk %q is not left out of backups", disk)
			}
			noJobVMs(t, sim)
			for _, r := range sim.Requests() {
				if r.Status == 403 && r.TokenID == jt.User+"!"+jt.TokenName {
					t.Errorf("%s %s: %d %s", r.Method, r.Path, r.Status, r.Reason)
				}
				if strings.HasSuffix(r.Path, "/clone") && r.Params["pool"] != "delegate-jobs" {
					t.Errorf("a clone outside the pool: %v", r.Params)
				}
			}
			// Outside the pool the token reaches nothing: not the template's
			// config changes, nor another VM.
			if err := c.SetVMConfig(context.Background(), "pve1", 9000, pve.VMConfigUpdate{Tags: []string{"x"}}); !pve.IsForbidden(err) {
				t.Errorf("a change of the template: %v", err)
			}
		})
	}
}

// TestNodeCallBound (7): three VMs booting on one node (each agent call
// first pings, and a ping to a booting guest waits its time-out, holding
// one of the node's three pvedaemon workers) never take more than two of
// them: one stays free for the web UI and other clients.
func TestNodeCallBound(t *testing.T) {
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, func(o *pvesim.Options) {
		o.BootDelay, o.AgentPingTimeout = 2*time.Second, time.Second
		o.RequestLatency = pvesim.Span{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{MaxConcurrent: 4})
	var jobs []*delegate.Job
	for i := range 4 {
		jobs = append(jobs, s.submit(t, fmt.Sprintf("echo %d", i), "", 0))
	}
	for _, j := range jobs {
		if got := s.wait(t, j.ID); got.Status != delegate.StatusSuccess {
			t.Errorf("%s %s", got.Status, got.Error)
		}
	}
	if peak := sim.PeakCalls()["pve1"]; peak > 2 || peak == 0 {
		t.Errorf("%d calls at once on pve1, want at most 2", peak)
	}
}

// TestPoolAdoptsPendingShape (14): a pool VM whose memory was changed
// while it ran (the change waits for its next start, in [PENDING]) still
// runs with the pool's shape: a restarted server adopts it, reading the
// config it runs with (current=1), not the one it would boot with.
func TestPoolAdoptsPendingShape(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	pcfg := proxmox.Config{Instance: "pend1234"}
	first := newServer(t, c, pcfg, engine.Config{})
	stop := keepPool(t, first, poolCfg(1))
	waitReady(t, first.backend, 1)
	stop()
	first.eng.Close()
	vms := poolVMs(sim)
	if len(vms) != 1 {
		t.Fatalf("pool %+v", vms)
	}
	vm := vms[0]
	if err := c.SetVMConfig(context.Background(), vm.Node, vm.VMID, pve.VMConfigUpdate{MemoryMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	if v, _ := sim.VM(vm.VMID); v.Pending["memory"] != "1024" || v.Config["memory"] != "256" {
		t.Fatalf("not pending: %v, %v", v.Pending, v.Config)
	}
	second := newServer(t, c, pcfg, engine.Config{})
	keepPool(t, second, poolCfg(1))
	waitReady(t, second.backend, 1)
	if now := poolVMs(sim); len(now) != 1 || now[0].VMID != vm.VMID {
		t.Fatalf("the pool VM was replaced: %+v", now)
	}
}

// TestStaleLockReported (15): a VM of this server left locked by a clone
// that died half-way is skipped by the cleanup loop (only root may clear
// the lock), and reported with the way out.
func TestStaleLockReported(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	ctx := context.Background()
	upid, err := c.CloneVM(ctx, "pve1", 9000, pve.CloneOptions{NewID: 150, Name: "delegate-lock1234-job-gone"})
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetVMLock(150, "clone"); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	b, err := proxmox.New(c, proxmox.Config{Instance: "lock1234", StaleLockAfter: 200 * time.Millisecond, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	list := func() {
		t.Helper()
		if vms, err := b.List(ctx); err != nil || len(vms) != 0 {
			t.Fatalf("%v %v", vms, err)
		}
	}
	// Listed until the lock has been held past StaleLockAfter (it is
	// reported then), and twice more: reported once.
	testkit.Eventually(t, 10*time.Second, "the stale lock reported", func() bool {
		list()
		return strings.Contains(logs.String(), "qm unlock 150")
	})
	list()
	list()
	if out := logs.String(); strings.Count(out, "qm unlock 150") != 1 || !strings.Contains(out, "lock=clone") {
		t.Fatalf("the stale lock was not reported once:\n%s", out)
	}
}

// TestReadmePoolLines (5): the README gives the resource pool's lines the
// simulator's access API makes in TestResourcePool (one definition:
// pvesim.PveumPoolCommands).
func TestReadmePoolLines(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/PROXMOX.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"8.4", "9.1"} {
		for _, line := range pvesim.PveumPoolCommands(version, "delegate-jobs", []int{9000}, []string{"local-lvm"}, []string{"vmbr0"}) {
			if !strings.Contains(string(b), "\n"+line+"\n") {
				t.Errorf("README lacks the line\n%s", line)
			}
		}
	}
}

// TestReadmeTemplateRecipe (10): the template the README's recipe makes
// (its qm lines, read from the README) passes the template check without
// a warning and runs jobs.
func TestReadmeTemplateRecipe(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/PROXMOX.md")
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, ok := strings.Cut(string(b), "#### A job template (recipe)")
	if !ok {
		t.Fatal("no recipe in the README")
	}
	opts := map[string]string{}
	for _, line := range strings.Split(recipe, "\n") {
		if line == "```" && len(opts) > 0 {
			break
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "qm" || (f[1] != "create" && f[1] != "set") {
			continue
		}
		for i := 3; i+1 < len(f); i += 2 {
			opts[strings.TrimPrefix(f[i], "--")] = f[i+1]
		}
	}
	// What the guest's scripts use beyond Debian's essential packages
	// (sh, coreutils, findutils, tar, gzip, perl-base, util-linux):
	// the agent, and curl, with which a VM with a network fetches its
	// workspace (transfer.go).
	for _, line := range strings.Split(recipe, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "virt-customize" {
			for i := range f {
				if f[i] == "--install" && i+1 < len(f) {
					opts["install"] = f[i+1]
				}
			}
		}
	}
	for _, pkg := range []string{"qemu-guest-agent", "curl"} {
		if !slices.Contains(strings.Split(opts["install"], ","), pkg) {
			t.Errorf("the recipe installs %q, not %s", opts["install"], pkg)
		}
	}
	ci, _, _ := strings.Cut(opts["ide2"], ":")
	spec := pvesim.TemplateSpec{Agent: opts["agent"], CloudInit: ci, CIUpgrade: opts["ciupgrade"], Net0: opts["net0"]}
	if spec.Agent != "enabled=1" || spec.CloudInit != "local-lvm" || spec.CIUpgrade != "0" || opts["name"] != "debian-job" {
		t.Fatalf("the recipe's options: %v", opts)
	}
	sim := simWith(t, pvesim.DefaultNodes(1), spec, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	var logs logBuffer
	s := newServer(t, c, proxmox.Config{Logger: logs.logger()}, engine.Config{})
	if j := s.wait(t, s.submit(t, "echo ok", "", 0).ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", j.Status, j.Error)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("warnings for the recipe's template:\n%s", logs.String())
	}
}

// TestFieldAtRealLatency: at a real cluster's timings (requests 10-50 ms,
// agent calls 25 ms, 3 s pings of booting guests, clone 2 s, boot 12 s,
// pvedaemon's three workers), three jobs at once on one node of a
// protected template — one of them a 200 KiB task — all run, never more
// than two calls are in flight on the node, and every VM is destroyed.
func TestFieldAtRealLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("about 30 s at real latencies")
	}
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Protection: true}, func(o *pvesim.Options) {
		o.Latency, o.TaskDelay, o.BootDelay = "real", 0, 0
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{PollInterval: time.Second}, engine.Config{MaxConcurrent: 3, PollInterval: time.Second})
	big := "echo big; : '" + strings.Repeat("x", 200<<10) + "'"
	jobs := []*delegate.Job{s.submit(t, "echo one", "", 0), s.submit(t, big, "", 0), s.submit(t, "sleep 1; echo three", "", 0)}
	for i, want := range []string{"one\n", "big\n", "three\n"} {
		if j := s.wait(t, jobs[i].ID); j.Status != delegate.StatusSuccess || s.output(t, j.ID) != want {
			t.Errorf("job %d: %s %s %q", i, j.Status, j.Error, s.output(t, j.ID))
		}
	}
	if peak := sim.PeakCalls()["pve1"]; peak > 2 {
		t.Errorf("%d calls at once on pve1", peak)
	}
	noJobVMs(t, sim)
}

// TestUEFITemplate (issue 39, 1): a UEFI template with Secure Boot keys
// and a TPM runs jobs: the job VM's disk leaves backups, and its EFI and
// TPM drives, whose formats have no backup key, are left as they are.
func TestUEFITemplate(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{OVMF: true, TPM: true}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, "sleep 0.3; echo uefi", "", 0)
	var cfg map[string]string
	testkit.Eventually(t, 10*time.Second, "the job's VM running", func() bool {
		for _, v := range sim.VMs() {
			if !v.Template && v.Status == "running" {
				cfg = v.Config
			}
		}
		return cfg != nil
	})
	if j := s.wait(t, j.ID); j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "uefi\n" {
		t.Fatalf("%s %s %q", j.Status, j.Error, s.output(t, j.ID))
	}
	if !strings.Contains(cfg["scsi0"], "backup=0") || strings.Contains(cfg["efidisk0"], "backup") || strings.Contains(cfg["tpmstate0"], "backup") ||
		cfg["efidisk0"] == "" || cfg["tpmstate0"] == "" {
		t.Errorf("the job VM's drives: scsi0 %q efidisk0 %q tpmstate0 %q", cfg["scsi0"], cfg["efidisk0"], cfg["tpmstate0"])
	}
	noJobVMs(t, sim)
}

// TestDefaultTemplateWithoutAgent (issue 39, 10): the server's default
// template with agent: 0 refuses a submission with a classified error
// that says what is wrong and how to fix it, not "failed on the server".
func TestDefaultTemplateWithoutAgent(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Agent: "0"}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	b, err := proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng := engine.New(st, b, engine.Config{ArtifactDir: t.TempDir(),
		Defaults: delegate.Defaults{Timeout: 60, CPU: 1, Memory: "256M", Disk: "1G", VMTemplate: "debian-job"}})
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	_, err = eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}, delegate.SubmitOptions{})
	if k := delegate.ErrorKind(err); k != delegate.KindInvalid || !strings.Contains(err.Error(), "no QEMU guest agent enabled") ||
		!strings.Contains(err.Error(), "agent enabled=1") || !strings.Contains(err.Error(), "default") {
		t.Fatalf("submission with the default template: %v (kind %s)", err, k)
	}
	if clones(sim) != 0 {
		t.Errorf("%d clones", clones(sim))
	}
}

// TestSELinuxTemplate (issue 39, 16): a RHEL-family template whose
// SELinux confines qemu-ga (virt_qemu_ga_run_unconfined off) fails its
// job saying so and naming the boolean, not with a bare "Permission
// denied".
func TestSELinuxTemplate(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{SELinux: true}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.wait(t, s.submit(t, "echo hi", "", 0).ID)
	if j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "setsebool -P virt_qemu_ga_run_unconfined on") {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
	noJobVMs(t, sim)
}

// TestToolchainPath (issue 39, 15): a job on the standard PATH finds the
// toolchains the guest has outside it (here the host's Go, in
// /usr/local/go/bin), as a local job finds its root's; a PATH the job
// set is left as it is.
func TestToolchainPath(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
		t.Skip("no Go in /usr/local/go on this host: the simulator's guests have none either")
	}
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.wait(t, s.submit(t, `echo "$PATH"; command -v go`, "", 0).ID)
	if want := sandbox.DefaultPath + ":/usr/local/go/bin\n/usr/local/go/bin/go\n"; j.Status != delegate.StatusSuccess || s.output(t, j.ID) != want {
		t.Fatalf("%s %s %q, want %q", j.Status, j.Error, s.output(t, j.ID), want)
	}
	own := s.submitManifest(t, delegate.Manifest{AgentType: delegate.AgentScript, Task: `echo "$PATH"`, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if j := s.wait(t, own.ID); s.output(t, j.ID) != "/usr/bin:/bin\n" {
		t.Errorf("a PATH of its own: %q", s.output(t, j.ID))
	}
}

// TestTemplatePerNode (issue 39, 9): copies of a template on each node,
// named as the operator likes and tagged delegate-template-NAME, all
// stand for NAME: with the first template's node down, jobs are cloned
// from the copy on a node that is up.
func TestTemplatePerNode(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(2), pvesim.TemplateSpec{}, nil)
	if err := sim.AddTemplate("pve2", 9001, "debian-job-pve2", pvesim.TemplateSpec{Tags: "delegate-template-debian-job"}); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	if err := sim.SetNodeOnline("pve1", false); err != nil {
		t.Fatal(err)
	}
	j := s.wait(t, s.submit(t, "echo up", "", 0).ID)
	if j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "up\n" {
		t.Fatalf("%s %q %q", j.Status, j.Error, s.output(t, j.ID))
	}
	if steps := strings.Join(s.store.steps(j.ID), "; "); !strings.Contains(steps, "cloning from debian-job-pve2 on pve2") {
		t.Errorf("steps: %s", steps)
	}
}

// TestTaskIDsLogged (issue 39, 13): the log names every Proxmox task a
// job's VM went through (clone, start, stop, destroy), its UPID at info
// level with the job's id, for the audit.
func TestTaskIDsLogged(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	var logs logBuffer
	s := newServer(t, c, proxmox.Config{Logger: logs.logger()}, engine.Config{})
	j := s.wait(t, s.submit(t, "true", "", 0).ID)
	if j.Status != delegate.StatusSuccess {
		t.Fatalf("%s %q", j.Status, j.Error)
	}
	noJobVMs(t, sim)
	for _, task := range []string{"clone", "start", "stop", "destroy"} {
		found := false
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=INFO") && strings.Contains(line, `msg="proxmox task"`) && strings.Contains(line, " task="+task+" ") &&
				strings.Contains(line, "job="+j.ID) && strings.Contains(line, "upid=UPID:pve1:") {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s task logged for job %s:\n%s", task, j.ID, logs.String())
		}
	}
}
