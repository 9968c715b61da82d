//go:build linux

package local

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// BenchmarkThroughput is fresh sandboxes per second, eight at a time:
// each a whole life of /bin/true (Create, Exec, Wait, Destroy), for each
// helper; and in the same run, alternating batch by batch, the baseline:
// bubblewrap with the same namespaces and read-only binds, run inside a
// cgroup made for it with the same limits (memory, cpu, pids: what a
// sandbox's Create makes) and removed after it, as bwrap makes none. It
// reports both rates and their ratio ("x-bwrap", issue 41's goal ≥ 1).
//
//	go test -run '^$' -bench Throughput -benchtime 8x ./local/
func BenchmarkThroughput(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed")
	}
	const conc, batch = 8, 64
	for _, mode := range helperModes() {
		b.Run(mode, func(b *testing.B) {
			be := newBackend(b, 0)
			be.shims.goHelpers = mode == "Go"
			ctx := context.Background()
			spec := defaultSpec()
			lim := limits{MemoryBytes: spec.MemoryBytes, CPU: spec.CPU, PidsMax: be.pidsMax}
			ours := func(int) error {
				sb, err := be.Create(ctx, spec)
				if err != nil {
					return err
				}
				p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}})
				if err == nil {
					var exit sandbox.Exit
					if exit, err = p.Wait(ctx); err == nil && exit.Code != 0 {
						err = fmt.Errorf("exit %+v", exit)
					}
				}
				if derr := sb.Destroy(ctx); err == nil {
					err = derr
				}
				return err
			}
			theirs := func(i int) error {
				cg := be.cg.names(fmt.Sprintf("bwrap-bench-%d", i))
				if err := cg.create(lim); err != nil {
					return err
				}
				defer cg.remove(5 * time.Second)
				// The shell places itself, then becomes bwrap.
				place := ""
				for _, d := range cg.dirs() {
					place += "echo $$ > " + d + "/cgroup.procs && "
				}
				cmd := exec.Command("/bin/sh", "-c", place+`exec "$@"`, "sh", bwrap,
					"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
					"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
					"--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
					"--tmpfs", "/tmp", "--tmpfs", "/workspace", "--chdir", "/workspace", "/bin/true")
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("bwrap: %v: %s", err, out)
				}
				return nil
			}
			run := func(one func(int) error) time.Duration {
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, batch)
				next := make(chan int, batch)
				for i := range batch {
					next <- i
				}
				close(next)
				for range conc {
					wg.Go(func() {
						for i := range next {
							if err := one(i); err != nil {
								errs <- err
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			var usT, themT time.Duration
			for b.Loop() {
				usT += run(ours)
				themT += run(theirs)
			}
			n := float64(b.N * batch)
			b.ReportMetric(n/usT.Seconds(), "sandboxes/s")
			b.ReportMetric(n/themT.Seconds(), "bwrap/s")
			b.ReportMetric(themT.Seconds()/usT.Seconds(), "x-bwrap")
		})
	}
}
