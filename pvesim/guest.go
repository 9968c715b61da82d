package pvesim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// guest is a running VM's inside: a sandbox of its own, with the guest
// agent as its one process. Stopping the VM destroys the sandbox, and
// with it everything the guest ran.
type guest struct {
	sb     sandbox.Sandbox
	agent  *qga
	bootAt time.Time // when the boot ends and the agent may answer
}

// boot creates the guest of a VM being started (outside s.mu: creating a
// sandbox takes a while). The VM's memory and vCPUs size the sandbox;
// its disk size sizes /workspace.
func (s *Server) boot(ctx context.Context, vmid int, cpus int, memBytes, diskBytes int64, rootfs string) (*guest, error) {
	if diskBytes <= 0 {
		diskBytes = 1 << 30
	}
	sb, err := s.backend.Create(ctx, sandbox.Spec{
		JobID:       fmt.Sprintf("pvesim-vm-%d", vmid),
		CPU:         float64(cpus),
		MemoryBytes: memBytes,
		DiskBytes:   diskBytes,
		Template:    rootfs,
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.sandboxes[sb.ID()] = true
	s.mu.Unlock()
	agent, err := startAgent(ctx, sb)
	if err != nil {
		s.dropSandbox(sb.ID())
		return nil, err
	}
	return &guest{sb: sb, agent: agent, bootAt: time.Now().Add(s.opts.BootDelay)}, nil
}

func (s *Server) dropSandbox(id string) {
	if err := s.backend.Destroy(context.Background(), id); err != nil {
		s.log.Error("pvesim: destroy guest sandbox", "sandbox", id, "err", err)
	}
	s.mu.Lock()
	delete(s.sandboxes, id)
	s.mu.Unlock()
}

// halt marks a VM stopped and takes its guest away; the caller destroys
// it with destroyGuest once it released s.mu. Call with s.mu held.
func (s *Server) halt(v *vm) *guest {
	g := v.guest
	v.guest = nil
	v.status = "stopped"
	v.pid = 0
	return g
}

// destroyGuest destroys a halted guest's sandbox (without s.mu held).
func (s *Server) destroyGuest(g *guest) {
	if g != nil {
		s.dropSandbox(g.sb.ID())
	}
}

var errAgentNotRunning = errors.New("QEMU guest agent is not running")

// agentUp tells whether a running VM's guest agent answers: the guest has
// booted, no fault keeps the agent down, and its process lives. Call
// with s.mu held.
func (s *Server) agentUp(v *vm) error {
	g := v.guest
	if g == nil || time.Now().Before(g.bootAt) || s.faults.AgentDown || g.agent.exited() {
		return errAgentNotRunning
	}
	return nil
}
