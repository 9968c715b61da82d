package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// kept measures kept sandboxes beside the figures of Local: a command's
// round trip in a kept sandbox against a fresh job's, measured in blocks
// that alternate with the commands' (alternate), and against plain exec,
// back to back and with think time between (as an agent reads a result
// before its next command), a 1 MiB file written and read back, a pause
// and resume, and what a kept sandbox costs while idle.
func kept(ctx context.Context, n int, a *App, plain time.Duration, stdout io.Writer) error {
	sb, err := a.Sandboxes.OpenSandbox(ctx, delegate.SandboxSpec{})
	if err != nil {
		return fmt.Errorf("open a kept sandbox: %w", err)
	}
	released := false
	release := func() {
		if !released {
			a.Sandboxes.ReleaseSandbox(context.WithoutCancel(ctx), sb.ID)
			released = true
		}
	}
	defer release()

	submit := func(sandboxID string) func() error {
		return func() error {
			j, err := a.Jobs.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentCustom, Agent: &delegate.AgentConfig{Command: "exec /bin/true"}, Sandbox: sandboxID}, delegate.SubmitOptions{})
			if err != nil {
				return err
			}
			if j, err = a.Jobs.Wait(ctx, j.ID); err != nil {
				return err
			}
			if j.Status != delegate.StatusSuccess {
				return fmt.Errorf("job %s (sandbox %q): %s %s", j.ID, sandboxID, j.Status, j.Error)
			}
			return nil
		}
	}
	fresh, command, err := alternate(n, submit(""), submit(sb.ID))
	if err != nil {
		return err
	}
	// With think time: a fresh job and a command, each after 100 ms of
	// nothing (not timed), alternating. The kernel then makes the move of
	// a process into a cgroup wait for an RCU grace period, which
	// back-to-back runs share.
	apartFresh, apartKept := &result{}, &result{}
	for range n {
		for _, m := range []struct {
			r  *result
			fn func() error
		}{{apartFresh, submit("")}, {apartKept, submit(sb.ID)}} {
			time.Sleep(thinkTime)
			t0 := time.Now()
			if err := m.fn(); err != nil {
				return err
			}
			m.r.times = append(m.r.times, time.Since(t0))
		}
	}
	slices.Sort(apartFresh.times)
	slices.Sort(apartKept.times)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	write := measure(n, func() error { return a.Sandboxes.WriteSandboxFile(ctx, sb.ID, "bench.bin", data, 0o644) })
	read := measure(n, func() error {
		c, err := a.Sandboxes.ReadSandboxFile(ctx, sb.ID, "bench.bin", 0, int64(len(data)))
		if err != nil {
			return err
		}
		if len(c.Data) != len(data) {
			return fmt.Errorf("read %d bytes of %d", len(c.Data), len(data))
		}
		return nil
	})
	for _, r := range []*result{write, read} {
		if r.err != nil {
			return r.err
		}
	}
	pause, resumed, err := pauseResume(ctx, n, a.Backend)
	if err != nil {
		return err
	}
	row := func(name string, r *result, base time.Duration, baseName string) {
		// Two decimals: a goal such as "at most half" is not met by a
		// 0.54 that one decimal would print as 0.5.
		fmt.Fprintf(stdout, "%-44s %8.2fms %8.2fms %7.2fx %s\n", name, ms(r.median()), ms(r.p90()), float64(r.median())/float64(base), baseName)
	}
	row("fresh job, in blocks alternating with:", fresh, plain, "of plain exec (the next row's base)")
	row("kept sandbox: command round trip", command, fresh.median(), "of a fresh job's")
	row("  the same, against plain exec", command, plain, "of plain exec")
	row(fmt.Sprintf("fresh job, %v apart", thinkTime), apartFresh, plain, "of plain exec")
	row(fmt.Sprintf("kept sandbox: command, %v apart", thinkTime), apartKept, apartFresh.median(), "of a fresh job's, as apart")
	row("kept sandbox: write a 1 MiB file", write, plain, "of plain exec")
	row("kept sandbox: read a 1 MiB file", read, plain, "of plain exec")
	if pause != nil {
		row("kept sandbox: pause + resume (a sleep inside)", pause, plain, "of plain exec")
		row("kept sandbox: resume, then /bin/true in it", resumed, plain, "of plain exec")
	}
	// Idle: a kept sandbox keeps its supervisor (the keeper), its init and
	// init's spare; the sandbox opened above is released first, so that
	// only the one measured counts.
	release()
	for _, background := range []bool{false, true} {
		m, ok, err := keptMemory(ctx, a.Backend, background)
		if err != nil {
			return fmt.Errorf("kept sandbox memory: %w", err)
		}
		if !ok {
			break
		}
		name := "kept sandbox idle, nothing left (PSS)"
		if background {
			name = "kept sandbox idle, a sleep left (PSS)"
		}
		fmt.Fprintf(stdout, "%-44s %8.0fKiB  (%d processes besides the jobs' own)\n", name, kib(m.PSS), m.Processes)
	}
	return nil
}

