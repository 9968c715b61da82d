package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Containers (pve-container src/PVE/API2/LXC.pm, LXC/Status.pm,
// LXC/Config.pm). A container shares the VMs' id space and their
// config locks, and has a status, a config, tasks and locks like a VM.
// It runs nothing: the API has no exec for containers (pct exec is
// lxc-attach on the node, not an API call), so nothing a client does
// through the API could observe what runs inside one.

// ContainerSpec describes a container made by AddContainer (what
// "pct create" would have made).
type ContainerSpec struct {
	Cores     int    // 0: no limit (the node's cores)
	MemoryMiB int    // default 512
	SwapMiB   int    // default 512
	DiskSize  string // rootfs size, default "8G"
	// Storage holds its root disk; default local-lvm.
	Storage string
	// OSTemplate is what it was made from, for ostype; default Debian 12's.
	OSTemplate string
	Tags       string
	// Privileged makes a privileged container (unprivileged is the
	// default of a new container).
	Privileged bool
	// Template makes it a container template (vzdump base).
	Template bool
	// Running starts it at once (as if started on boot).
	Running bool
}

// AddContainer creates an LXC container on a node, as "pct create" makes
// one from a template archive.
func (s *Server) AddContainer(node string, vmid int, hostname string, spec ContainerSpec) error {
	if err := formats["pve-vmid"](strconv.Itoa(vmid)); err != nil {
		return fmt.Errorf("pvesim: vmid %d: %s", vmid, strings.TrimSpace(err.Error()))
	}
	if err := dnsName(hostname); err != nil {
		return fmt.Errorf("pvesim: hostname %q: %s", hostname, strings.TrimSpace(err.Error()))
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 512
	}
	if spec.SwapMiB == 0 {
		spec.SwapMiB = 512
	}
	if spec.DiskSize == "" {
		spec.DiskSize = "8G"
	}
	if spec.Storage == "" {
		spec.Storage = "local-lvm"
	}
	if spec.OSTemplate == "" {
		spec.OSTemplate = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
	}
	size, ok := parseSize(spec.DiskSize)
	if !ok {
		return fmt.Errorf("pvesim: disk size %q", spec.DiskSize)
	}
	if spec.Template && spec.Running {
		return errors.New("pvesim: a container template does not run")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(node) == nil {
		return fmt.Errorf("pvesim: no node %q", node)
	}
	if _, exists := s.vms[vmid]; exists {
		return fmt.Errorf("pvesim: VMID %d exists", vmid)
	}
	st := s.storage(spec.Storage)
	switch {
	case st == nil:
		return fmt.Errorf("pvesim: no storage %q", spec.Storage)
	case !st.hasContent("rootdir"):
		return fmt.Errorf("pvesim: storage %s does not hold container volumes (content %s)", st.id, st.content)
	}
	kind := "full"
	if spec.Template {
		kind = "base"
	}
	ostype := "debian"
	if _, file, ok := strings.Cut(spec.OSTemplate, "/"); ok {
		ostype, _, _ = strings.Cut(file, "-")
	}
	conf := map[string]string{
		"arch":     "amd64",
		"hostname": hostname,
		"memory":   strconv.Itoa(spec.MemoryMiB),
		"swap":     strconv.Itoa(spec.SwapMiB),
		"net0":     "name=eth0,bridge=vmbr0,firewall=1,hwaddr=" + randomMAC() + ",ip=dhcp,type=veth",
		"ostype":   ostype,
		"rootfs":   fmt.Sprintf("%s:%s,size=%s", st.id, st.volName(kind, vmid, 0, ""), formatSize(size)),
	}
	if spec.Cores > 0 {
		conf["cores"] = strconv.Itoa(spec.Cores)
	}
	if !spec.Privileged {
		conf["unprivileged"] = "1"
		conf["features"] = "nesting=1"
	}
	if spec.Tags != "" {
		conf["tags"] = normalizeTags(spec.Tags)
	}
	if spec.Template {
		conf["template"] = "1"
	}
	v := &vm{vmid: vmid, node: node, ct: true, conf: conf, status: "stopped"}
	s.vms[vmid] = v
	if spec.Running {
		s.runCT(v)
	}
	return nil
}

// ctConfigFile is where PVE keeps a container's config.
func ctConfigFile(node string, vmid int) string {
	return fmt.Sprintf("nodes/%s/lxc/%d.conf", node, vmid)
}

// loadCT is PVE::LXC::Config->load_config on the node a call runs on.
// Call with s.mu held.
func (c *call) loadCT() (*vm, error) {
	node, vmid := c.str("node"), c.int("vmid")
	v, ok := c.s.vms[vmid]
	if !ok || v.node != node || !v.ct {
		return nil, dieErr("Configuration file '%s' does not exist", ctConfigFile(node, vmid))
	}
	return v, nil
}

// ctName is what vmstatus calls a container: its hostname (without
// blanks), else "CT<vmid>".
func ctName(v *vm) string {
	if h := strings.Join(strings.Fields(v.conf["hostname"]), ""); h != "" {
		return h
	}
	return "CT" + strconv.Itoa(v.vmid)
}

// guestCPUs is vmstatus' cpus: a VM's sockets x cores; a container's
// cores (or cpulimit), else every core of its node. Call with s.mu held.
func (s *Server) guestCPUs(v *vm) int {
	if !v.ct {
		return v.vcpus()
	}
	for _, k := range []string{"cores", "cpulimit"} {
		if f, err := strconv.ParseFloat(v.conf[k], 64); err == nil && f > 0 {
			return max(1, int(f+0.999))
		}
	}
	if n := s.node(v.node); n != nil {
		return n.cpus
	}
	return 1
}

// runCT marks a container running. Call with s.mu held.
func (s *Server) runCT(v *vm) {
	s.pidSeq += 1 + s.rng.IntN(7)
	v.status, v.started, v.pid = "running", time.Now(), s.pidSeq
	v.runMem, v.runCPUs = v.memoryMiB()<<20, s.guestCPUs(v)
}

// ctStatus is a container's entry of PVE::LXC::vmstatus, as GET
// /nodes/{node}/lxc and status/current give it. Call with s.mu held.
func (s *Server) ctStatus(v *vm) map[string]any {
	maxdisk := diskSize(v.conf["rootfs"])
	if maxdisk == 0 {
		maxdisk = 4 << 30
	}
	swap, _ := strconv.ParseInt(v.conf["swap"], 10, 64)
	e := map[string]any{
		"vmid": v.vmid, "type": "lxc", "status": v.status, "name": ctName(v), "cpus": s.guestCPUs(v),
		"maxmem": v.memoryMiB() << 20, "maxswap": swap << 20, "maxdisk": maxdisk, "disk": 0,
		"mem": 0, "swap": 0, "uptime": 0, "cpu": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if t, ok := v.conf["tags"]; ok {
		e["tags"] = t
	}
	if v.isTemplate() {
		e["template"] = 1
	}
	if l := v.conf["lock"]; l != "" {
		e["lock"] = l
	}
	if v.status == "running" {
		e["pid"] = v.pid
		e["uptime"] = int64(time.Since(v.started).Seconds())
		e["mem"] = guestUse(v.runMem) / 4 // a container holds only its processes' memory
		e["disk"] = maxdisk / 5
		e["cpu"] = 0.01
	}
	return e
}

// GET /nodes/{node}/lxc: the node's containers the caller may audit.
func hCTList(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(s.vms)) {
		v := s.vms[id]
		if !v.ct || v.node != c.str("node") || s.access.check(c.authid, "/vms/"+strconv.Itoa(id), "VM.Audit") != nil {
			continue
		}
		out = append(out, s.ctStatus(v))
	}
	return out, nil
}

// GET /nodes/{node}/lxc/{vmid}/status/current
func hCTStatus(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	e := s.ctStatus(v)
	e["ha"] = map[string]any{"managed": 0}
	return e, nil
}

// GET /nodes/{node}/lxc/{vmid}/config
func hCTConfig(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	out := map[string]any{"digest": v.digest()}
	var props map[string]*Prop
	if c.m.Returns != nil {
		props = c.m.Returns.Properties
	}
	for k, val := range v.conf {
		out[k] = typedValue(props[k], val)
	}
	return out, nil
}

// ctTask runs a container's power task: it takes the config lock (10 s),
// reloads the config and does work with s.mu held.
func (c *call) ctTask(v *vm, typ string, work func(t *task, v *vm) error) string {
	s := c.s
	vmid, node := v.vmid, v.node
	return s.runTask(c, taskSpec{node: node, typ: typ, id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			v, ok := s.vms[vmid]
			if !ok || v.node != node || !v.ct {
				return fmt.Errorf("Configuration file '%s' does not exist", ctConfigFile(node, vmid))
			}
			return work(t, v)
		}})
}

// POST .../lxc/{vmid}/status/start: "already running" is refused at once
// (unlike a VM's start, which fails its task); a template fails the task.
func hCTStart(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	if err := c.noSkiplock(); err != nil {
		return nil, err
	}
	if v.status == "running" {
		return nil, dieErr("CT %d already running", v.vmid)
	}
	return c.ctTask(v, "vzstart", func(t *task, v *vm) error {
		if v.isTemplate() {
			return errors.New("you can't start a CT if it's a template")
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if v.status == "running" {
			return fmt.Errorf("CT %d already running", v.vmid)
		}
		s.runCT(v)
		return nil
	}), nil
}

// stopCT is POST .../lxc/{vmid}/status/stop and .../shutdown: refused at
// once when the container does not run.
func stopCT(c *call, typ string) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	if err := c.noSkiplock(); err != nil {
		return nil, err
	}
	if v.status != "running" {
		return nil, dieErr("CT %d not running", v.vmid)
	}
	return c.ctTask(v, typ, func(t *task, v *vm) error {
		if err := v.checkLock(); err != nil {
			return err
		}
		s.halt(v)
		return nil
	}), nil
}

// POST .../lxc/{vmid}/status/reboot: refused at once when it does not
// run (in the words of pve-container, which say "VM" here); the task
// stops and starts it.
func hCTReboot(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	if v.status != "running" {
		return nil, dieErr("VM %d not running", v.vmid)
	}
	return c.ctTask(v, "vzreboot", func(t *task, v *vm) error {
		if v.status != "running" {
			return fmt.Errorf("CT %d not running", v.vmid)
		}
		s.halt(v)
		s.runCT(v)
		return nil
	}), nil
}

// DELETE /nodes/{node}/lxc/{vmid}: protection, the lock and a running
// container (without force) are refused at once and again in the
// vzdestroy task; with force a running container is stopped first.
func hCTDelete(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadCT()
	if err != nil {
		return nil, err
	}
	vmid := v.vmid
	force := c.boolOr("force", false)
	early := func(v *vm) error {
		if v.conf["protection"] == "1" {
			return fmt.Errorf("can't remove CT %d - protection mode enabled", vmid)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if v.status == "running" && !force {
			return fmt.Errorf("unable to destroy CT %d - container is running", vmid)
		}
		return nil
	}
	if err := early(v); err != nil {
		return nil, dieErr("%s", err)
	}
	return c.ctTask(v, "vzdestroy", func(t *task, v *vm) error {
		if err := early(v); err != nil {
			return err
		}
		if v.status == "running" {
			t.logf("forced to stop CT %d before destroying!", vmid)
			s.halt(v)
		}
		for _, k := range v.disks() {
			sid, name, _ := strings.Cut(volumeID(v.conf[k]), ":")
			if st := s.storage(sid); st != nil && (st.typ == "lvm" || st.typ == "lvmthin") {
				t.logf("  Logical volume \"%s\" successfully removed.", name)
			}
		}
		delete(s.vms, vmid)
		s.access.dropVM(vmid)
		return nil
	}), nil
}
