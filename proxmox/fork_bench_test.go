package proxmox_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// BenchmarkForkSim forks a kept sandbox with a 10 MB source tree into 4
// warm VMs of the pool, files only, on the simulator at a real cluster's
// latencies (pvesim.RealLatency: requests 10-50 ms, agent calls 25 ms
// more, tasks a few hundred ms, boots 12 s) with the client's defaults
// (20 requests a second, 40 at once, 2 calls in flight per node), on one
// node and on two: the checkpoint (the workspace's archive out of the
// source VM, a snapshot without RAM) and then the 4 forks made at once
// (each a warm VM taken and the archive put in). The baseline, in the
// same round, is the 4 VMs given the same tree from the server as 4
// fresh jobs are (Archive, PutArchive; at once). The pool is refilled
// outside the timings, its calls background work (pve.Background); the
// case refill=foreground is one node as it was before, the refill's
// calls competing with the forks' as equals. The last case is one node
// whose pvedaemon has 6 workers (MAX_WORKERS=6 in /etc/default/pvedaemon,
// which pve-manager's PVE/Service/pvedaemon.pm reads) and
// PROXMOX_NODE_CALLS=5. The cases pool-nic keep the pool's VMs with a
// NIC (PoolConfig.Network) and serve transfers (Config.TransferURL, the
// callback server the guests reach): each fork fetches the archive over
// HTTP, and its NIC is then hot-unplugged (1 s in the real profile).
//
//	go test -run '^$' -bench ForkSim -benchtime 5x -timeout 30m ./proxmox/
func BenchmarkForkSim(b *testing.B) {
	for _, c := range []struct {
		nodes, workers  int
		foreground, nic bool
	}{{1, 3, true, false}, {1, 3, false, false}, {2, 3, false, false}, {1, 6, false, false}, {1, 3, false, true}, {2, 3, false, true}} {
		name := fmt.Sprintf("nodes=%d", c.nodes)
		if c.foreground {
			name += ",refill=foreground"
		}
		if c.workers != 3 {
			name += fmt.Sprintf(",max-workers=%d", c.workers)
		}
		if c.nic {
			name += ",pool-nic"
		}
		b.Run(name, func(b *testing.B) {
			if c.foreground {
				defer proxmox.RefillInForeground()()
			}
			benchFork(b, c.nodes, c.workers, c.nic)
		})
	}
}

