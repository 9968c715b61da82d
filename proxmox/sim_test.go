package proxmox_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/internal/testkit/testsim"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sqlite"
)

// These tests run jobs through the engine and the backend against the
// Proxmox simulator, whose guests are local sandboxes of this binary.
func TestMain(m *testing.M) {
	if local.Reexec() {
		return
	}
	os.Exit(m.Run())
}

// simOpts is a fast simulated cluster with a template on each node.
func newSim(t *testing.T, nodes []pvesim.NodeSpec, tune func(*pvesim.Options)) *pvesim.Server {
	t.Helper()
	sim := testsim.Start(t, nodes, tune)
	for i, n := range nodes {
		if err := sim.AddTemplate(n.Name, 9000+i, "debian-job", pvesim.TemplateSpec{Tags: "delegate;template"}); err != nil {
			t.Fatal(err)
		}
	}
	return sim
}

// client returns a client of the simulator with an API token of these
// privileges, and the token's id.
func client(t testing.TB, sim *pvesim.Server, user string, privs []string) (*pve.Client, string) {
	t.Helper()
	secret := fmt.Sprintf("%x", rand.Uint64())
	id := user + "!tk"
	if err := sim.AddToken(pvesim.Token{ID: id, Secret: secret, Privileges: privs}); err != nil {
		t.Fatal(err)
	}
	return clientFor(t, sim, user, "tk", secret), id
}

func clientFor(t testing.TB, sim *pvesim.Server, user, token, secret string) *pve.Client {
	t.Helper()
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: user, TokenName: token, TokenValue: secret,
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), TaskPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// server is one delegate server: a backend, a store and an engine.
type server struct {
	backend *proxmox.Backend
	store   *recorder
	eng     *engine.Engine
}

func newServer(t *testing.T, c *pve.Client, pcfg proxmox.Config, ecfg engine.Config) *server {
	t.Helper()
	return newServerAt(t, c, pcfg, ecfg, filepath.Join(t.TempDir(), "jobs.db"))
}

// newServerAt is newServer with the job store at a given path (two
// servers of one data dir share it).
func newServerAt(t *testing.T, c *pve.Client, pcfg proxmox.Config, ecfg engine.Config, db string) *server {
	t.Helper()
	if pcfg.Template == "" {
		pcfg.Template = "debian-job"
	}
	if pcfg.PollInterval == 0 {
		pcfg.PollInterval = 50 * time.Millisecond
	}
	if os.Getenv("SIM_TEST_LOG") != "" {
		pcfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("server", pcfg.Instance)
	}
	b, err := proxmox.New(c, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := &recorder{Store: st, progress: map[string][]string{}}
	if ecfg.PollInterval == 0 {
		ecfg.PollInterval = 50 * time.Millisecond
	}
	if ecfg.CleanupInterval == 0 {
		ecfg.CleanupInterval = 200 * time.Millisecond
	}
	if ecfg.AdmissionRetry == 0 {
		ecfg.AdmissionRetry = 200 * time.Millisecond
	}
	ecfg.Defaults = delegate.Defaults{Timeout: 120, CPU: 1, Memory: "256M", Disk: "1G"}
	ecfg.ArtifactDir = t.TempDir()
	if os.Getenv("SIM_TEST_LOG") != "" {
		ecfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	eng := engine.New(rec, b, ecfg)
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return &server{backend: b, store: rec, eng: eng}
}

// recorder is a store that remembers every progress a job went through.
type recorder struct {
	delegate.Store
	mu       sync.Mutex
	progress map[string][]string
}

func (r *recorder) UpdateJob(ctx context.Context, id string, fn func(*delegate.Job) error) (*delegate.Job, error) {
	j, err := r.Store.UpdateJob(ctx, id, fn)
	if err == nil {
		r.mu.Lock()
		if p := r.progress[id]; len(p) == 0 || p[len(p)-1] != j.Progress {
			r.progress[id] = append(p, j.Progress)
		}
		r.mu.Unlock()
	}
	return j, err
}

func (r *recorder) steps(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.progress[id])
}

func (s *server) submit(t *testing.T, task, memory string, timeout int) *delegate.Job {
	t.Helper()
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: task}
	if timeout != 0 { // 0: the default
		m.Timeout = new(timeout)
	}
	if memory != "" {
		m.Resources = &delegate.Resources{Memory: memory}
	}
	j, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (s *server) wait(t *testing.T, id string) *delegate.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	j, err := s.eng.Wait(ctx, id)
	if err != nil || !j.Status.Terminal() {
		t.Fatalf("job %s: %+v %v", id, j, err)
	}
	return j
}

