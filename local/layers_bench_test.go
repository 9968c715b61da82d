//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// BenchmarkCheckpointFork measures a checkpoint, a rollback and a fork
// of 4 ready to run (Create from the checkpoint returned: each fork's
// init is up) of a kept sandbox whose workspace holds 10,000 files,
// 100 MB, against the baseline of the same run: cp -a of that tree onto
// a tmpfs, the copy a fork would be without layers. The rounds
// alternate (baseline, checkpoint, rollback, fork), 15 of them; the
// medians and their ratios to cp -a are printed (docs/BENCHMARKS.md).
// The fork of 4 is timed made at once (as the engine makes them) and
// one after another; 4 empty kept sandboxes made at once are the
// reference of what a fork costs without its layers.
func BenchmarkCheckpointFork(b *testing.B) {
	const files, size, rounds = 10000, 10000, 15 // 10,000 × 10 kB = 100 MB
	be := newBackend(b, 0)
	ctx := context.Background()
	spec := sandbox.Spec{JobID: "bench", CPU: 1, MemoryBytes: 1 << 30, DiskBytes: 256 << 20, MultiExec: true, Expires: time.Now().Add(time.Hour)}
	src := create(b, be, spec)
	st, err := src.state()
	if err != nil {
		b.Fatal(err)
	}
	ws, owner := src.WorkspaceDir(), int(st.hostBase()+jobID)
	testkit.FillTree(b, ws, files, size, owner)
	scratch := b.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=512m"); err != nil {
		b.Fatal(err)
	}
	defer unix.Unmount(scratch, unix.MNT_DETACH)
	base := checkpointB(b, src) // the tree, frozen once: rollbacks go back to it
	var cp, cpc, rb, fk, fks, op []time.Duration
	for b.Loop() {
		for r := range rounds {
			cpc = append(cpc, testkit.TimeCopy(b, ws, filepath.Join(scratch, fmt.Sprint(r))))

			// A file written since the last cut (the rollback's): the
			// checkpoint freezes a layer, as one after work does (a
			// sandbox that wrote nothing is checkpointed as its layers).
			note := filepath.Join(ws, "round")
			if err := os.WriteFile(note, []byte(fmt.Sprint(r)), 0o644); err != nil {
				b.Fatal(err)
			}
			os.Chown(note, owner, owner)
			t0 := time.Now()
			c := checkpointB(b, src)
			cp = append(cp, time.Since(t0))

			t0 = time.Now()
			if err := src.Rollback(ctx, base.ID); err != nil {
				b.Fatal(err)
			}
			rb = append(rb, time.Since(t0))

			fs := spec
			fs.From = c.ID
			// 4 at once, as the engine opens a fork's sandboxes, then
			// (the figure before it did) one after another.
			t0 = time.Now()
			forks := make([]sandbox.Instance, 4)
			errs := make([]error, 4)
			var wg sync.WaitGroup
			for i := range forks {
				wg.Go(func() { forks[i], errs[i] = be.Create(ctx, fs) })
			}
			wg.Wait()
			fk = append(fk, time.Since(t0))
			destroyAll(b, forks, errs)
			t0 = time.Now()
			for i := range forks {
				forks[i], errs[i] = be.Create(ctx, fs)
			}
			fks = append(fks, time.Since(t0))
			destroyAll(b, forks, errs)
			// The reference: 4 empty kept sandboxes at once, all of a
			// fork but its layers.
			t0 = time.Now()
			for i := range forks {
				wg.Go(func() { forks[i], errs[i] = be.Create(ctx, spec) })
			}
			wg.Wait()
			op = append(op, time.Since(t0))
			destroyAll(b, forks, errs)
			be.DeleteCheckpoint(ctx, c.ID)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	base0 := med(cpc)
	for _, m := range []struct {
		name string
		d    time.Duration
		vs   time.Duration
	}{{"cp-a", base0, base0}, {"checkpoint", med(cp), base0}, {"rollback", med(rb), base0}, {"fork4", med(fk), 4 * base0}, {"fork4-serial", med(fks), 4 * base0}, {"open4", med(op), 4 * base0}} {
		b.ReportMetric(float64(m.d.Microseconds())/1000, m.name+"-ms")
		b.Logf("%-12s median %7.1f ms  (%d rounds; %.3f× %s)", m.name, float64(m.d.Microseconds())/1000, len(cpc),
			float64(m.d)/float64(m.vs), map[bool]string{true: "cp -a of the tree four times", false: "cp -a of the tree"}[strings.HasSuffix(m.name, "4") || strings.HasPrefix(m.name, "fork4")])
	}
}

// destroyAll destroys the forks made, once all were asked for: one
// that failed fails the benchmark.
func destroyAll(b *testing.B, forks []sandbox.Instance, errs []error) {
	b.Helper()
	for _, f := range forks {
		if f != nil {
			f.Destroy(context.Background())
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}

func checkpointB(b *testing.B, sb *sbox) sandbox.Checkpoint {
	b.Helper()
	c, err := sb.Checkpoint(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return c
}
