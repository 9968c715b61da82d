package pvesim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GET .../status/current
func hStatusCurrent(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	res := map[string]any{
		"vmid": v.vmid, "status": v.status, "qmpstatus": v.qmpStatus(), "cpus": v.vcpus(),
		"maxmem": v.memoryMiB() << 20, "mem": 0, "maxdisk": v.maxDisk(), "disk": 0, "cpu": 0,
		"uptime": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
		"ha": map[string]any{"managed": 0},
	}
	if name := v.conf["name"]; name != "" {
		res["name"] = name
	}
	if l := v.conf["lock"]; l != "" {
		res["lock"] = l
	}
	if t := v.conf["tags"]; t != "" {
		res["tags"] = t
	}
	if v.isTemplate() {
		res["template"] = 1
	}
	if v.agentEnabled() {
		res["agent"] = 1
	}
	if v.status == "running" {
		res["pid"] = v.pid
		res["uptime"] = int64(time.Since(v.started).Seconds())
		res["mem"] = guestUse(v.runMem)
		res["cpu"] = 0.02
		res["running-qemu"] = "9.2.0"
		res["running-machine"] = "pc-i440fx-9.2+pve1"
	}
	return res, nil
}

// POST .../status/start: a qmstart task. "Already running", templates,
// locks and a node without room fail the task, not the request.
func hStart(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVMToChange()
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	return s.runTask(c, taskSpec{node: node, typ: "qmstart", id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}},
		work:  func(t *task) error { return s.startVM(t, vmid, node) }}), nil
}

// startVM is the start task's work.
func (s *Server) startVM(t *task, vmid int, node string) error {
	s.mu.Lock()
	v, ok := s.vms[vmid]
	if !ok || v.node != node {
		s.mu.Unlock()
		return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
	}
	err := func() error {
		if err := v.checkLock(); err != nil {
			return err
		}
		if v.isTemplate() {
			return errors.New("you can't start a vm if it's a template")
		}
		if v.status == "running" {
			return fmt.Errorf("VM %d already running", vmid)
		}
		v.applyPending()
		n := s.node(node)
		if cpus := v.vcpus(); cpus > n.cpus {
			return fmt.Errorf("MAX %d vcpus allowed per VM on this node", n.cpus)
		}
		for _, k := range slices.Sorted(maps.Keys(v.conf)) {
			if b := netBridge(v.conf[k]); strings.HasPrefix(k, "net") && b != "" && !s.hasBridge(node, b) {
				return fmt.Errorf("bridge '%s' does not exist", b)
			}
		}
		// qemu-server does not refuse a start for lack of free memory (no
		// such check in vm_start or config_to_command): QEMU maps guest RAM
		// lazily and the kernel's heuristic overcommit lets it, unless the
		// guest alone is larger than the host's RAM.
		if need := v.memoryMiB() << 20; need > n.mem {
			t.logf("kvm: cannot set up guest memory 'pc.ram': Cannot allocate memory")
			return errors.New("start failed: QEMU exited with code 1")
		}
		return nil
	}()
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.pidSeq += 1 + s.rng.IntN(7)
	v.status, v.started, v.pid = "running", time.Now(), s.pidSeq
	v.runMem, v.runCPUs = v.memoryMiB()<<20, v.vcpus()
	cpus, mem, disk, rootfs, blocked := v.runCPUs, v.runMem, v.maxDisk(), v.rootfs, v.agentDisabled
	nic := slices.ContainsFunc(slices.Collect(maps.Keys(v.conf)), netKeyRe().MatchString)
	s.mu.Unlock()

	g, err := s.boot(s.ctx, vmid, cpus, mem, disk, rootfs, blocked, nic)
	s.mu.Lock()
	if err != nil {
		if s.vms[vmid] == v && v.guest == nil {
			s.halt(v)
		}
		s.mu.Unlock()
		return fmt.Errorf("start failed: %v", err)
	}
	if s.vms[vmid] != v || v.status != "running" || v.guest != nil || s.closed {
		// Stopped (or the simulator closed) while it was starting.
		s.mu.Unlock()
		s.destroyGuest(g)
		return nil
	}
	v.guest = g
	s.mu.Unlock()
	return nil
}

// stopVM is POST .../status/stop and .../status/shutdown: the VM stops
// at the end of the task, and everything running in it dies.
func stopVM(c *call, typ string) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVMToChange()
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	return s.runTask(c, taskSpec{node: node, typ: typ, id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node {
				s.mu.Unlock()
				return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
			}
			if err := v.checkLock(); err != nil {
				s.mu.Unlock()
				return err
			}
			if v.status != "running" {
				s.mu.Unlock()
				return nil
			}
			g := s.halt(v)
			s.mu.Unlock()
			s.destroyGuest(g)
			return nil
		}}), nil
}