func (s *server) output(t *testing.T, id string) string {
	b, err := s.store.ReadOutput(context.Background(), id, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return string(delegate.JoinOutput(b))
}

func noJobVMs(t *testing.T, sim *pvesim.Server) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "no VM but the templates left", func() bool {
		return !slices.ContainsFunc(sim.VMs(), func(v pvesim.VM) bool { return !v.Template })
	})
}

var deleteRe = regexp.MustCompile(`^/nodes/[^/]+/qemu/(\d+)$`)

// deletes counts the successful DELETEs of each vmid a token sent.
func deletes(sim *pvesim.Server, token string) map[int]int {
	out := map[int]int{}
	for _, r := range sim.Requests() {
		if m := deleteRe.FindStringSubmatch(r.Path); m != nil && r.Method == "DELETE" && r.Status == 200 && r.TokenID == token {
			n, _ := strconv.Atoi(m[1])
			out[n]++
		}
	}
	return out
}

// sandboxVMs counts the vmids of the jobs' sandboxes.
func sandboxVMs(t *testing.T, jobs []*delegate.Job) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, j := range jobs {
		num, _, _ := strings.Cut(strings.TrimPrefix(j.SandboxID, "vm-"), "-")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("job %s: sandbox %q", j.ID, j.SandboxID)
		}
		out[n]++
	}
	return out
}

func sameCounts(a, b map[int]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestConcurrentJobs: 8 jobs submitted at once all succeed (their vmids
// do not collide), and each VM is deleted once, by its own job.
func TestConcurrentJobs(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(2), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{MaxConcurrent: 8})
	var jobs []*delegate.Job
	for i := range 8 {
		jobs = append(jobs, s.submit(t, fmt.Sprintf("echo job %d", i), "", 0))
	}
	var done []*delegate.Job
	for i, j := range jobs {
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != fmt.Sprintf("job %d\n", i) {
			t.Errorf("job %d: %s %s %q", i, got.Status, got.Error, s.output(t, j.ID))
		}
		done = append(done, got)
	}
	noJobVMs(t, sim)
	if got, want := deletes(sim, token), sandboxVMs(t, done); !sameCounts(got, want) {
		t.Fatalf("deleted %v, the jobs' VMs were %v", got, want)
	}
}

// TestTwoInstances: two delegate servers share a cluster, each sweeping
// for orphans several times a second while the other provisions; all
// their jobs succeed, and each deletes only its own VMs.
func TestTwoInstances(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), func(o *pvesim.Options) {
		o.TaskDelays = map[string]time.Duration{"qmclone": 300 * time.Millisecond}
		// Requests that take a while leave room between nextid and the
		// clone task that writes the new config: the servers collide.
		o.RequestLatency = pvesim.Span{Min: 5 * time.Millisecond, Max: 40 * time.Millisecond}
	})
	ca, tokenA := client(t, sim, "a@pve", pvesim.RoleAdministrator)
	cb, tokenB := client(t, sim, "b@pve", pvesim.RoleAdministrator)
	a := newServer(t, ca, proxmox.Config{Instance: "aaaa1111"}, engine.Config{MaxConcurrent: 4, CleanupInterval: 100 * time.Millisecond})
	b := newServer(t, cb, proxmox.Config{Instance: "bbbb2222"}, engine.Config{MaxConcurrent: 4, CleanupInterval: 100 * time.Millisecond})
	var ja, jb []*delegate.Job
	for i := range 4 {
		ja = append(ja, a.submit(t, fmt.Sprintf("sleep 0.5; echo a%d", i), "", 0))
		jb = append(jb, b.submit(t, fmt.Sprintf("sleep 0.5; echo b%d", i), "", 0))
	}
	check := func(s *server, jobs []*delegate.Job, token, name string) {
		var done []*delegate.Job
		for i, j := range jobs {
			got := s.wait(t, j.ID)
			if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != fmt.Sprintf("%s%d\n", name, i) {
				t.Errorf("%s job %d: %s %s", name, i, got.Status, got.Error)
			}
			done = append(done, got)
		}
		noJobVMs(t, sim)
		if got, want := deletes(sim, token), sandboxVMs(t, done); !sameCounts(got, want) {
			t.Errorf("server %s deleted %v, its jobs' VMs were %v", name, got, want)
		}
	}
	check(a, ja, tokenA, "a")
	check(b, jb, tokenB, "b")
	// How often the servers collided on a vmid (by chance: this is the
	// case the test is for, not something it can force).
	collisions := 0
	for _, task := range sim.Tasks() {
		if task.Type == "qmclone" && (strings.Contains(task.ExitStatus, "already exists") || strings.Contains(task.ExitStatus, "got timeout")) {
			collisions++
		}
	}
	for _, r := range sim.Requests() {
		if r.Method == "POST" && strings.HasSuffix(r.Path, "/clone") && strings.Contains(r.Reason, "already exists") {
			collisions++
		}
	}
	t.Logf("%d clones collided on their vmid", collisions)
}

