package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sqlite"
)

// Latencies measured on real Proxmox hardware (see DESIGN.md): a linked
// clone ~2 s, boot ~10 s, guest agent up ~3 s after boot.
const (
	realClone = 2 * time.Second
	realBoot  = 10 * time.Second
	realAgent = 3 * time.Second
	realTask  = 300 * time.Millisecond // config, stop, destroy
)

// Proxmox runs n jobs, one after the other, through the engine and the
// Proxmox backend against a simulator whose latencies are the real ones
// divided by scale, and prints submit→running, submit→done and the API
// calls per job.
func Proxmox(ctx context.Context, n int, scale float64, stdout io.Writer, log *slog.Logger) error {
	div := func(d time.Duration) time.Duration { return time.Duration(float64(d) / scale) }
	dir, err := os.MkdirTemp("", "delegate-bench-pve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sim, err := pvesim.New(pvesim.Options{
		Nodes:            pvesim.DefaultNodes(1),
		TaskDelay:        div(realTask),
		TaskDelays:       map[string]time.Duration{"qmclone": div(realClone)},
		BootDelay:        div(realBoot + realAgent),
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
	client, err := pve.New(pc)
	if err != nil {
		return err
	}
	poll := div(time.Second)
	backend, err := proxmox.New(client, proxmox.Config{Template: "bench-template", PollInterval: poll})
	if err != nil {
		return err
	}
	store, err := sqlite.Open(ctx, dir+"/jobs.db")
	if err != nil {
		return err
	}
	defer store.Close()
	eng := engine.New(store, backend, engine.Config{
		Defaults:     delegate.Defaults{Timeout: 600, CPU: 1, Memory: "512M", Disk: "1G"},
		PollInterval: poll, ArtifactDir: dir + "/artifacts", CleanupInterval: time.Hour,
		Logger: log,
	})
	if err := eng.Start(ctx); err != nil {
		return err
	}
	defer eng.Close()

	var toRunning, toDone []time.Duration
	var calls []int
	for range n {
		before := len(sim.Requests())
		start := time.Now()
		j, err := eng.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "echo hello"}, delegate.SubmitOptions{})
		if err != nil {
			return err
		}
		running := time.Duration(0)
		for {
			cur, err := eng.Get(ctx, j.ID)
			if err != nil {
				return err
			}
			if running == 0 && cur.Status != delegate.StatusPending && cur.Status != delegate.StatusProvisioning {
				running = time.Since(start)
			}
			if cur.Status.Terminal() {
				if cur.Status != delegate.StatusSuccess {
					return fmt.Errorf("job %s: %s %s", cur.ID, cur.Status, cur.Error)
				}
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		toRunning, toDone = append(toRunning, running), append(toDone, time.Since(start))
		// Wait for the VM to be destroyed, so that each job's calls are its own.
		for len(sim.VMs()) > 1 {
			time.Sleep(10 * time.Millisecond)
		}
		calls = append(calls, len(sim.Requests())-before)
	}
	med := func(ds []time.Duration) time.Duration { s := slices.Clone(ds); slices.Sort(s); return s[len(s)/2] }
	fmt.Fprintf(stdout, "delegate bench --proxmox-sim: %d jobs, simulated latencies = real / %g (clone %s, boot %s, agent %s)\n",
		n, scale, div(realClone), div(realBoot), div(realAgent))
	fmt.Fprintf(stdout, "%-28s %12s %16s\n", "", "median", "x scale (real)")
	fmt.Fprintf(stdout, "%-28s %10.0fms %14.1fs\n", "submit -> running", ms(med(toRunning)), med(toRunning).Seconds()*scale)
	fmt.Fprintf(stdout, "%-28s %10.0fms %14.1fs\n", "submit -> done (echo hello)", ms(med(toDone)), med(toDone).Seconds()*scale)
	slices.Sort(calls)
	fmt.Fprintf(stdout, "Proxmox API calls per job: median %d (min %d, max %d), with polls every %s\n", calls[len(calls)/2], calls[0], calls[len(calls)-1], poll)
	return nil
}