// POST .../status/reboot: refused at once when the VM does not run
// (qemu-server vm_reboot); the qmreboot task shuts the guest down and
// starts it again, so everything that ran in it is gone and its agent
// answers again after a boot.
func hReboot(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	if v.status != "running" {
		return nil, dieErr("VM %d not running", v.vmid)
	}
	vmid, node := v.vmid, v.node
	return s.runTask(c, taskSpec{node: node, typ: "qmreboot", id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node {
				s.mu.Unlock()
				return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
			}
			if err := v.checkLock(); err != nil {
				s.mu.Unlock()
				return err
			}
			if v.status != "running" {
				s.mu.Unlock()
				return fmt.Errorf("VM %d not running", vmid)
			}
			g := s.halt(v)
			s.mu.Unlock()
			s.destroyGuest(g)
			return s.startVM(t, vmid, node)
		}}), nil
}

// vmListEntry is a VM's entry of qemu-server's vmstatus, as GET
// /nodes/{node}/qemu gives it (qmpstatus and the running QEMU only with
// full). Call with s.mu held.
func (s *Server) vmListEntry(v *vm, full bool) map[string]any {
	name := v.conf["name"]
	if name == "" {
		name = "VM " + strconv.Itoa(v.vmid)
	}
	e := map[string]any{
		"vmid": v.vmid, "status": v.status, "name": name, "cpus": min(s.guestCPUs(v), s.node(v.node).cpus),
		"maxmem": v.memoryMiB() << 20, "maxdisk": v.maxDisk(), "disk": 0,
		"uptime": 0, "cpu": 0, "mem": 0, "memhost": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if v.isTemplate() {
		e["template"] = 1
	}
	if l := v.conf["lock"]; l != "" {
		e["lock"] = l
	}
	if t, ok := v.conf["tags"]; ok {
		e["tags"] = t
	}
	if v.status == "running" {
		e["pid"] = v.pid
		e["uptime"] = int64(time.Since(v.started).Seconds())
		e["mem"] = guestUse(v.runMem)
		e["memhost"] = guestUse(v.runMem)
		e["cpu"] = 0.02
	}
	if full {
		e["qmpstatus"] = v.qmpStatus()
		if v.status == "running" {
			e["running-qemu"] = "9.2.0"
			e["running-machine"] = "pc-i440fx-9.2+pve1"
		}
	}
	return e
}

// GET /nodes/{node}/qemu: the node's VMs (templates too) the caller may
// audit.
func hVMList(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(s.vms)) {
		v := s.vms[id]
		if v.ct || v.node != c.str("node") || s.access.check(c.authid, "/vms/"+strconv.Itoa(id), "VM.Audit") != nil {
			continue
		}
		out = append(out, s.vmListEntry(v, c.boolOr("full", false)))
	}
	return out, nil
}

// qmpStatus is QEMU's own state of the VM: "paused" for a suspended VM
// that Proxmox lists as running (qemu-server's vmstatus, from QMP's
// query-status).
func (v *vm) qmpStatus() string {
	if v.status == "running" && v.paused {
		return "paused"
	}
	return v.status
}

// hSuspend is POST .../status/suspend, a qmsuspend task: a running VM's
// vCPUs stop, its RAM kept (qemu-server's vm_suspend, QMP "stop"; "VM N
// not running" otherwise); its guest agent does not answer while it is
// paused. Hibernation (todisk) is not simulated: refused, saying so.
func hSuspend(c *call) (any, error) {
	return pauseVM(c, "qmsuspend", true)
}

// hResume is POST .../status/resume, a qmresume task: a suspended VM
// goes on (qemu-server's vm_resume, QMP "cont"); resuming a VM that runs
// changes nothing. "VM N not running" for a stopped one.
func hResume(c *call) (any, error) {
	return pauseVM(c, "qmresume", false)
}

func pauseVM(c *call, typ string, pause bool) (any, error) {
	s := c.s
	if pause && c.boolOr("todisk", false) {
		return nil, errors.New("pvesim: suspend to disk (hibernation) is not simulated")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVMToChange()
	if err != nil {
		return nil, err
	}
	if v.status != "running" {
		return nil, dieErr("VM %d not running", v.vmid)
	}
	vmid, node := v.vmid, v.node
	return s.runTask(c, taskSpec{node: node, typ: typ, id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node || v.status != "running" || v.guest == nil {
				s.mu.Unlock()
				return fmt.Errorf("VM %d not running", vmid)
			}
			g := v.guest
			v.paused = pause
			s.mu.Unlock()
			pz, ok := g.sb.(interface {
				Pause(context.Context) error
				Resume(context.Context) error
			})
			if !ok {
				return errors.New("pvesim: this host cannot freeze a guest (no cgroup freezer)")
			}
			if pause {
				return pz.Pause(s.ctx)
			}
			return pz.Resume(s.ctx)
		}}), nil
}
