package proxmox_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// BenchmarkArtifactsSim reads 4 MB of artifacts (20 random files of 200
// KB) out of a VM at a real cluster's request and guest-agent latencies
// (pvesim.RealLatency) three ways, and reports the seconds and Proxmox
// API calls of each: a ReadFile each, as the engine did (an exec of dd
// and its polls per file), and ReadFiles, as it does now: one archive,
// sent over HTTP by a VM with a network (transfer.go), through the agent
// (agent/file-read) by one without. The VMs are made outside the
// timings.
//
//	go test -run '^$' -bench ArtifactsSim -benchtime 3x ./proxmox/
func BenchmarkArtifactsSim(b *testing.B) {
	sim, _, be := realSim(b)
	ctx := context.Background()
	vm := func(nic bool) (sandbox.Instance, []string) {
		inst, err := be.Create(ctx, sandbox.Spec{JobID: "job-bench", CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30, Network: nic})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { inst.Destroy(ctx) })
		proc, err := inst.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c",
			`mkdir -p out && i=0; while [ $i -lt 20 ]; do i=$((i+1)); head -c 200000 /dev/urandom >out/a$i.bin; done`}, Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			b.Fatal(err)
		}
		if exit, err := proc.Wait(ctx); err != nil || exit.Code != 0 {
			b.Fatalf("write: %+v %v", exit, err)
		}
		var paths []string
		for i := 1; i <= 20; i++ {
			paths = append(paths, fmt.Sprintf("/workspace/out/a%d.bin", i))
		}
		return inst, paths
	}
	b.StopTimer()
	withNIC, paths := vm(true)
	noNIC, _ := vm(false)
	b.StartTimer()
	measure := func(read func() error) (time.Duration, int) {
		n0, t0 := len(sim.Requests()), time.Now()
		if err := read(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), len(sim.Requests()) - n0
	}
	together := func(inst sandbox.Instance) func() error {
		return func() error {
			return inst.(sandbox.FilesReader).ReadFiles(ctx, paths, func(string, io.Reader) error { return nil })
		}
	}
	var oneS, agentS, httpS time.Duration
	var oneC, agentC, httpC int
	for b.Loop() {
		t, c := measure(func() error {
			for _, p := range paths {
				if _, err := withNIC.ReadFile(ctx, p, 0, 16<<20+1); err != nil {
					return err
				}
			}
			return nil
		})
		oneS, oneC = oneS+t, oneC+c
		t, c = measure(together(noNIC))
		agentS, agentC = agentS+t, agentC+c
		t, c = measure(together(withNIC))
		httpS, httpC = httpS+t, httpC+c
	}
	n := float64(b.N)
	b.ReportMetric(oneS.Seconds()/n, "each-s")
	b.ReportMetric(float64(oneC)/n, "each-calls")
	b.ReportMetric(agentS.Seconds()/n, "agent-s")
	b.ReportMetric(float64(agentC)/n, "agent-calls")
	b.ReportMetric(httpS.Seconds()/n, "http-s")
	b.ReportMetric(float64(httpC)/n, "http-calls")
}
