package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sqlite"
)

// Proxmox measures Proxmox jobs through the engine and the Proxmox
// backend against the simulator at a real cluster's timings
// (pvesim.RealLatency: requests 10-50 ms, agent calls 25 ms, clone 2 s,
// start 1 s, boot and agent 12 s, stop 2 s), every one divided by scale:
// n cold jobs (a clone each), then n warm ones (a VM of a pool of two,
// which is refilled between jobs), each for an echo job and a one-second
// job. It prints the medians of submit -> running, submit -> done and
// the Proxmox API calls of each job, from its submission until its VM is
// destroyed.
func Proxmox(ctx context.Context, n int, scale float64, stdout io.Writer, log *slog.Logger) error {
	div := func(d time.Duration) time.Duration { return time.Duration(float64(d) / scale) }
	dir, err := os.MkdirTemp("", "delegate-bench-pve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	real := pvesim.RealLatency()
	delays := map[string]time.Duration{}
	for k, v := range real.TaskDelays {
		delays[k] = div(v)
	}
	sim, err := pvesim.New(pvesim.Options{
		Nodes:            pvesim.DefaultNodes(1),
		TaskDelay:        div(real.TaskDelay),
		TaskDelays:       delays,
		BootDelay:        div(real.BootDelay),
		RequestLatency:   pvesim.Span{Min: div(real.RequestLatency.Min), Max: div(real.RequestLatency.Max)},
		AgentLatency:     div(real.AgentLatency),
		AgentPingTimeout: div(real.AgentPingTimeout),
		StatsInterval:    div(real.StatsInterval),
		AuthFailureDelay: -1,
		SandboxDir:       dir + "/guests",
	})
	if err != nil {
		return err
	}
	if err := sim.Start(ctx); err != nil {
		return err
	}
	defer sim.Close()
	secret := make([]byte, 16)
	rand.Read(secret)
	if err := sim.AddToken(pvesim.Token{ID: "bench@pve!bench", Secret: hex.EncodeToString(secret), Privileges: pvesim.RoleAdministrator}); err != nil {
		return err
	}
	if err := sim.AddTemplate("pve1", 9000, "bench-template", pvesim.TemplateSpec{}); err != nil {
		return err
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	pc, err := pve.ConfigFromEnv(func(k string) string {
		return map[string]string{"PROXMOX_HOST": host, "PROXMOX_PORT": port, "PROXMOX_USER": "bench@pve",
			"PROXMOX_TOKEN_NAME": "bench", "PROXMOX_TOKEN_VALUE": hex.EncodeToString(secret),
			"PROXMOX_SSL_MODE": "verify", "PROXMOX_FINGERPRINT": sim.Fingerprint()}[k]
	})
	if err != nil {
		return err
	}
	pc.TaskPollInterval = div(pc.TaskPollInterval)
	if pc.NodeCalls == 0 {
		pc.NodeCalls = 2 // the client's default, printed
	}
	client, err := pve.New(pc)
	if err != nil {
		return err
	}
	// What `serve` uses: polls every second.
	poll := div(time.Second)
	backend, err := proxmox.New(client, proxmox.Config{Template: "bench-template", PollInterval: poll, Logger: log})
	if err != nil {
		return err
	}
	store, err := sqlite.Open(ctx, dir+"/jobs.db")
	if err != nil {
		return err
	}
	defer store.Close()
	defaults := delegate.Defaults{Timeout: 600, CPU: 1, Memory: "512M", Disk: "1G"}
	eng := engine.New(store, backend, engine.Config{
		Defaults: defaults, PollInterval: poll, ArtifactDir: dir + "/artifacts", CleanupInterval: time.Hour, Logger: log,
		SandboxTick: 100 * time.Millisecond, // a kept VM idle past its idle timeout is suspended at once
	})
	if err := eng.Start(ctx); err != nil {
		return err
	}
	defer eng.Close()

	b := &pveBench{sim: sim, eng: eng, backend: backend}
	tasks := []string{"echo hello", "sleep 1"}
	fmt.Fprintf(stdout, "delegate bench --proxmox-sim: %d runs of each, simulated latencies = real / %g (requests %s-%s, agent calls %s, a ping to a booting guest %s, clone %s, start %s, boot+agent %s, stop %s), polls every %s; guests run %s; at most %d calls in flight per node, pvedaemon's 3 workers\n",
		n, scale, div(real.RequestLatency.Min), div(real.RequestLatency.Max), div(real.AgentLatency), div(real.AgentPingTimeout), delays["qmclone"],
		delays["qmstart"], div(real.BootDelay), delays["qmstop"], poll, sim.AgentKind(), pc.NodeCalls)
	cold := map[string]*samples{}
	sim.ResetPeakCalls()
	for _, task := range tasks {
		if cold[task], err = b.run(ctx, task, n, false); err != nil {
			return fmt.Errorf("cold %q: %w", task, err)
		}
	}
	coldPeak := sim.PeakCalls()["pve1"]
	sim.ResetPeakCalls()
	stop, err := backend.KeepPool(ctx, proxmox.PoolConfig{Size: 2, CPU: defaults.CPU, MemoryBytes: 512 << 20, DiskBytes: 1 << 30,
		CheckInterval: div(10 * time.Second)})
	if err != nil {
		return err
	}
	defer stop()
	warm := map[string]*samples{}
	before := len(sim.Requests())
	for _, task := range tasks {
		if warm[task], err = b.run(ctx, task, n, true); err != nil {
			return fmt.Errorf("warm %q: %w", task, err)
		}
	}
	if err := b.poolFull(ctx); err != nil {
		return err
	}
	warmPeak := sim.PeakCalls()["pve1"]
	upkeep := len(sim.Requests()) - before
	for _, s := range warm {
		for _, c := range s.calls {
			upkeep -= c
		}
	}

	// Times as measured: with scale > 1 the simulated waits are shorter,
	// the jobs' own time (sleep 1) and the engine's are not.
	at := func(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }
	fmt.Fprintf(stdout, "%-34s %22s %22s\n", "median of "+strconv.Itoa(n), "cold (clone)", "warm (pool of 2)")
	for _, task := range tasks {
		c, w := cold[task], warm[task]
		fmt.Fprintf(stdout, "%-34s %22s %22s\n", fmt.Sprintf("%s: submit -> running", task), at(median(c.running)), at(median(w.running)))
		fmt.Fprintf(stdout, "%-34s %22s %22s\n", fmt.Sprintf("%s: submit -> done", task), at(median(c.done)), at(median(w.done)))
		fmt.Fprintf(stdout, "%-34s %22s %22s\n", fmt.Sprintf("%s: API calls per job", task), c.callRange(), w.callRange())
	}
	fmt.Fprintf(stdout, "%-34s %22d %22d\n", "peak concurrent calls to pve1", coldPeak, warmPeak)
	made := poolMade(sim)
	if made > 0 {
		fmt.Fprintf(stdout, "warm pool upkeep: %d API calls for %d VMs made (%.0f per VM: clone, configure, start, agent wait, ready mark; and a listing every %s)\n",
			upkeep, made, float64(upkeep)/float64(made), div(10*time.Second))
	}
	k, err := b.kept(ctx, "echo hello", n, false)
	if err != nil {
		return fmt.Errorf("kept VM: %w", err)
	}
	fmt.Fprintf(stdout, "%-34s %22s %22s\n", "echo hello in a kept VM", "submit -> done "+at(median(k.done)), "API calls "+k.callRange())
	p, err := b.kept(ctx, "echo hello", n, true)
	if err != nil {
		return fmt.Errorf("paused kept VM: %w", err)
	}
	fmt.Fprintf(stdout, "%-34s %22s %22s\n", "echo hello in a suspended kept VM", "submit -> done "+at(median(p.done)), "API calls "+p.callRange())
	return nil
}

// kept opens a kept sandbox (a VM that stays) and runs n commands in it
// one after the other: each command's time and API calls, the VM's
// making and destruction aside. paused: each command finds the VM
// suspended (idle for its one-second idle timeout), and resumes it.
func (b *pveBench) kept(ctx context.Context, task string, n int, paused bool) (*samples, error) {
	spec := delegate.SandboxSpec{}
	if paused {
		spec.IdleTimeout = 1
	}
	sb, err := b.eng.OpenSandbox(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer b.eng.ReleaseSandbox(context.WithoutCancel(ctx), sb.ID)
	s := &samples{}
	for range n {
		for paused {
			cur, err := b.eng.GetSandbox(ctx, sb.ID)
			if err != nil {
				return nil, err
			}
			if cur.State == delegate.SandboxPaused {
				break
			}
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return nil, err
			}
		}
		before := len(b.sim.Requests())
		start := time.Now()
		j, err := b.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: task, Sandbox: sb.ID}, delegate.SubmitOptions{})
		if err != nil {
			return nil, err
		}
		if j, err = b.eng.Wait(ctx, j.ID); err != nil {
			return nil, err
		}
		if j.Status != delegate.StatusSuccess {
			return nil, fmt.Errorf("command %s in %s: %s %s", j.ID, sb.ID, j.Status, j.Error)
		}
		s.done = append(s.done, time.Since(start))
		// Only the calls about the kept VM: the pool refills meanwhile.
		vmid, _, _ := strings.Cut(strings.TrimPrefix(sb.Instance, "vm-"), "-")
		s.calls = append(s.calls, aboutVM(b.sim.Requests()[before:], vmid))

	}
	return s, nil
}

