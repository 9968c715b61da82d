package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// lockTimeout is the error of an operation that needs a VM's config lock
// while a clone holds it (PVE waits 10 s for the flock, then gives up).
func lockTimeout(vmid int) error {
	return fmt.Errorf("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", vmid)
}

// GET .../config: the config with the digest; integers, numbers and
// booleans as JSON numbers, the rest (memory included) as strings.
func hGetConfig(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
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

// typedValue renders a config value the way PVE's config parser leaves
// it: numbers for integer, number and boolean options.
func typedValue(p *Prop, val string) any {
	if p == nil {
		return val
	}
	switch p.Type {
	case "integer", "boolean":
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			return n
		}
	case "number":
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			return f
		}
	}
	return val
}

// configMeta are parameters of the config calls that are not options.
var configMeta = map[string]bool{
	"node": true, "vmid": true, "delete": true, "digest": true, "skiplock": true,
	"background_delay": true, "revert": true, "force": true,
}

var newDiskRe = regexp.MustCompile(`^([a-z][a-z0-9\-_.]*[a-z0-9]):(\d+(?:\.\d+)?)(,.*)?$`)

// setConfig is POST (a qmconfig task) or PUT (synchronous) .../config.
func setConfig(c *call, async bool) (any, error) {
	s := c.s
	s.mu.Lock()
	v, err := c.loadVM()
	if err == nil {
		err = c.noSkiplock()
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	vmid, node := v.vmid, v.node
	changes := map[string]string{}
	for k := range c.params {
		if !configMeta[k] {
			changes[k] = c.str(k)
		}
	}
	deletes := splitList(c.str("delete"))
	for _, d := range deletes {
		if _, both := changes[d]; both {
			s.mu.Unlock()
			return nil, paramErr("delete", fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", d, d))
		}
	}
	digest := c.str("digest")
	// apply runs with s.mu held.
	apply := func(t *task) error {
		v, ok := s.vms[vmid]
		if !ok || v.node != node {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if v.clones > 0 {
			return lockTimeout(vmid)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if digest != "" && digest != v.digest() {
			return errors.New("detected modified configuration - file changed by other user? Try again.")
		}
		for _, d := range deletes {
			delete(v.conf, d)
			if t != nil {
				t.logf("delete: %s", d)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(changes)) {
			val := changes[k]
			switch {
			case strings.HasPrefix(k, "net"):
				if netMAC(val) == "" {
					val = withNewMAC(val)
				}
			case k == "tags":
				val = normalizeTags(val)
			case diskKeyRe.MatchString(k):
				if m := newDiskRe.FindStringSubmatch(val); m != nil {
					// "local-lvm:4" allocates a new 4 GiB volume.
					size, _ := strconv.ParseFloat(m[2], 64)
					val = fmt.Sprintf("%s:vm-%d-disk-%d,size=%s%s", m[1], vmid, v.nextDiskIndex(), formatSize(int64(size*(1<<30))), m[3])
				}
			}
			v.conf[k] = val
			if t != nil {
				t.logf("update VM %d: -%s %s", vmid, k, val)
			}
		}
		return nil
	}
	if !async {
		defer s.mu.Unlock()
		if err := apply(nil); err != nil {
			return nil, dieErr("%s", err)
		}
		return nil, nil
	}
	upid := s.startTask(c, node, "qmconfig", strconv.Itoa(vmid), func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return apply(t)
	}, nil)
	s.mu.Unlock()
	if !c.has("background_delay") {
		return upid, nil
	}
	// Wait a little for the task: if it ends in time, answer as PUT would.
	deadline := time.Now().Add(time.Duration(c.int("background_delay")) * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		t := s.tasks[upid]
		status, exit := t.status, t.exitstatus
		s.mu.Unlock()
		if status == "stopped" {
			if exit != "OK" {
				return nil, dieErr("%s", exit)
			}
			return nil, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return upid, nil
}

func (v *vm) nextDiskIndex() int {
	i := 0
	for _, k := range v.disks() {
		if strings.Contains(v.conf[k], fmt.Sprintf("vm-%d-disk-", v.vmid)) {
			i++
		}
	}
	return i
}

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
		"vmid": v.vmid, "status": v.status, "qmpstatus": v.status, "cpus": v.vcpus(),
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
		res["mem"] = v.runMem * 2 / 5
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
	v, err := c.loadVM()
	if err == nil {
		err = c.noSkiplock()
	}
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	return s.startTask(c, node, "qmstart", strconv.Itoa(vmid), func(t *task) error {
		return s.startVM(t, vmid, node)
	}, nil), nil
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
		if v.clones > 0 {
			return lockTimeout(vmid)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if v.isTemplate() {
			return errors.New("you can't start a vm if it's a template")
		}
		if v.status == "running" {
			return fmt.Errorf("VM %d already running", vmid)
		}
		n := s.node(node)
		if cpus := v.vcpus(); cpus > n.cpus {
			return fmt.Errorf("MAX %d vcpus allowed per VM on this node", n.cpus)
		}
		for _, k := range slices.Sorted(maps.Keys(v.conf)) {
			if b := netBridge(v.conf[k]); strings.HasPrefix(k, "net") && b != "" && b != "vmbr0" {
				return fmt.Errorf("bridge '%s' does not exist", b)
			}
		}
		used, _ := s.nodeUsage(node)
		need := v.memoryMiB() << 20
		if hostMemBase+used+need > n.mem {
			// What KVM says when the host cannot give the guest its RAM.
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
	cpus, mem, disk, rootfs := v.runCPUs, v.runMem, v.maxDisk(), v.rootfs
	s.mu.Unlock()

	g, err := s.boot(s.ctx, vmid, cpus, mem, disk, rootfs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.vms[vmid] == v && v.guest == nil {
			s.halt(v)
		}
		return fmt.Errorf("start failed: %v", err)
	}
	if s.vms[vmid] != v || v.status != "running" || v.guest != nil || s.closed {
		// Stopped (or the simulator closed) while it was starting.
		go s.destroyGuest(g)
		return nil
	}
	v.guest = g
	return nil
}

// stopVM is POST .../status/stop and .../status/shutdown: the VM stops
// at the end of the task, and everything running in it dies.
func stopVM(c *call, typ string) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err == nil {
		err = c.noSkiplock()
	}
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	return s.startTask(c, node, typ, strconv.Itoa(vmid), func(t *task) error {
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
	}, nil), nil
}

// DELETE .../{vmid}: refused at once while running or protected; a
// qmdestroy task otherwise.
func hDelete(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err == nil {
		err = c.noSkiplock()
	}
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	if v.conf["protection"] == "1" {
		return nil, dieErr("can't remove VM %d - protection mode enabled", vmid)
	}
	if v.status == "running" {
		return nil, dieErr("VM %d is running - destroy failed", vmid)
	}
	return s.startTask(c, node, "qmdestroy", strconv.Itoa(vmid), func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		v, ok := s.vms[vmid]
		if !ok || v.node != node {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if v.clones > 0 {
			return lockTimeout(vmid)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if v.status == "running" {
			return fmt.Errorf("VM %d is running - destroy failed", vmid)
		}
		for _, k := range v.disks() {
			vol := volume(v.conf[k])
			for _, other := range s.vms {
				for _, ok := range other.disks() {
					if base, linked := baseVolume(volume(other.conf[ok])); linked && base == vol {
						return fmt.Errorf("base volume '%s' is still in use by linked cloned", vol)
					}
				}
			}
		}
		for _, k := range v.disks() {
			_, name, _ := strings.Cut(volume(v.conf[k]), ":")
			if i := strings.LastIndexByte(name, '/'); i >= 0 {
				name = name[i+1:]
			}
			t.logf("  Logical volume \"%s\" successfully removed.", name)
		}
		delete(s.vms, vmid)
		return nil
	}, nil), nil
}

// PUT .../resize: a resize task; disks grow, never shrink.
func hResize(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err == nil {
		err = c.noSkiplock()
	}
	if err != nil {
		return nil, err
	}
	vmid, node := v.vmid, v.node
	disk, size, digest := c.str("disk"), c.str("size"), c.str("digest")
	return s.startTask(c, node, "resize", strconv.Itoa(vmid), func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		v, ok := s.vms[vmid]
		if !ok || v.node != node {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		if digest != "" && digest != v.digest() {
			return errors.New("detected modified configuration - file changed by other user? Try again.")
		}
		drive, ok := v.conf[disk]
		if !ok {
			return fmt.Errorf("disk '%s' does not exist", disk)
		}
		if strings.Contains(drive, "media=cdrom") {
			return errors.New("you can't resize a cdrom")
		}
		old := diskSize(drive)
		grow := strings.HasPrefix(size, "+")
		n, _ := parseSize(strings.TrimPrefix(size, "+"))
		newSize := n
		if grow {
			newSize = old + n
		}
		if newSize < old {
			return errors.New("shrinking disks is not supported")
		}
		t.logf("  Size of logical volume changed from %s to %s.", formatSize(old), formatSize(newSize))
		v.conf[disk] = withSize(drive, newSize)
		return nil
	}, nil), nil
}

// POST .../clone: checks at once (PVE's load_and_check before it
// forks), then a qmclone task (its id is the source's vmid). The new VM
// exists from the start, locked "clone", with only the lock in its
// config, like the temporary file PVE writes.
func hClone(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	src, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	vmid, node, newid := src.vmid, src.node, c.int("newid")
	target := c.str("target")
	if target == node || target == "localhost" {
		target = ""
	}
	if pool := c.str("pool"); c.has("pool") && !s.pools[pool] {
		return nil, dieErr("pool '%s' does not exist", pool)
	}
	if target != "" && s.node(target) == nil {
		return nil, dieErr("no such cluster node '%s'", target)
	}
	if storage := c.str("storage"); c.has("storage") && storage != "local-lvm" && storage != "local" {
		return nil, dieErr("storage '%s' does not exist", storage)
	}
	if err := src.checkLock(); err != nil {
		return nil, dieErr("%s", err)
	}
	full := !src.isTemplate()
	if c.has("full") {
		full = c.boolOr("full", false)
	}
	if c.has("storage") && !full {
		return nil, dieErr("parameter 'storage' not allowed for linked clones")
	}
	if c.has("format") && !full {
		return nil, dieErr("parameter 'format' not allowed for linked clones")
	}
	if target != "" {
		return nil, dieErr("can't clone VM to node '%s' (VM uses local storage)", target)
	}
	if _, exists := s.vms[newid]; exists {
		return nil, dieErr("unable to create VM %d: config file already exists", newid)
	}
	conf := map[string]string{}
	for k, val := range src.conf {
		switch {
		case k == "template" || k == "lock" || strings.HasPrefix(k, "unused"):
		case strings.HasPrefix(k, "net"):
			conf[k] = withNewMAC(val)
		default:
			conf[k] = val
		}
	}
	storage := c.str("storage")
	var copies []string
	for i, k := range src.disks() {
		vol, opts, _ := strings.Cut(src.conf[k], ",")
		srcStorage, srcName, _ := strings.Cut(vol, ":")
		if !full && (!strings.HasPrefix(srcName, "base-") || strings.Contains(srcName, "/")) {
			// lvmthin can only clone base volumes (and snapshots).
			return nil, dieErr("Linked clone feature is not supported for drive '%s'", k)
		}
		dstStorage := srcStorage
		if storage != "" {
			dstStorage = storage
		}
		newVol := fmt.Sprintf("%s:vm-%d-disk-%d", dstStorage, newid, i)
		kind := "full"
		if !full {
			newVol = fmt.Sprintf("%s:%s/vm-%d-disk-%d", srcStorage, srcName, newid, i)
			kind = "linked"
		}
		conf[k] = newVol + "," + opts
		copies = append(copies, fmt.Sprintf("create %s clone of drive %s (%s)", kind, k, vol))
	}
	conf["smbios1"] = "uuid=" + uuid()
	if _, ok := conf["vmgenid"]; ok {
		conf["vmgenid"] = uuid()
	}
	if name := c.str("name"); name != "" {
		conf["name"] = name
	} else {
		conf["name"] = "Copy-of-VM-" + src.conf["name"]
	}
	if d := c.str("description"); d != "" {
		conf["description"] = d
	}
	nv := &vm{vmid: newid, node: node, conf: map[string]string{"lock": "clone"}, status: "stopped", rootfs: src.rootfs}
	s.vms[newid] = nv
	src.clones++
	release := func() {
		if s.vms[vmid] == src {
			src.clones--
		}
	}
	return s.startTask(c, node, "qmclone", strconv.Itoa(vmid), func(t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		release()
		if s.vms[newid] != nv {
			return fmt.Errorf("clone failed: VM %d vanished", newid)
		}
		for _, line := range copies {
			t.logf("%s", line)
		}
		nv.conf = conf
		return nil
	}, func() {
		release()
		if s.vms[newid] == nv {
			delete(s.vms, newid)
		}
	}), nil
}