func benchFork(b *testing.B, nodes, workers int, nic bool) {
	ctx := context.Background()
	opts := pvesim.Options{Nodes: pvesim.DefaultNodes(nodes), Latency: "real", AuthFailureDelay: -1, SandboxDir: b.TempDir(),
		DaemonWorkers: workers}
	cfg := proxmox.Config{Template: "debian-job", Instance: "forkbench", CheckpointDir: b.TempDir()}
	var ln net.Listener
	if nic {
		// The callback server, which the guests reach at guestCallback.
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		opts.CallbackPort, opts.Hosts = 8765, map[string]string{guestCallback: ln.Addr().String()}
		cfg.TransferURL = "http://" + guestCallback
	}
	sim, err := pvesim.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	for i := range nodes {
		if err := sim.AddTemplate("pve"+strconv.Itoa(i+1), 9000+i, "debian-job", pvesim.TemplateSpec{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := sim.AddToken(pvesim.Token{ID: "bench@pve!tk", Secret: "s3cret", Privileges: pvesim.RoleAdministrator}); err != nil {
		b.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: "bench@pve", TokenName: "tk", TokenValue: "s3cret",
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), NodeCalls: workers - 1})
	if err != nil {
		b.Fatal(err)
	}
	be, err := proxmox.New(c, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	if nic {
		srv := httpapi.CallbackServer(httpapi.Services{Transfers: be.Transfers()}, httpapi.Options{})
		served := make(chan struct{})
		go func() {
			defer close(served)
			srv.Serve(ln)
		}()
		defer func() {
			srv.Close()
			<-served
		}()
	}
	spec := sandbox.Spec{JobID: "sbx-forksource", CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30, MultiExec: true}
	src, err := be.Create(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Destroy(ctx)
	root := sourceTree(b, 10<<20)
	tree, err := workspace.Scan(ctx, root, workspace.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	importTree := func(inst sandbox.Instance) error {
		pr, pw := io.Pipe()
		go func() {
			_, err := tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: true})
			pw.CloseWithError(err)
		}()
		_, err := inst.(sandbox.Archiver).PutArchive(ctx, pr)
		pr.Close()
		return err
	}
	if err := importTree(src); err != nil {
		b.Fatal(err)
	}
	stop, err := be.KeepPool(ctx, proxmox.PoolConfig{Size: 4, CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30, Parallel: 4, CheckInterval: time.Second,
		Network: nic})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	ready := func() {
		testkit.Eventually(b, 5*time.Minute, "4 ready VMs in the pool", func() bool {
			for _, pc := range be.PoolVMs() {
				if pc.State == "ready" {
					return pc.Count >= 4
				}
			}
			return false
		})
	}
	var ckpT, forkT, baseT time.Duration
	var ckpCalls, forkCalls, baseCalls int
	var archive int64
	var writes, pings int
	var queued time.Duration
	round := 0
	for b.Loop() {
		b.StopTimer()
		ready()
		round++
		n0 := len(sim.Requests())
		b.StartTimer()
		t0 := time.Now()
		cp, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		n1 := len(sim.Requests())
		forks := make([]sandbox.Instance, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range forks {
			wg.Go(func() {
				fs := spec
				fs.JobID, fs.From = fmt.Sprintf("sbx-fork%d-%d", round, i), cp.ID
				forks[i], errs[i] = be.Create(ctx, fs)
			})
		}
		wg.Wait()
		t2 := time.Now()
		b.StopTimer()
		ckpT += t1.Sub(t0)
		forkT += t2.Sub(t1)
		ckpCalls += n1 - n0
		w, pg, q := windowCalls(sim.Requests(), n1)
		writes, pings, queued = writes+w, pings+pg, queued+q
		forkCalls += len(sim.Requests()) - n1
		archive += cp.Bytes
		for i, err := range errs {
			if err != nil {
				b.Fatalf("fork %d: %v", i, err)
			}
			got, err := forks[i].ReadFile(ctx, "/workspace/pkg000/file0000.go", 0, 1<<20)
			want, _ := os.ReadFile(filepath.Join(root, "pkg000", "file0000.go"))
			if err != nil || string(got) != string(want) {
				b.Fatalf("fork %d reads %d bytes (%v), want %d", i, len(got), err, len(want))
			}
		}
		// The baseline: the same 4 VMs given the tree from the server.
		n2 := len(sim.Requests())
		t3 := time.Now()
		for i := range forks {
			wg.Go(func() { errs[i] = importTree(forks[i]) })
		}
		wg.Wait()
		baseT += time.Since(t3)
		baseCalls += len(sim.Requests()) - n2
		for i := range forks {
			if errs[i] != nil {
				b.Fatalf("baseline %d: %v", i, errs[i])
			}
			forks[i].Destroy(ctx)
		}
		if err := be.DeleteCheckpoint(ctx, cp.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(round)
	b.ReportMetric(float64(tree.Bytes)/1e6, "source-MB")
	b.ReportMetric(float64(archive)/n/1e6, "archive-MB")
	b.ReportMetric(ckpT.Seconds()/n, "checkpoint-s")
	b.ReportMetric(forkT.Seconds()/n, "fork4-s")
	b.ReportMetric((ckpT+forkT).Seconds()/n, "total-s")
	b.ReportMetric(float64(ckpCalls+forkCalls)/n, "calls")
	// In the forks' window: the parts written, and the pings (the pool's
	// refill waits for its new VMs' agents, each ping of a booting guest
	// holding a pvedaemon worker 3 s), and the time calls waited for a
	// worker.
	b.ReportMetric(float64(writes)/n, "fork-file-writes")
	b.ReportMetric(float64(pings)/n, "fork-window-pings")
	b.ReportMetric(queued.Seconds()/n, "fork-window-queued-s")
	b.ReportMetric(baseT.Seconds()/n, "baseline-import4-s")
	b.ReportMetric(float64(baseCalls)/n, "baseline-calls")
}

// windowCalls counts, in the requests from the first, the agent's
// file-writes and pings, and sums the time they waited for a worker.
func windowCalls(reqs []pvesim.Request, first int) (writes, pings int, queued time.Duration) {
	for i := first; i < len(reqs); i++ {
		if strings.HasSuffix(reqs[i].Path, "/agent/file-write") {
			writes++
		} else if strings.HasSuffix(reqs[i].Path, "/agent/ping") {
			pings++
		}
		queued += reqs[i].Queued
	}
	return writes, pings, queued
}
