package pvesim

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// cloneSource is the result of clone_vm's $load_and_check.
type cloneSource struct {
	src    *vm
	full   bool
	drives []cloneDrive
}

type cloneDrive struct {
	key, vol, opts string
	st             *storage
	full           bool
}

// cloneCheck is qemu-server's clone_vm $load_and_check (src/PVE/API2/
// Qemu.pm), run when the request comes and again by the task once it
// holds its locks: the pool, target node and storage exist; the source
// is not locked; storage and format only for full clones; the caller may
// allocate space on each disk's storage and use each NIC's bridge; a
// target node needs every disk on shared storage; the new config must not
// exist on this node; each disk must support the clone (linked) or copy
// (full) feature. Call with s.mu held.
func (c *call) cloneCheck() (*cloneSource, error) {
	s := c.s
	uc := s.access
	vmid, newid := c.int("vmid"), c.int("newid")
	node, target := c.str("node"), c.target()
	if c.has("pool") && uc.pools[c.str("pool")] == nil {
		return nil, permErr(fmt.Sprintf("pool '%s' does not exist", c.str("pool")))
	}
	if target != "" && s.node(target) == nil {
		return nil, dieErr("no such cluster node '%s'", target)
	}
	var dst *storage
	if c.has("storage") {
		if dst = s.storage(c.str("storage")); dst == nil {
			return nil, dieErr("storage '%s' does not exist", c.str("storage"))
		}
		if !dst.hasContent("images") {
			return nil, paramErr("storage", fmt.Sprintf("storage '%s' does not support vm images", dst.id))
		}
		if target != "" && !dst.shared {
			return nil, dieErr("can't clone to non-shared storage '%s'", dst.id)
		}
	}
	src, ok := s.vms[vmid]
	if !ok || src.node != node || src.ct {
		return nil, dieErr("Configuration file '%s' does not exist", configFile(node, vmid))
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
	// $check_storage_access_clone
	shared := true
	for _, k := range src.driveKeys() {
		drive := src.conf[k]
		vol := volumeID(drive)
		if vol == "" || vol == "none" {
			continue
		}
		if isCDROM(drive) {
			if vol == "cdrom" {
				if err := uc.check(c.authid, "/", "Sys.Console"); err != nil {
					return nil, err
				}
			} else if st := s.storage(storageOf(vol)); st != nil && !st.shared {
				shared = false
			}
			continue
		}
		sid := storageOf(vol)
		if st := s.storage(sid); st == nil || !st.shared {
			shared = false
		}
		if dst != nil {
			sid = dst.id
		}
		if err := uc.check(c.authid, "/storage/"+sid, "Datastore.AllocateSpace"); err != nil {
			return nil, err
		}
	}
	if err := c.checkBridges(src.conf); err != nil {
		return nil, err
	}
	if target != "" && !shared {
		return nil, dieErr("can't clone VM to node '%s' (VM uses local storage)", target)
	}
	if other, exists := s.vms[newid]; exists && other.node == node && !other.ct {
		return nil, dieErr("unable to create VM %d: config file already exists", newid)
	}
	out := &cloneSource{src: src, full: full}
	for _, k := range src.disks() {
		vol, opts, _ := strings.Cut(src.conf[k], ",")
		sid, name, _ := strings.Cut(vol, ":")
		st := s.storage(sid)
		if st == nil {
			return nil, dieErr("storage '%s' does not exist", sid)
		}
		if !full && !st.canLinkClone(parseVolname(name)) {
			return nil, dieErr("Linked clone feature is not supported for '%s' (%s)", vol, k)
		}
		out.drives = append(out.drives, cloneDrive{key: k, vol: vol, opts: opts, st: st, full: full})
	}
	return out, nil
}

// target is the clone's target node, "" for the source's own.
func (c *call) target() string {
	t := c.str("target")
	if t == c.str("node") || t == "localhost" {
		return ""
	}
	return t
}

// checkBridges is qemu-server's check_bridge_access: SDN.Use on the
// bridge (or its VLAN) of every NIC, in the default zone localnetwork
// (pve-guest-common src/PVE/GuestHelpers.pm check_vnet_access). Call with
// s.mu held.
func (c *call) checkBridges(conf map[string]string) error {
	for _, k := range sortedKeys(conf) {
		if !netKeyRe().MatchString(k) {
			continue
		}
		bridge := netBridge(conf[k])
		if bridge == "" {
			continue
		}
		path := "/sdn/zones/localnetwork/" + bridge
		if tag := netOption(conf[k], "tag"); tag != "" {
			path += "/" + tag
		}
		if err := c.s.access.check(c.authid, path, "SDN.Use"); err != nil {
			return err
		}
	}
	return nil
}

// POST .../clone: the checks at once (before PVE forks), then a qmclone
// task (its id is the source's vmid) that takes a shared lock on the
// source's config and an exclusive one on the new VM's (1 s each, else
// "can't lock file '/var/lock/qemu-server/lock-N.conf' - got timeout"),
// checks again, and writes the new config, locked "clone": only then does
// the new VM exist, so two clones given the same id by nextid collide and
// the loser's task fails. Each disk is then cloned holding its storage's
// lock; a target node gets the config at the end.
func hClone(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	first, err := c.cloneCheck()
	if err != nil {
		return nil, err
	}
	vmid, node, newid := c.int("vmid"), c.str("node"), c.int("newid")
	target, pool := c.target(), c.str("pool")
	running := first.src.status == "running"
	hold := s.opts.StorageLockHold
	delay := max(0, s.taskDelay("qmclone")-time.Duration(len(first.drives))*hold)
	var nv *vm
	var plan *cloneSource
	var copies []string
	spec := taskSpec{
		node: node, typ: "qmclone", id: strconv.Itoa(vmid), delay: &delay,
		locks: []taskLock{{vmid: vmid, shared: !running, timeout: cloneLockTimeout},
			{vmid: newid, timeout: cloneLockTimeout}},
	}
	spec.begin = func(t *task) error {
		var err error
		if plan, err = c.cloneCheck(); err != nil {
			return err
		}
		if s.faults.CloneRaces > 0 && s.vms[newid] == nil {
			// Another node's clone takes the id first (Faults.CloneRaces).
			for _, n := range s.nodes {
				if n.name != node && (target == "" || n.name != target) {
					s.faults.CloneRaces--
					s.vms[newid] = &vm{vmid: newid, node: n.name, status: "stopped",
						conf: map[string]string{"name": "other-clone-" + strconv.Itoa(newid), "memory": "512", "cores": "1"}}
					break
				}
			}
		}
		if other, exists := s.vms[newid]; exists && (other.node != node || other.ct) {
			// pmxcfs refuses a config whose vmid another node (or a
			// container) has.
			return fmt.Errorf("close (rename) atomic file '/etc/pve/%s' failed: File exists", configFile(node, newid))
		}
		nv = &vm{vmid: newid, node: node, conf: map[string]string{"lock": "clone"}, status: "stopped",
			rootfs: plan.src.rootfs, agentDisabled: plan.src.agentDisabled, docker: plan.src.docker, selinux: plan.src.selinux}
		s.vms[newid] = nv
		return nil
	}
	spec.undo = func() {
		if nv != nil && s.vms[newid] == nv {
			delete(s.vms, newid)
		}
	}
	spec.work = func(t *task) error {
		fail := func(err error) error {
			s.mu.Lock()
			spec.undo()
			s.mu.Unlock()
			return fmt.Errorf("clone failed: %v", err)
		}
		newDisks := map[string]string{}
		for i, d := range plan.drives {
			release, err := s.lockStorage(s.ctx, node, d.st)
			if err != nil {
				return fail(err)
			}
			select {
			case <-time.After(hold):
			case <-s.ctx.Done():
			}
			release()
			dst, kind := d.st, "full"
			if d.full && c.has("storage") {
				dst = s.storage(c.str("storage"))
			}
			_, name, _ := strings.Cut(d.vol, ":")
			newVol := dst.id + ":" + dst.volName("full", newid, i, "")
			if f := c.str("format"); d.full && dst.fileBased() && f != "" && f != "qcow2" {
				// A full copy in another format (clone_disk's $dst_format).
				newVol = strings.TrimSuffix(newVol, ".qcow2") + "." + f
			}
			if !d.full {
				kind = "linked"
				newVol = d.st.id + ":" + d.st.volName("linked", newid, i, name)
			}
			newDisks[d.key] = newVol + "," + d.opts
			copies = append(copies, fmt.Sprintf("create %s clone of drive %s (%s)", kind, d.key, d.vol))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.vms[newid] != nv {
			return fmt.Errorf("clone failed: VM %d vanished", newid)
		}
		conf := map[string]string{}
		for k, val := range plan.src.conf {
			switch {
			case k == "template" || k == "lock" || k == "parent" || strings.HasPrefix(k, "unused"):
			case netKeyRe().MatchString(k):
				conf[k] = withNewMAC(val)
			case isCDROM(val) && strings.Contains(volumeID(val), "cloudinit"):
				// The clone gets a cloud-init drive of its own.
				conf[k] = strings.Replace(val, fmt.Sprintf("vm-%d-cloudinit", vmid), fmt.Sprintf("vm-%d-cloudinit", newid), 1)
			default:
				conf[k] = val
			}
		}
		for k, val := range newDisks {
			conf[k] = val
		}
		conf["smbios1"] = "uuid=" + uuid()
		if _, ok := conf["vmgenid"]; ok {
			conf["vmgenid"] = uuid()
		}
		if name := c.str("name"); name != "" {
			conf["name"] = name
		} else {
			conf["name"] = "Copy-of-VM-" + plan.src.conf["name"]
		}
		if d := c.str("description"); d != "" {
			conf["description"] = d
		}
		for _, line := range copies {
			t.logf("%s", line)
		}
		nv.conf = conf
		// qemu-server's clone copies the firewall file too
		// (PVE::Firewall::clone_vmfw_conf).
		if plan.src.fw != nil {
			nv.fw = plan.src.fw.clone()
		}
		if target != "" {
			nv.node = target
		}
		if pool != "" {
			if p := s.access.pools[pool]; p != nil {
				p.vms[newid] = true
			}
		}
		return nil
	}
	return s.runTask(c, spec), nil
}