// TestCapacityQueue: 4 jobs of 2G on one 6G node (room for two beside
// the host's share) all succeed: the others wait as pending, saying why,
// and never more than two VMs run at once.
func TestCapacityQueue(t *testing.T) {
	t.Parallel()
	sim := newSim(t, []pvesim.NodeSpec{{Name: "pve1", CPUs: 8, MemoryBytes: 6 << 30}}, nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{MaxConcurrent: 4})
	stop := make(chan struct{})
	peak := make(chan int)
	go func() {
		most := 0
		for {
			n := 0
			for _, v := range sim.VMs() {
				if !v.Template && v.Status == "running" {
					n++
				}
			}
			most = max(most, n)
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	var jobs []*delegate.Job
	for i := range 4 {
		jobs = append(jobs, s.submit(t, fmt.Sprintf("sleep 1; echo %d", i), "2G", 0))
	}
	waited := false
	for _, j := range jobs {
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess {
			t.Errorf("job %s: %s %s", j.ID, got.Status, got.Error)
		}
		for _, p := range s.store.steps(j.ID) {
			if strings.HasPrefix(p, "waiting for capacity: no node has 2048 MiB free") {
				waited = true
			}
		}
	}
	close(stop)
	if most := <-peak; most > 2 || most == 0 {
		t.Errorf("%d VMs ran at once on a node with room for 2", most)
	}
	if !waited {
		t.Error("no job waited for capacity")
	}
	noJobVMs(t, sim)
}

// TestNodeMemorySetting: PROXMOX_NODE_MEMORY is what VMs may use on a
// node, whatever Proxmox reports: 3G on a 32G node runs 2G jobs one by one.
func TestNodeMemorySetting(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{NodeMemory: map[string]int64{"": 3 << 30}}, engine.Config{MaxConcurrent: 4})
	first := s.submit(t, "sleep 1", "2G", 0)
	second := s.submit(t, "true", "2G", 0)
	a, b := s.wait(t, first.ID), s.wait(t, second.ID)
	if a.Status != delegate.StatusSuccess || b.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s; %s %s", a.Status, a.Error, b.Status, b.Error)
	}
	if a.StartedAt.After(b.StartedAt) {
		a, b = b, a
	}
	if b.StartedAt.Before(a.FinishedAt) {
		t.Errorf("the jobs ran together: %s-%s and %s-%s", a.StartedAt, a.FinishedAt, b.StartedAt, b.FinishedAt)
	}
	if !slices.ContainsFunc(s.store.steps(b.ID), func(p string) bool { return strings.Contains(p, "pve1 1024 of 3072 MiB") }) {
		t.Errorf("the second job did not wait for capacity: %q", s.store.steps(b.ID))
	}
}

