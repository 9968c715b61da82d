package bench

import (
	"context"
	"fmt"
	"io"
	"os"
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
				if m, ok, err := SupervisorMemory(a.Backend); ok && err == nil && m.Sandboxes > 0 {
					memPerSB, memSampled = float64(m.PerSandbox())/1024, m.Sandboxes
				}
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
