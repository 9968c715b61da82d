package proxmox_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sqlite"
)

// BenchmarkRequestsPerRunningJob measures the API requests a running
// job costs, with the server's settings for Proxmox (the engine and the
// backend poll every second): the figure the rate limit is set against
// (docs/PROXMOX.md, PROXMOX_RATE_LIMIT). Run it with -benchtime=1x: each
// iteration is a job that prints a line a second for 10 s.
func BenchmarkRequestsPerRunningJob(b *testing.B) {
	sim, err := pvesim.New(pvesim.Options{Nodes: pvesim.DefaultNodes(1), AuthFailureDelay: -1, SandboxDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	if err := sim.AddTemplate("pve1", 9000, "debian-job", pvesim.TemplateSpec{}); err != nil {
		b.Fatal(err)
	}
	c, token := client(b, sim, "delegate@pve", pvesim.RoleAdministrator)
	backend, err := proxmox.New(c, proxmox.Config{Template: "debian-job"})
	if err != nil {
		b.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	eng := engine.New(st, backend, engine.Config{PollInterval: time.Second, ArtifactDir: b.TempDir(),
		Defaults: delegate.Defaults{Timeout: 120, CPU: 1, Memory: "256M", Disk: "1G"}})
	if err := eng.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	var reqs, secs float64
	for b.Loop() {
		j, err := eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 1; done"}, delegate.SubmitOptions{})
		if err != nil {
			b.Fatal(err)
		}
		done, err := eng.Wait(ctx, j.ID)
		if err != nil || done.Status != delegate.StatusSuccess {
			b.Fatalf("%v %v", done, err)
		}
		from, to := done.StartedAt.Add(time.Second), done.FinishedAt.Add(-time.Second) // the running part, its ends left out
		for _, r := range sim.Requests() {
			if r.TokenID == token && r.Time.After(from) && r.Time.Before(to) {
				reqs++
				if testing.Verbose() {
					b.Logf("%s %s", r.Method, r.Path)
				}
			}
		}
		secs += to.Sub(from).Seconds()
	}
	b.ReportMetric(reqs/secs, "req/s/job")
}
