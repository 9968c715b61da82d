package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
)

// simCluster starts a Proxmox VE simulator with a template on each node
// and returns it with the environment that points delegate at it.
func simCluster(t *testing.T, nodes int) (*pvesim.Server, []string) {
	return simClusterWith(t, nodes, nil)
}

// simClusterWith lets a test change the simulator's options.
func simClusterWith(t *testing.T, nodes int, tune func(*pvesim.Options)) (*pvesim.Server, []string) {
	t.Helper()
	opts := pvesim.Options{
		Nodes:            pvesim.DefaultNodes(nodes),
		TaskDelay:        30 * time.Millisecond,
		BootDelay:        300 * time.Millisecond,
		AuthFailureDelay: -1,
		SandboxDir:       t.TempDir(),
	}
	if tune != nil {
		tune(&opts)
	}
	sim, err := pvesim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	secret := fmt.Sprintf("%x", rand.Uint64())
	if err := sim.AddToken(pvesim.Token{ID: "delegate@pve!e2e", Secret: secret, Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		if err := sim.AddTemplate(fmt.Sprintf("pve%d", i+1), 9000+i, "debian-job", pvesim.TemplateSpec{Tags: "template"}); err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	return sim, []string{
		"DELEGATE_BACKEND=proxmox", "PROXMOX_HOST=" + host, "PROXMOX_PORT=" + port,
		"PROXMOX_USER=delegate@pve", "PROXMOX_TOKEN_NAME=e2e", "PROXMOX_TOKEN_VALUE=" + secret,
		"PROXMOX_SSL_MODE=verify", "PROXMOX_FINGERPRINT=" + sim.Fingerprint(), "DEFAULT_VM_TEMPLATE=debian-job",
		"DEFAULT_MEMORY=512M", "DEFAULT_DISK=1G", "CLEANUP_INTERVAL_SECONDS=1",
	}
}

// jobVMs counts the simulator's VMs that are not templates.
func jobVMs(sim *pvesim.Server) []pvesim.VM {
	var out []pvesim.VM
	for _, v := range sim.VMs() {
		if !v.Template {
			out = append(out, v)
		}
	}
	return out
}

func noVMsLeft(t *testing.T, sim *pvesim.Server) {
	t.Helper()
	for range 200 {
		if len(jobVMs(sim)) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("VMs left behind: %+v", jobVMs(sim))
}

// TestProxmoxJobs: the same MCP conversation as on the local backend, with
// every job in its own VM of a simulated cluster.
func TestProxmoxJobs(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 2)
	cs, _, _ := stdioSession(t, t.TempDir(), "", env...)

	// Success, with a file larger than one 60 KiB file-write.
	big := make([]byte, 200_000)
	for i := range big {
		big[i] = byte(rand.IntN(256))
	}
	sum := sha256.Sum256(big)
	ok := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "statusMode": "streaming",
		"files":     []map[string]any{{"path": "data/big.bin", "content": base64.StdEncoding.EncodeToString(big)}},
		"artifacts": []string{"out/*"},
		"task": `sha256sum data/big.bin | cut -d' ' -f1; echo "hashing" > "$DELEGATE_STATUS_FILE"
			mkdir -p out; echo result > out/r.txt
			for i in 1 2 3; do echo "tick $i"; sleep 0.5; done`}})
	var followed strings.Builder
	cursor, sawRunning := "", false
	for range 300 {
		l := call[logsOut](t, cs, "get_job_logs", map[string]any{"job_id": ok.JobID, "cursor": cursor})
		followed.WriteString(l.Output)
		sawRunning = sawRunning || (l.Output != "" && l.Status == "running")
		cursor = l.NextCursor
		if l.Done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := hex.EncodeToString(sum[:]) + "\ntick 1\ntick 2\ntick 3\n"
	if followed.String() != want || !sawRunning {
		t.Fatalf("streamed %q (while running: %v), want %q", followed.String(), sawRunning, want)
	}
	res := call[struct {
		Status    string `json:"status"`
		Artifacts []struct {
			Name string `json:"name"`
		} `json:"artifacts"`
	}](t, cs, "get_job_result", map[string]any{"job_id": ok.JobID})
	if res.Status != "success" || len(res.Artifacts) != 1 || res.Artifacts[0].Name != "out/r.txt" {
		t.Fatalf("result %+v", res)
	}

	// Failure, timeout, cancel.
	fail := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo no >&2; exit 7"}})
	slow := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300", "timeout": 2}})
	cancel := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 300"}})
	waitFor(t, cs, cancel.JobID, "running")
	call[struct{}](t, cs, "cancel_job", map[string]any{"job_id": cancel.JobID})
	for id, want := range map[string]string{fail.JobID: "exit code 7", slow.JobID: "timed out after 2s", cancel.JobID: "cancelled by request"} {
		st := call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id, "timeout_seconds": 50})
		if !strings.Contains(st.Error, want) {
			t.Errorf("job %s: %+v, want %q", id, st, want)
		}
	}
	noVMsLeft(t, sim)

	// Every request the backend sent was one the real API accepts.
	schema := sim.Schema()
	for _, r := range sim.Requests() {
		if _, _, err := schema.Validate(r.Method, r.Path, r.Params); err != nil {
			t.Errorf("%s %s %v: %v", r.Method, r.Path, r.Params, err)
		}
	}
}