// TestProvisioningSteps: a cold start names each step, and the VM is
// configured with one socket and no balloon.
func TestProvisioningSteps(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, "sleep 0.5", "", 0)
	var cfg map[string]string
	testkit.Eventually(t, 10*time.Second, "the job's VM running", func() bool {
		for _, v := range sim.VMs() {
			if !v.Template && v.Status == "running" {
				cfg = v.Config
			}
		}
		return cfg != nil
	})
	if cfg["sockets"] != "1" || cfg["balloon"] != "0" || cfg["memory"] != "256" {
		t.Errorf("config %v", cfg)
	}
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusSuccess {
		t.Fatalf("%s %s", got.Status, got.Error)
	}
	num, _, _ := strings.Cut(strings.TrimPrefix(got.SandboxID, "vm-"), "-")
	want := []string{"provisioning sandbox", "cloning from debian-job on pve1", "starting VM " + num, "waiting for the guest agent", "writing files", "running", "success"}
	if steps := s.store.steps(j.ID); !slices.Equal(steps, want) {
		t.Fatalf("steps %q, want %q", steps, want)
	}
}

// TestTimeoutFromRunning: a job's timeout counts from when it runs, not
// from its submission: slow provisioning takes none of it.
func TestTimeoutFromRunning(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), func(o *pvesim.Options) {
		o.TaskDelays = map[string]time.Duration{"qmclone": 2 * time.Second}
		o.BootDelay = 1500 * time.Millisecond
	})
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	j := s.submit(t, "sleep 300", "", 3)
	got := s.wait(t, j.ID)
	ran, queued := got.FinishedAt.Sub(got.StartedAt), got.StartedAt.Sub(got.CreatedAt)
	if got.Status != delegate.StatusTimeout || ran < 3*time.Second || ran > 10*time.Second || queued < 3*time.Second {
		t.Fatalf("%s %q: provisioned in %s, ran %s", got.Status, got.Error, queued, ran)
	}
	noJobVMs(t, sim)
}

// TestKeptSandboxOnSimulator: a kept sandbox is one VM that outlives its
// commands and the orphan sweeps (several a second here), keeps its
// files between commands, and is deleted when released.
func TestKeptSandboxOnSimulator(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	ctx := context.Background()
	sb, err := s.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(task string) *delegate.Job {
		t.Helper()
		j, err := s.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: task, Sandbox: sb.ID}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.wait(t, j.ID)
	}
	if j := run("echo kept > note.txt"); j.Status != delegate.StatusSuccess {
		t.Fatalf("first command: %s %s", j.Status, j.Error)
	}
	listedAgain(t, sim, token, 3) // three sweeps
	j := run("cat note.txt")
	if j.Status != delegate.StatusSuccess || s.output(t, j.ID) != "kept\n" {
		t.Fatalf("second command: %s %s %q", j.Status, j.Error, s.output(t, j.ID))
	}
	// The command's end is recorded first, its sandbox's right after.
	var got *delegate.Sandbox
	testkit.Eventually(t, 10*time.Second, "the sandbox idle", func() bool {
		got, err = s.eng.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == delegate.SandboxIdle
	})
	if err != nil || got.State != delegate.SandboxIdle || got.Commands != 2 {
		t.Fatalf("after two commands: %+v %v", got, err)
	}
	vmid, _, _ := strings.Cut(strings.TrimPrefix(got.Instance, "vm-"), "-")
	if _, ok := sim.VM(atoiT(t, vmid)); !ok {
		t.Fatalf("the kept VM %s is gone", got.Instance)
	}
	if _, released, err := s.eng.ReleaseSandbox(ctx, sb.ID); err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	noJobVMs(t, sim)
	if d := deletes(sim, token); d[atoiT(t, vmid)] != 1 {
		t.Errorf("deletes of the kept VM %s: %v", vmid, d)
	}
}

func atoiT(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// listedAgain waits until token has listed the cluster's VMs n more times
// (the engine's orphan sweep lists them, and a pool's sync): time passing,
// counted in what the server did rather than guessed.
func listedAgain(t *testing.T, sim *pvesim.Server, token string, n int) {
	t.Helper()
	count := func() int {
		c := 0
		for _, r := range sim.Requests() {
			if r.Path == "/cluster/resources" && r.TokenID == token {
				c++
			}
		}
		return c
	}
	want := count() + n
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d more listings of the cluster", n), func() bool { return count() >= want })
}
