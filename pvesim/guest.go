package pvesim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// guest is a running VM's inside: a sandbox of its own, with the guest
// agent (the real qemu-ga under a small init, or its emulation) as its
// one process. Stopping the VM destroys the sandbox, and with it
// everything the guest ran.
type guest struct {
	sb     sandbox.Instance
	agent  guestAgent
	bootAt time.Time // when the boot ends and the agent may answer
	vmid   int
	// disk is its VM's disk on the host (vmdisk.go); nil where disks
	// are not modelled. Once the guest is halted, saveDisk saves it.
	disk     *guestDisk
	saveDisk func()
}

// guestAgent is the QEMU guest agent of a running guest: the real
// qemu-ga (qgareal.go) or, where it is not installed, the shell
// emulation (qga.go).
type guestAgent interface {
	ping(ctx context.Context, timeout time.Duration) error
	exec(ctx context.Context, argv []string, input []byte) (int, error)
	execStatus(ctx context.Context, pid int) (execStatus, error)
	// fileRead reads at most count bytes from offset, and says whether
	// it reached the end of the file.
	fileRead(ctx context.Context, path string, offset, count int64) ([]byte, bool, error)
	fileWrite(ctx context.Context, path string, data []byte) error
	info(ctx context.Context) (map[string]any, error)
	// restart stops the agent as stopping its service would; the guest
	// starts it again.
	restart(ctx context.Context) error
	exited() bool
	close()
}

// boot creates the guest of a VM being started (outside s.mu: creating a
// sandbox takes a while). The VM's memory and vCPUs size the sandbox;
// its disk size sizes /workspace. blocked are the agent commands the
// guest's qemu-ga does not allow.
func (s *Server) boot(ctx context.Context, vmid int, cpus int, memBytes, diskBytes int64, rootfs string, blocked []string, nic bool) (*guest, error) {
	if diskBytes <= 0 {
		diskBytes = 1 << 30
	}
	spec := sandbox.Spec{
		JobID:       fmt.Sprintf("pvesim-vm-%d", vmid),
		CPU:         float64(cpus),
		MemoryBytes: memBytes,
		DiskBytes:   diskBytes,
		Template:    rootfs,
		DiskVar:     true, // /var on the VM's disk, as a Debian guest's
		// /tmp is RAM, half the VM's memory at most, as on Debian 13:
		// systemd's units/tmp.mount (size=50%, nr_inodes=1m), which
		// Debian 13 enables (trixie's release notes, "/tmp as tmpfs").
		TmpBytes: memBytes / 2,
	}
	if nic && s.guestDir != "" {
		// Its network is the simulator's (network.go).
		spec.Network, spec.Egress = true, &sandbox.Egress{Token: strconv.Itoa(vmid)}
	}
	sb, err := s.backend.Create(ctx, spec)
	if err != nil && spec.Network {
		s.log.Warn("pvesim: a guest with a NIC cannot have a network of its own here: it boots without one", "vmid", vmid, "err", err)
		spec.Network, spec.Egress = false, nil
		sb, err = s.backend.Create(ctx, spec)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.sandboxes[sb.ID()] = true
	s.mu.Unlock()
	var disk *guestDisk
	if s.disks.dir != "" {
		d, err := s.hostDisk(sb.ID())
		if err == nil {
			unlock := s.disks.lock(vmid)
			err = s.disks.restore(vmid, d)
			unlock()
		}
		if err != nil {
			s.dropSandbox(sb.ID())
			return nil, err
		}
		disk = &d
	}
	var agent guestAgent
	if s.agentBin != "" {
		agent, err = startRealAgent(ctx, sb, filepath.Join(s.guestDir, sb.ID(), "workspace"), s.agentBin, blocked)
	} else {
		agent, err = startAgent(ctx, sb, blocked)
	}
	if err != nil {
		s.dropSandbox(sb.ID())
		return nil, err
	}
	return &guest{sb: sb, agent: agent, bootAt: time.Now().Add(s.opts.BootDelay), vmid: vmid, disk: disk}, nil
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
// it with destroyGuest once it released s.mu, which saves its disk: the
// VM's disk is locked until then, so that a start waits for it. Call
// with s.mu held.
func (s *Server) halt(v *vm) *guest {
	g := v.guest
	if g != nil && g.disk != nil {
		unlock := s.disks.lock(v.vmid)
		g.saveDisk = func() {
			defer unlock()
			if err := s.disks.save(g.vmid, *g.disk); err != nil {
				s.log.Error("pvesim: save a guest's disk", "vmid", g.vmid, "err", err)
			}
		}
	}
	v.guest = nil
	v.status = "stopped"
	v.paused = false
	v.pid = 0
	return g
}

// destroyGuest saves a halted guest's disk and destroys its sandbox
// (without s.mu held).
func (s *Server) destroyGuest(g *guest) {
	if g != nil {
		g.agent.close()
		if g.saveDisk != nil {
			g.saveDisk()
		}
		s.dropSandbox(g.sb.ID())
	}
}

var errAgentNotRunning = errors.New("QEMU guest agent is not running")

// agentUp tells whether a running VM's guest agent may answer: the guest
// has booted, no fault keeps the agent down, and its process lives. Call
// with s.mu held.
func (s *Server) agentUp(v *vm) error {
	g := v.guest
	if g == nil || v.paused || time.Now().Before(g.bootAt) || s.faults.AgentDown || g.agent.exited() {
		return errAgentNotRunning // a paused VM's agent is frozen with it
	}
	return nil
}

// pingAgent is qemu-server's qga_check_running: guest-ping with a 3 s
// time-out (Options.AgentPingTimeout). A guest that is still booting, or
// whose agent is down, does not answer: the ping waits the whole time-out
// (QEMU's chardev takes the command; nobody reads it), holding its
// pvedaemon worker. Call without s.mu held.
func (s *Server) pingAgent(ctx context.Context, vmid int) error {
	s.mu.Lock()
	v, ok := s.vms[vmid]
	var g *guest
	up := errAgentNotRunning
	if ok {
		g, up = v.guest, s.agentUp(v)
	}
	s.mu.Unlock()
	if up != nil {
		select {
		case <-time.After(s.opts.AgentPingTimeout):
		case <-ctx.Done():
		}
		return errAgentTimeout
	}
	// An agent that is up has PVE's whole 3 s to answer, whatever the
	// profile (a loaded test host may take more than the fast profile's
	// wait for a booting guest).
	return g.agent.ping(ctx, 3*time.Second)
}

// RestartAgent stops a running VM's guest agent as stopping its service
// would (qemu-ga and what it started in its process group die: the
// simulator's stand-in for the service's cgroup; what left the group
// with setsid lives on), and the guest starts it again. It needs the real
// qemu-ga.
func (s *Server) RestartAgent(ctx context.Context, vmid int) error {
	s.mu.Lock()
	v, ok := s.vms[vmid]
	var g *guest
	if ok {
		g = v.guest
	}
	s.mu.Unlock()
	if g == nil {
		return fmt.Errorf("pvesim: VM %d does not run", vmid)
	}
	return g.agent.restart(ctx)
}
