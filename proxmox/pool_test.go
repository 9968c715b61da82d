package proxmox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
)

// poolCfg is a pool of the test servers' default job shape.
func poolCfg(size int) proxmox.PoolConfig {
	return proxmox.PoolConfig{Size: size, CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, CheckInterval: 200 * time.Millisecond}
}

func keepPool(t *testing.T, s *server, cfg proxmox.PoolConfig) func() {
	t.Helper()
	stop, err := s.backend.KeepPool(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return stop
}

// poolCount is how many of the backend's pool VMs are in a state.
func poolCount(b *proxmox.Backend, state string) int {
	for _, c := range b.PoolVMs() {
		if c.State == state {
			return c.Count
		}
	}
	return 0
}

// waitReady waits until the pool has n ready VMs and no others.
func waitReady(t *testing.T, b *proxmox.Backend, n int) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("the pool at %d ready VMs", n), func() bool {
		return poolCount(b, "ready") == n && poolCount(b, "starting") == 0 && poolCount(b, "retiring") == 0 && poolCount(b, "claiming") == 0
	})
}

// poolVMs lists the simulator's pool VMs (by their name).
func poolVMs(sim *pvesim.Server) []pvesim.VM {
	var out []pvesim.VM
	for _, v := range sim.VMs() {
		if strings.Contains(v.Config["name"], "-pool-") {
			out = append(out, v)
		}
	}
	return out
}

var (
	configRe = regexp.MustCompile(`^/nodes/[^/]+/qemu/(\d+)/config$`)
	vmRe     = regexp.MustCompile(`^/nodes/[^/]+/qemu/(\d+)$`)
)

// oneJobPerVM checks, in the simulator's request log, that no VM was
// given to two jobs: between two successful renames of a vmid to a
// job's name, the vmid was deleted (it is another VM then).
func oneJobPerVM(t *testing.T, sim *pvesim.Server) (claims int) {
	t.Helper()
	named := map[int]string{} // vmid -> the job name it carries
	for _, r := range sim.Requests() {
		if r.Status != 200 {
			continue
		}
		if m := vmRe.FindStringSubmatch(r.Path); m != nil && r.Method == "DELETE" {
			n, _ := strconv.Atoi(m[1])
			delete(named, n)
			continue
		}
		m := configRe.FindStringSubmatch(r.Path)
		if m == nil || r.Method != "PUT" || !strings.Contains(fmt.Sprint(r.Params["name"]), "-job-") {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		name := fmt.Sprint(r.Params["name"])
		if prev, ok := named[n]; ok && prev != name {
			t.Errorf("VM %d was given to %s and then to %s", n, prev, name)
		}
		named[n] = name
		if r.Params["digest"] != nil {
			claims++
		}
	}
	return claims
}

func jobSteps(s *server, id string) string { return strings.Join(s.store.steps(id), " | ") }

// TestPoolWarmJob: with a pool of 2, a job takes a ready VM (no clone,
// no boot), runs, and its VM is destroyed; the pool refills; a job that
// asks for network or another size starts cold.
func TestPoolWarmJob(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{})
	keepPool(t, s, poolCfg(2))
	waitReady(t, s.backend, 2)
	before := poolVMs(sim)
	for _, v := range before {
		if v.Status != "running" || v.Config["net0"] != "" || v.Config["memory"] != "256" || v.Config["cores"] != "1" ||
			!strings.Contains(v.Config["tags"], "delegate-ready") {
			t.Fatalf("pool VM %d: %s %v", v.VMID, v.Status, v.Config)
		}
	}
	j := s.submit(t, "echo warm", "", 0)
	got := s.wait(t, j.ID)
	if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "warm\n" {
		t.Fatalf("%s %s %q", got.Status, got.Error, s.output(t, j.ID))
	}
	steps := jobSteps(s, j.ID)
	if !strings.Contains(steps, "taking warm VM") || strings.Contains(steps, "cloning") || strings.Contains(steps, "starting VM") {
		t.Fatalf("steps: %s", steps)
	}
	num, _, _ := strings.Cut(strings.TrimPrefix(got.SandboxID, "vm-"), "-")
	if !slices.ContainsFunc(before, func(v pvesim.VM) bool { return strconv.Itoa(v.VMID) == num }) {
		t.Fatalf("job ran in %s, the pool was %+v", got.SandboxID, before)
	}
	// The pool refills, and the job's VM is destroyed.
	waitReady(t, s.backend, 2)
	testkit.Eventually(t, 10*time.Second, "the job's VM destroyed", func() bool {
		_, ok := sim.VM(mustAtoi(num))
		return !ok || len(poolVMs(sim)) != 2
	})
	if v, ok := sim.VM(mustAtoi(num)); ok && !strings.Contains(v.Config["name"], "-pool-") {
		t.Fatalf("the job's VM %s is still there: %+v", num, v)
	}
	// Two VMs made, one refill: no more (a pool never overshoots).
	time.Sleep(300 * time.Millisecond)
	if n := poolClones(sim); n != 3 {
		t.Errorf("%d pool VMs made, want 3", n)
	}

	// Neither a job with network nor one of another size takes a pool VM.
	for _, m := range []delegate.Manifest{
		{AgentType: delegate.AgentScript, Task: "echo net", Network: delegate.Egress()},
		{AgentType: delegate.AgentScript, Task: "echo big", Resources: &delegate.Resources{Memory: "512M"}},
	} {
		j, err := s.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess || !strings.Contains(jobSteps(s, j.ID), "cloning from debian-job") {
			t.Errorf("%s: %s %s, steps %s", m.Task, got.Status, got.Error, jobSteps(s, j.ID))
		}
	}
	if n := oneJobPerVM(t, sim); n != 1 {
		t.Errorf("%d claims, want 1", n)
	}
}

