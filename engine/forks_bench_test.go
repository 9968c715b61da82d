package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// BenchmarkLocalFork measures a fork of 4 ready to run as an agent asks
// for it (open_sandbox {from, count: 4}: ForkSandbox), through the
// engine, its SQLite store and the real local backend (as root), of a
// kept sandbox whose workspace holds 10,000 files of 10 kB (100 MB):
// from a checkpoint, and from the sandbox itself (its checkpoint made
// for the fork, included). The baseline, in the same rounds: cp -a of
// the tree onto a tmpfs, the copy a fork would be without layers. 15
// rounds alternating; medians and their ratios to 4 × cp -a are printed
// (docs/BENCHMARKS.md; local.BenchmarkCheckpointFork is the backend's
// part alone).
func BenchmarkLocalFork(b *testing.B) {
	const files, size, rounds = 10000, 10000, 15
	f := newLocal(b)
	f.cfg.Defaults.Disk, f.cfg.Defaults.Memory = "256M", "1G"
	f.cfg.MaxSandboxes = 16
	be := f.backend(b)
	eng := f.engine(b, be)
	ctx := context.Background()
	src, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.ReleaseSandbox(ctx, src.ID) })
	inst, err := be.Recover(ctx, src.Instance)
	if err != nil {
		b.Fatal(err)
	}
	ws := inst.(sandbox.HostWorkspace).WorkspaceDir()
	fi, err := os.Stat(ws)
	if err != nil {
		b.Fatal(err)
	}
	owner := int(fi.Sys().(*syscall.Stat_t).Uid) // the sandbox's job, on the host
	testkit.FillTree(b, ws, files, size, owner)
	scratch := b.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=512m"); err != nil {
		b.Fatal(err)
	}
	defer unix.Unmount(scratch, unix.MNT_DETACH)
	cp, err := eng.CheckpointSandbox(ctx, src.ID, delegate.CheckpointOptions{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	release := func(forks []delegate.Sandbox) {
		for _, fk := range forks {
			if _, _, err := eng.ReleaseSandbox(ctx, fk.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	var cpa, fromCP, fromSB []time.Duration
	for b.Loop() {
		for r := range rounds {
			cpa = append(cpa, testkit.TimeCopy(b, ws, filepath.Join(scratch, fmt.Sprint(r))))

			t0 := time.Now()
			forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: cp.ID, Count: 4})
			if err != nil {
				b.Fatal(err)
			}
			fromCP = append(fromCP, time.Since(t0))
			release(forks)

			t0 = time.Now()
			forks, err = eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 4})
			if err != nil {
				b.Fatal(err)
			}
			fromSB = append(fromSB, time.Since(t0))
			release(forks)
			if err := eng.DeleteCheckpoint(ctx, forks[0].From); err != nil {
				b.Fatal(err)
			}
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	base := med(cpa)
	for _, m := range []struct {
		name string
		d    time.Duration
	}{{"cp-a", base}, {"fork4-from-checkpoint", med(fromCP)}, {"fork4-from-sandbox", med(fromSB)}} {
		b.ReportMetric(float64(m.d.Microseconds())/1000, m.name+"-ms")
		vs := fmt.Sprintf("%.3f× cp -a of the tree four times", float64(m.d)/float64(4*base))
		if m.name == "cp-a" {
			vs = "the baseline"
		}
		b.Logf("%-22s median %7.1f ms  (%d rounds; %s)", m.name, float64(m.d.Microseconds())/1000, len(cpa), vs)
	}
}
