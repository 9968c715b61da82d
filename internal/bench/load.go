package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// LoadOpener opens an App over a fresh data dir that runs up to n jobs at
// once.
type LoadOpener func(ctx context.Context, dataDir string, n int) (*App, error)

// Load submits n jobs that each sleep for sleep, all at once, and prints
// how long it took until every submission was accepted (stored), until
// every job had started, and until every job had ended; the memory each
// running sandbox adds (the proportional set size of its supervisor
// processes); and how many jobs were lost (did not succeed).
func Load(ctx context.Context, n int, sleep time.Duration, open LoadOpener, stdout io.Writer) error {
	dir, err := os.MkdirTemp("", "delegate-bench-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a, err := open(ctx, dir, n)
	if err != nil {
		return err
	}
	defer a.Close()

	timeout := int((sleep + 10*time.Minute).Seconds())
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: fmt.Sprintf("exec sleep %g", sleep.Seconds()), Timeout: &timeout}
	start := time.Now()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted time.Duration
		ids      = make(map[string]bool, n)
		errs     []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := a.Jobs.Submit(ctx, m, delegate.SubmitOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[j.ID] = true
			accepted = max(accepted, time.Since(start))
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d submissions failed, the first: %w", len(errs), n, errs[0])
	}

	var (
		allStarted time.Duration
		memPerSB   float64 // KiB
		memSampled int
		lost       int
	)
	for {
		counts, err := countJobs(ctx, a.Jobs, ids)
		if err != nil {
			return err
		}
		started := counts[delegate.StatusRunning] + counts[delegate.StatusSuccess] + counts[delegate.StatusFailed] +
			counts[delegate.StatusTimeout] + counts[delegate.StatusCancelled]
		if allStarted == 0 && started == n {
			allStarted = time.Since(start)
			if counts[delegate.StatusRunning] == n {
				memPerSB, memSampled = supervisorPSS(filepath.Join(dir, "sandboxes"))
			}
		}
		ended := started - counts[delegate.StatusRunning]
		if ended == n {
			lost = n - counts[delegate.StatusSuccess]
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
	allDone := time.Since(start)

	fmt.Fprintf(stdout, "delegate bench --load %d: %d concurrent jobs (sleep %s) on %s\n", n, n, sleep, hostDesc())
	fmt.Fprintf(stdout, "%-44s %10.2fs\n", "time to accept all (every submit stored)", accepted.Seconds())
	fmt.Fprintf(stdout, "%-44s %10.2fs\n", "time to all running", allStarted.Seconds())
	fmt.Fprintf(stdout, "%-44s %10.2fs\n", "time to all done", allDone.Seconds())
	if memSampled > 0 {
		fmt.Fprintf(stdout, "%-44s %8.0fKiB (PSS of the supervisors, %d sandboxes)\n", "memory per running sandbox", memPerSB, memSampled)
	} else {
		fmt.Fprintf(stdout, "%-44s %10s (some jobs had ended before the last started: raise --sleep)\n", "memory per running sandbox", "-")
	}
	fmt.Fprintf(stdout, "%-44s %10d\n", "lost jobs", lost)
	if lost > 0 {
		return fmt.Errorf("%d of %d jobs did not succeed", lost, n)
	}
	return nil
}

// countJobs counts the jobs in ids by status.
func countJobs(ctx context.Context, jobs delegate.JobService, ids map[string]bool) (map[delegate.Status]int, error) {
	counts := map[delegate.Status]int{}
	cursor := ""
	for {
		page, err := jobs.List(ctx, delegate.ListOptions{Limit: delegate.MaxPageSize, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		for _, j := range page.Jobs {
			if ids[j.ID] {
				counts[j.Status]++
			}
		}
		if page.NextCursor == "" {
			return counts, nil
		}
		cursor = page.NextCursor
	}
}

// supervisorPSS is the mean proportional set size (KiB) of the supervisor
// processes of each local sandbox under dir (those named in shim.pid and
// init.pid; the job's own processes are not counted), and how many
// sandboxes were measured.
func supervisorPSS(dir string) (float64, int) {
	sandboxes, _ := filepath.Glob(filepath.Join(dir, "sb-*"))
	var total, measured int
	for _, sb := range sandboxes {
		kib, ok := 0, false
		for _, f := range []string{"shim.pid", "init.pid"} {
			b, err := os.ReadFile(filepath.Join(sb, f))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				continue
			}
			if pss, err := pssKiB(pid); err == nil {
				kib, ok = kib+pss, true
			}
		}
		if ok {
			total += kib
			measured++
		}
	}
	if measured == 0 {
		return 0, 0
	}
	return float64(total) / float64(measured), measured
}

// pssKiB reads a process's proportional set size.
func pssKiB(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("pid %d: no Pss in smaps_rollup", pid)
}