// TestProxmoxNoNetwork: a job that asks for no network gets a VM without
// a NIC, and still runs (everything goes through the guest agent).
func TestProxmoxNoNetwork(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 1)
	cs, _, _ := stdioSession(t, t.TempDir(), "", env...)
	sub := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "sleep 1; echo offline ok"}})
	waitFor(t, cs, sub.JobID, "running")
	vms := jobVMs(sim)
	if len(vms) != 1 {
		t.Fatalf("%d job VMs", len(vms))
	}
	for k := range vms[0].Config {
		if strings.HasPrefix(k, "net") {
			t.Fatalf("a job without network has %s=%s", k, vms[0].Config[k])
		}
	}
	if tags := vms[0].Config["tags"]; !strings.Contains(tags, "delegate") || !strings.Contains(tags, sub.JobID) {
		t.Fatalf("tags %q", tags)
	}
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": sub.JobID})
	if r := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": sub.JobID}); r.Output != "offline ok\n" {
		t.Fatalf("%+v", r)
	}
	noVMsLeft(t, sim)
}

// TestProxmoxFaults: with faults injected, every job still ends in a
// terminal state with a reason, and no VM is left behind.
func TestProxmoxFaults(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	cases := []struct {
		name   string
		faults pvesim.Faults
		want   string // in the failed job's error; "" means it may succeed
		slow   map[string]time.Duration
	}{
		{"slow clone and stop", pvesim.Faults{}, "", map[string]time.Duration{"qmclone": 2 * time.Second, "qmstop": time.Second}},
		{"clone task fails", pvesim.Faults{TaskFailures: map[string]string{"qmclone": "storage full"}}, "storage full", nil},
		{"start task fails", pvesim.Faults{TaskFailures: map[string]string{"qmstart": "kvm: failed"}}, "kvm: failed", nil},
		{"agent never up", pvesim.Faults{AgentDown: true}, "did not answer", nil},
		{"random API errors", pvesim.Faults{ErrorRate: 0.05}, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim, env := simClusterWith(t, 1, func(o *pvesim.Options) { o.TaskDelays = tc.slow })
			sim.SetFaults(tc.faults)
			env = append(env, "PROXMOX_AGENT_TIMEOUT=2")
			cs, _, _ := stdioSession(t, t.TempDir(), "", env...)
			var ids []string
			for range 2 {
				ids = append(ids, call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "echo hi"}}).JobID)
			}
			for _, id := range ids {
				var st statusOut
				for range 6 {
					if st = call[statusOut](t, cs, "wait_job", map[string]any{"job_id": id}); st.Status != "running" && st.Status != "pending" && st.Status != "provisioning" {
						break
					}
				}
				switch {
				case st.Status == "success" && tc.want == "":
				case st.Status == "failed" && st.Error != "" && strings.Contains(st.Error, tc.want):
				default:
					t.Errorf("job %s: %+v, want failed with %q", id, st, tc.want)
				}
			}
			sim.SetFaults(pvesim.Faults{}) // the cleanup must be able to work
			noVMsLeft(t, sim)
		})
	}
}