type pveBench struct {
	sim     *pvesim.Server
	eng     *engine.Engine
	backend *proxmox.Backend
}

type samples struct {
	running, done []time.Duration
	calls         []int
}

func (s *samples) callRange() string {
	c := slices.Clone(s.calls)
	slices.Sort(c)
	return fmt.Sprintf("%d (%d-%d)", c[len(c)/2], c[0], c[len(c)-1])
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// run runs n jobs one after the other. Warm: each starts with the pool
// full, and its calls are those about its VM (the pool's refill, which
// runs meanwhile, is not the job's); cold: no pool runs, and every call
// from submission to the VM's destruction is the job's.
func (b *pveBench) run(ctx context.Context, task string, n int, warm bool) (*samples, error) {
	s := &samples{}
	for range n {
		if warm {
			if err := b.poolFull(ctx); err != nil {
				return nil, err
			}
		}
		before := len(b.sim.Requests())
		start := time.Now()
		j, err := b.eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: task}, delegate.SubmitOptions{})
		if err != nil {
			return nil, err
		}
		running := time.Duration(0)
		var cur *delegate.Job
		for {
			if cur, err = b.eng.Get(ctx, j.ID); err != nil {
				return nil, err
			}
			if running == 0 && cur.Status != delegate.StatusPending && cur.Status != delegate.StatusProvisioning {
				running = time.Since(start)
			}
			if cur.Status.Terminal() {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if cur.Status != delegate.StatusSuccess {
			return nil, fmt.Errorf("job %s: %s %s", cur.ID, cur.Status, cur.Error)
		}
		s.running, s.done = append(s.running, running), append(s.done, time.Since(start))
		vmid, _, _ := strings.Cut(strings.TrimPrefix(cur.SandboxID, "vm-"), "-")
		// Wait for the VM to be destroyed: its calls are the job's too.
		for {
			if _, ok := b.sim.VM(atoi(vmid)); !ok {
				break
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
		}
		reqs := b.sim.Requests()[before:]
		if !warm {
			s.calls = append(s.calls, len(reqs))
			continue
		}
		s.calls = append(s.calls, aboutVM(reqs, vmid))
	}
	return s, nil
}

// aboutVM counts the requests about one VM: on its paths, and on its
// tasks (a UPID names the VM, except a clone's, which names its source).
func aboutVM(reqs []pvesim.Request, vmid string) int {
	on := regexp.MustCompile(`/qemu/` + vmid + `(/|$)`)
	task := regexp.MustCompile(`/tasks/UPID:[^/]*:qm[a-z]+:` + vmid + `:`)
	n := 0
	for _, r := range reqs {
		if on.MatchString(r.Path) || task.MatchString(r.Path) {
			n++
		}
	}
	return n
}

// poolFull waits until the pool has its two VMs ready.
func (b *pveBench) poolFull(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		ready, other := 0, 0
		for _, c := range b.backend.PoolVMs() {
			if c.State == "ready" {
				ready = c.Count
			} else {
				other += c.Count
			}
		}
		if ready == 2 && other == 0 {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("the pool was not ready within 5 minutes: %+v", b.backend.PoolVMs())
}

// poolMade counts the pool VMs cloned.
func poolMade(sim *pvesim.Server) int {
	n := 0
	for _, r := range sim.Requests() {
		if strings.HasSuffix(r.Path, "/clone") && r.Status == 200 && strings.Contains(fmt.Sprint(r.Params["name"]), "-pool-") {
			n++
		}
	}
	return n
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