// poolClones counts the clone calls that made pool VMs.
func poolClones(sim *pvesim.Server) int {
	n := 0
	for _, r := range sim.Requests() {
		if strings.HasSuffix(r.Path, "/clone") && r.Status == 200 && strings.Contains(fmt.Sprint(r.Params["name"]), "-pool-") {
			n++
		}
	}
	return n
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestPoolConcurrentClaims: 12 jobs at once on a pool of 4, with the
// cleanup sweep several times a second: all succeed, 4 of them warm (an
// empty pool means a cold start), no VM serves two jobs, and the sweep
// never takes a pool VM.
func TestPoolConcurrentClaims(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(2), nil)
	c, token := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	s := newServer(t, c, proxmox.Config{}, engine.Config{MaxConcurrent: 12, CleanupInterval: 100 * time.Millisecond})
	keepPool(t, s, poolCfg(4))
	waitReady(t, s.backend, 4)
	// The sweep runs a few times over the idle pool first.
	listedAgain(t, sim, token, 3)
	if len(poolVMs(sim)) != 4 {
		t.Fatalf("pool VMs: %+v", poolVMs(sim))
	}
	var jobs []*delegate.Job
	for i := range 12 {
		jobs = append(jobs, s.submit(t, fmt.Sprintf("sleep 0.3; echo job %d", i), "", 0))
	}
	warm := 0
	var done []*delegate.Job
	for i, j := range jobs {
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != fmt.Sprintf("job %d\n", i) {
			t.Errorf("job %d: %s %s %q", i, got.Status, got.Error, s.output(t, j.ID))
		}
		if strings.Contains(jobSteps(s, j.ID), "taking warm VM") {
			warm++
		}
		done = append(done, got)
	}
	if warm < 4 {
		t.Errorf("%d warm jobs, want at least 4", warm)
	}
	if n := oneJobPerVM(t, sim); n != warm {
		t.Errorf("%d claims for %d warm jobs", n, warm)
	}
	waitReady(t, s.backend, 4)
	testkit.Eventually(t, 10*time.Second, "only the templates and the pool left", func() bool { return len(sim.VMs()) == 2+4 })
	// Every VM deleted was a job's: the sweep took no pool VM.
	jobVMs := sandboxVMs(t, done)
	for vmid := range deletes(sim, token) {
		if jobVMs[vmid] == 0 {
			t.Errorf("VM %d was deleted, and was no job's", vmid)
		}
	}
	infos, err := s.backend.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 0 {
		t.Errorf("List shows %+v (pool VMs must not be listed)", infos)
	}
}