// TestProxmoxLifecycle: a persistent VM is kept and listed until
// release_job; after a SIGKILL of the server the next one re-attaches to
// the running job's VM; a tagged VM that belongs to no job is destroyed by
// the cleanup loop; an offline node is avoided.
func TestProxmoxLifecycle(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	sim, env := simCluster(t, 2)
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "", env...)

	keep := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo kept > state.txt", "lifecycle": "persistent"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": keep.JobID})
	time.Sleep(1500 * time.Millisecond) // a cleanup sweep or two
	if vms := jobVMs(sim); len(vms) != 1 || vms[0].Status != "running" {
		t.Fatalf("persistent VM: %+v", vms)
	}
	list := call[struct {
		Jobs []struct {
			JobID       string `json:"job_id"`
			SandboxKept bool   `json:"sandbox_kept"`
		} `json:"jobs"`
	}](t, cs, "list_jobs", map[string]any{})
	if len(list.Jobs) != 1 || !list.Jobs[0].SandboxKept {
		t.Fatalf("list: %+v", list)
	}
	rel := call[struct {
		Released bool `json:"released"`
	}](t, cs, "release_job", map[string]any{"job_id": keep.JobID})
	if !rel.Released || len(jobVMs(sim)) != 0 {
		t.Fatalf("release: %+v, VMs %+v", rel, jobVMs(sim))
	}
	if again := call[struct {
		Released bool `json:"released"`
	}](t, cs, "release_job", map[string]any{"job_id": keep.JobID}); again.Released {
		t.Fatal("released twice")
	}

	// Restart: the server dies while a job runs in its VM.
	long := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo before; sleep 3; echo after; exit 5"}})
	waitFor(t, cs, long.JobID, "running")
	killServer(t, cmd)
	// Meanwhile a VM of this server for a job nobody knows appears (a
	// leftover), and VMs that only look like delegate's: one of another
	// delegate server, one merely tagged.
	instance, err := os.ReadFile(filepath.Join(dataDir, "proxmox-instance"))
	if err != nil {
		t.Fatal(err)
	}
	ghost := cloneGhost(t, sim, "delegate-"+strings.TrimSpace(string(instance))+"-job-ghost", "delegate;delegate-"+strings.TrimSpace(string(instance))+";job-ghost")
	foreign := []int{
		cloneGhost(t, sim, "delegate-otherone-job-ghost", "delegate;delegate-otherone;job-ghost"),
		cloneGhost(t, sim, "ghost", "delegate;delegate-"+strings.TrimSpace(string(instance))+";job-ghost"),
	}

	cs2, _, _ := stdioSession(t, dataDir, "", env...)
	st := call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": long.JobID, "timeout_seconds": 50})
	res := call[resultOut](t, cs2, "get_job_result", map[string]any{"job_id": long.JobID})
	if st.Status != "failed" || res.ExitCode == nil || *res.ExitCode != 5 || res.Output != "before\nafter\n" {
		t.Fatalf("re-attached job: %+v %q", res, res.Output)
	}
	// With pve1 offline, a new job lands on pve2.
	sim.SetNodeOnline("pve1", false)
	other := call[submitOut](t, cs2, "submit_job", map[string]any{"manifest": map[string]any{"agentType": "script", "task": "sleep 1; echo moved"}})
	waitFor(t, cs2, other.JobID, "running")
	placed := false
	for _, v := range jobVMs(sim) {
		if strings.Contains(v.Config["tags"], other.JobID) {
			placed = true
			if v.Node != "pve2" {
				t.Errorf("VM %d placed on %s while pve1 is offline", v.VMID, v.Node)
			}
		}
	}
	if !placed {
		t.Errorf("no VM for job %s among %+v", other.JobID, jobVMs(sim))
	}
	if st := call[statusOut](t, cs2, "wait_job", map[string]any{"job_id": other.JobID}); st.Status != "success" {
		t.Fatalf("job on pve2: %+v", st)
	}
	sim.SetNodeOnline("pve1", true)
	// The ghost is gone, the VMs that are not this server's are not.
	for range 200 {
		if _, ok := sim.VM(ghost); !ok {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := sim.VM(ghost); ok {
		t.Fatalf("ghost VM %d left behind", ghost)
	}
	for _, vmid := range foreign {
		if _, ok := sim.VM(vmid); !ok {
			t.Errorf("VM %d, not this server's, was destroyed", vmid)
		}
	}
}

// cloneGhost makes a running VM with this name and tags, through the
// simulator's API as a stray process would, and returns its vmid.
func cloneGhost(t *testing.T, sim *pvesim.Server, name, tags string) int {
	t.Helper()
	c := simClient(t, sim)
	ctx := testContext(t)
	vmid, err := c.NextID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	upid, err := c.CloneVM(ctx, "pve2", 9001, pve.CloneOptions{NewID: vmid, Name: name})
	if err == nil {
		err = c.WaitTask(ctx, "pve2", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	upid, err = c.SetVMConfigAsync(ctx, "pve2", vmid, pve.VMConfigUpdate{Tags: strings.Split(tags, ";")})
	if err == nil {
		err = c.WaitTask(ctx, "pve2", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	return vmid
}

func simClient(t *testing.T, sim *pvesim.Server) *pve.Client {
	t.Helper()
	secret := "ghost-secret"
	if err := sim.AddToken(pvesim.Token{ID: "ghost@pve!stray", Secret: secret, Privileges: pvesim.RoleAdministrator}); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: "ghost@pve", TokenName: "stray", TokenValue: secret,
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
