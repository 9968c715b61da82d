package pvesim

import (
	"fmt"
	"strconv"
	"strings"
)

// lockTimeout is the error of an operation that needs a VM's config lock
// while a clone holds it (PVE waits 10 s for the flock, then gives up).
func lockTimeout(vmid int) error {
	return fmt.Errorf("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", vmid)
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