// TestPoolTwoServersOneDataDir: two servers of one instance (one data
// dir: the same instance id, lock file and job store); one keeps the
// pool, both take VMs from it, and no VM serves two jobs.
func TestPoolTwoServersOneDataDir(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	ca, tokenA := client(t, sim, "a@pve", pvesim.RoleAdministrator)
	cb, tokenB := client(t, sim, "b@pve", pvesim.RoleAdministrator)
	dir := t.TempDir()
	db := filepath.Join(dir, "jobs.db")
	// Both engines live in this process: each must take the other's
	// jobs for a live server's, as it does another process's.
	alive := func(string) bool { return true }
	a := newServerAt(t, ca, proxmox.Config{Instance: "same1234"}, engine.Config{MaxConcurrent: 8, OwnerAlive: alive}, db)
	var bLog logBuffer
	b := newServerAt(t, cb, proxmox.Config{Instance: "same1234", Logger: bLog.logger()}, engine.Config{MaxConcurrent: 8, OwnerAlive: alive}, db)
	cfg := poolCfg(4)
	cfg.LockFile = filepath.Join(dir, "proxmox-pool.lock")
	keepPool(t, a, cfg)
	waitReady(t, a.backend, 4)
	keepPool(t, b, cfg) // b finds the lock taken, and says so
	testkit.Eventually(t, 10*time.Second, "b finding the pool's lock taken", func() bool {
		return strings.Contains(bLog.String(), "another process keeps the warm pool")
	})
	if b.backend.PoolVMs() != nil {
		t.Fatalf("the second server keeps a pool too: %+v", b.backend.PoolVMs())
	}
	var jobs []*delegate.Job
	var owners []*server
	for i := range 6 {
		for _, s := range []*server{b, a} {
			jobs = append(jobs, s.submit(t, fmt.Sprintf("echo %d", i), "", 0))
			owners = append(owners, s)
		}
	}
	warmB := 0
	for i, j := range jobs {
		s := owners[i]
		got := s.wait(t, j.ID)
		if got.Status != delegate.StatusSuccess {
			t.Errorf("job %d: %s %s", i, got.Status, got.Error)
		}
		if s == b && strings.Contains(jobSteps(s, j.ID), "taking warm VM") {
			warmB++
		}
	}
	if warmB == 0 {
		t.Error("the server that does not keep the pool took no VM from it")
	}
	oneJobPerVM(t, sim)
	// Only the keeper made pool VMs.
	for _, r := range sim.Requests() {
		if strings.HasSuffix(r.Path, "/clone") && r.Status == 200 && strings.Contains(fmt.Sprint(r.Params["name"]), "-pool-") && r.TokenID != tokenA {
			t.Errorf("a pool VM made by %s (keeper %s, other %s)", r.TokenID, tokenA, tokenB)
		}
	}
	waitReady(t, a.backend, 4)
}

// TestPoolRestart: a restarted server adopts the pool it finds (no new
// clones), a smaller size shrinks it, VMs of another shape are replaced,
// and size 0 destroys it.
func TestPoolRestart(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	pcfg := proxmox.Config{Instance: "rest1234"}
	first := newServer(t, c, pcfg, engine.Config{})
	stop := keepPool(t, first, poolCfg(3))
	waitReady(t, first.backend, 3)
	stop()
	first.eng.Close()
	clones := func() int {
		n := 0
		for _, task := range sim.Tasks() {
			if task.Type == "qmclone" {
				n++
			}
		}
		return n
	}
	made := clones()
	vmids := func() []int {
		var out []int
		for _, v := range poolVMs(sim) {
			out = append(out, v.VMID)
		}
		slices.Sort(out)
		return out
	}
	was := vmids()

	// A restart with a smaller pool adopts two and destroys one.
	second := newServer(t, c, pcfg, engine.Config{})
	stop = keepPool(t, second, poolCfg(2))
	waitReady(t, second.backend, 2)
	testkit.Eventually(t, 10*time.Second, "a pool of 2", func() bool { return len(poolVMs(sim)) == 2 })
	now := vmids()
	if len(now) != 2 || clones() != made || len(slices.DeleteFunc(slices.Clone(now), func(n int) bool { return slices.Contains(was, n) })) != 0 {
		t.Fatalf("pool %v after a restart with size 2 (was %v; %d clones, %d before)", now, was, clones(), made)
	}
	j := second.submit(t, "echo adopted", "", 0)
	if got := second.wait(t, j.ID); got.Status != delegate.StatusSuccess || !strings.Contains(jobSteps(second, j.ID), "taking warm VM") {
		t.Fatalf("%s %s: %s", got.Status, got.Error, jobSteps(second, j.ID))
	}
	waitReady(t, second.backend, 2)
	stop()
	second.eng.Close()

	// Another shape: the pool's VMs are replaced.
	third := newServer(t, c, pcfg, engine.Config{})
	cfg := poolCfg(2)
	cfg.MemoryBytes = 512 << 20
	stop = keepPool(t, third, cfg)
	waitReady(t, third.backend, 2)
	testkit.Eventually(t, 10*time.Second, "a pool of the new shape", func() bool {
		vs := poolVMs(sim)
		return len(vs) == 2 && vs[0].Config["memory"] == "512" && vs[1].Config["memory"] == "512"
	})
	for _, v := range poolVMs(sim) {
		if v.Config["memory"] != "512" {
			t.Fatalf("pool VM %d of the old shape: %v", v.VMID, v.Config)
		}
	}
	stop()
	third.eng.Close()

	// Size 0: the pool is destroyed.
	fourth := newServer(t, c, pcfg, engine.Config{})
	keepPool(t, fourth, poolCfg(0))
	noJobVMs(t, sim)
}

