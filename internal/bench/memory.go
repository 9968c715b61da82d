package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/sandbox"
)

// memoryReporter is a backend that can measure its sandboxes'
// supervisors (the local one).
type memoryReporter interface {
	SupervisorMemory() (local.SupervisorMemory, error)
}

// SupervisorMemory measures the supervisors of the sandboxes b runs now:
// the memory each running sandbox adds besides its job. ok is false for
// a backend that has no such processes (Proxmox).
func SupervisorMemory(b sandbox.Backend) (m local.SupervisorMemory, ok bool, err error) {
	r, ok := b.(memoryReporter)
	if !ok {
		return m, false, nil
	}
	m, err = r.SupervisorMemory()
	return m, true, err
}

// sandboxMemory starts n sandboxes whose job sleeps, measures their
// supervisors once every job runs, and ends them.
func sandboxMemory(ctx context.Context, b sandbox.Backend, n int) (local.SupervisorMemory, error) {
	var procs []sandbox.Process
	var boxes []sandbox.Instance
	defer func() {
		for _, p := range procs {
			p.Kill(ctx)
		}
		for _, sb := range boxes {
			sb.Destroy(ctx)
		}
	}()
	for range n {
		sb, err := b.Create(ctx, sandbox.Spec{JobID: "bench", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20})
		if err != nil {
			return local.SupervisorMemory{}, err
		}
		boxes = append(boxes, sb)
		p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo up; exec sleep 600"}, Env: []string{"PATH=/usr/bin:/bin"}, OutputLimit: 1 << 10})
		if err != nil {
			return local.SupervisorMemory{}, err
		}
		procs = append(procs, p)
	}
	// Running: each job has said so.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for {
			out, err := p.ReadOutput(ctx, 0, 16)
			if err != nil {
				return local.SupervisorMemory{}, err
			}
			if strings.HasPrefix(string(sandbox.Join(out)), "up") {
				break
			}
			if time.Now().After(deadline) {
				return local.SupervisorMemory{}, errors.New("the sleeping jobs did not start within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	m, ok, err := SupervisorMemory(b)
	if err == nil && !ok {
		err = fmt.Errorf("the %s backend has no sandbox supervisors to measure", b.Name())
	}
	if err == nil && m.Sandboxes != n {
		err = fmt.Errorf("measured the supervisors of %d sandboxes, want %d", m.Sandboxes, n)
	}
	return m, err
}