// blockRuns is how many timed runs of one kind alternate's blocks hold.
const blockRuns = 5

// alternate measures a and b n times each, in blocks that alternate (an
// untimed run, then blockRuns timed ones back to back), so that both see
// the machine as it is in the same seconds: on a shared VM the figures
// drift by a fifth and more between phases seconds apart, which a ratio
// of two such phases would carry.
func alternate(n int, a, b func() error) (ra, rb *result, err error) {
	ra, rb = &result{}, &result{}
	for len(ra.times) < n || len(rb.times) < n {
		for _, m := range []struct {
			r  *result
			fn func() error
		}{{ra, a}, {rb, b}} {
			if err := m.fn(); err != nil {
				return nil, nil, err
			}
			for i := 0; i < blockRuns && len(m.r.times) < n; i++ {
				t0 := time.Now()
				if err := m.fn(); err != nil {
					return nil, nil, err
				}
				m.r.times = append(m.r.times, time.Since(t0))
			}
		}
	}
	slices.Sort(ra.times)
	slices.Sort(rb.times)
	return ra, rb, nil
}

// pauseResume pauses and resumes a kept instance whose command left a
// sleep running: the pair, and a resume followed by a command. nil
// results: the backend cannot pause.
func pauseResume(ctx context.Context, n int, b sandbox.Backend) (pair, resumed *result, err error) {
	if !b.Capabilities().Pause {
		return nil, nil, nil
	}
	inst, err := keptInstance(ctx, b, true)
	if err != nil {
		return nil, nil, err
	}
	defer inst.Destroy(context.WithoutCancel(ctx))
	p, ok := inst.(sandbox.Pauser)
	if !ok {
		return nil, nil, fmt.Errorf("the %s backend says it pauses, its instance cannot", b.Name())
	}
	pair = measure(n, func() error {
		if err := p.Pause(ctx); err != nil {
			return err
		}
		return p.Resume(ctx)
	})
	resumed = measure(n, func() error {
		if err := p.Pause(ctx); err != nil {
			return err
		}
		if err := p.Resume(ctx); err != nil {
			return err
		}
		return run(ctx, inst, "/bin/true")
	})
	for _, r := range []*result{pair, resumed} {
		if r.err != nil {
			return nil, nil, r.err
		}
	}
	return pair, resumed, nil
}

// keptInstance makes an instance for many commands and runs one in it,
// which leaves a sleep in the background when asked.
func keptInstance(ctx context.Context, b sandbox.Backend, background bool) (sandbox.Instance, error) {
	inst, err := b.Create(ctx, sandbox.Spec{JobID: "bench", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20,
		MultiExec: true, Expires: time.Now().Add(10 * time.Minute)})
	if err != nil {
		return nil, err
	}
	script := "true"
	if background {
		script = "sleep 600 >/dev/null 2>&1 &"
	}
	if err := run(ctx, inst, "/bin/sh", "-c", script); err != nil {
		inst.Destroy(context.WithoutCancel(ctx))
		return nil, err
	}
	return inst, nil
}

// keptMemory measures one kept instance after its command ended.
func keptMemory(ctx context.Context, b sandbox.Backend, background bool) (m keptFigures, ok bool, err error) {
	if !b.Capabilities().MultiExec {
		return m, false, nil
	}
	inst, err := keptInstance(ctx, b, background)
	if err != nil {
		return m, false, err
	}
	defer inst.Destroy(context.WithoutCancel(ctx))
	// The command's shim ends once it has recorded the command's end, and
	// the C keeper makes init's spare 20 ms after a command came: measure
	// once the count of processes holds still.
	deadline := time.Now().Add(5 * time.Second)
	last := -1
	for {
		time.Sleep(100 * time.Millisecond)
		sm, ok, err := SupervisorMemory(b)
		if err != nil || !ok {
			return m, ok, err
		}
		m = keptFigures{PSS: sm.PSS, Processes: sm.Processes}
		if sm.Processes == last || time.Now().After(deadline) {
			return m, true, nil
		}
		last = sm.Processes
	}
}

// thinkTime is the pause before each run of the "apart" rows.
const thinkTime = 100 * time.Millisecond

// keptFigures is what keptMemory reports: the supervisors' memory
// and their number.
type keptFigures struct {
	PSS       int64
	Processes int
}

// run runs a command in inst and wants exit 0.
func run(ctx context.Context, inst sandbox.Instance, args ...string) error {
	p, err := inst.Exec(ctx, sandbox.Command{Args: args, Env: []string{"PATH=/usr/bin:/bin"}, OutputLimit: 1 << 10})
	if err != nil {
		return err
	}
	exit, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		out, _ := p.ReadOutput(ctx, 0, 1<<10)
		return fmt.Errorf("%s exited %d: %s", strings.Join(args, " "), exit.Code, sandbox.Join(out))
	}
	return nil
}