// TestPoolGivesWay: idle pool VMs fill a node; a job of another size
// that does not fit gets room from one of them (destroyed before the
// job's VM starts), and the pool does not take the room back while it runs.
func TestPoolGivesWay(t *testing.T) {
	t.Parallel()
	t.Run("to the keeper's job", func(t *testing.T) { givesWay(t, false) })
	// A server of the same data dir that does not keep the pool finds
	// its idle VMs in the cluster's listing.
	t.Run("to another server's job", func(t *testing.T) { givesWay(t, true) })
}

func givesWay(t *testing.T, other bool) {
	sim := newSim(t, pvesim.DefaultNodes(1), nil)
	c, _ := client(t, sim, "delegate@pve", pvesim.RoleAdministrator)
	dir := t.TempDir()
	alive := func(string) bool { return true }
	pcfg := proxmox.Config{Instance: "give1234", NodeMemory: map[string]int64{"": 4 << 30}}
	keeper := newServerAt(t, c, pcfg, engine.Config{OwnerAlive: alive}, filepath.Join(dir, "jobs.db"))
	cfg := poolCfg(2)
	cfg.MemoryBytes = 2 << 30
	cfg.LockFile = filepath.Join(dir, "proxmox-pool.lock")
	keepPool(t, keeper, cfg)
	waitReady(t, keeper.backend, 2)
	s := keeper
	if other {
		s = newServerAt(t, c, pcfg, engine.Config{OwnerAlive: alive}, filepath.Join(dir, "jobs.db"))
		keepPool(t, s, cfg)
	}
	type seen struct{ mem, poolWithJob int }
	stop := make(chan struct{})
	peak := make(chan seen)
	go func() {
		var most seen
		for {
			mem, pooled, job := 0, 0, false
			for _, v := range sim.VMs() {
				if v.Template {
					continue
				}
				if strings.Contains(v.Config["name"], "-pool-") {
					pooled++
				} else if v.Status == "running" {
					job = true
				}
				if v.Status == "running" {
					m, _ := strconv.Atoi(v.Config["memory"])
					mem += m
				}
			}
			most.mem = max(most.mem, mem)
			if job {
				most.poolWithJob = max(most.poolWithJob, pooled)
			}
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	j := s.submit(t, "sleep 1; echo made room", "1G", 0)
	got := s.wait(t, j.ID)
	close(stop)
	if got.Status != delegate.StatusSuccess || s.output(t, j.ID) != "made room\n" {
		t.Fatalf("%s %s: %s", got.Status, got.Error, jobSteps(s, j.ID))
	}
	most := <-peak
	if most.mem > 4096 {
		t.Errorf("%d MiB ran at once on a node with 4096 for VMs", most.mem)
	}
	// One pool VM gave way; the other stayed, and no new one took the
	// room while the job ran.
	if most.poolWithJob != 1 {
		t.Errorf("%d pool VMs beside the job, want 1", most.poolWithJob)
	}
	// Once the job is gone, the pool takes the room back.
	waitReady(t, keeper.backend, 2)
}
