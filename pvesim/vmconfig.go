package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

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
	for k, val := range v.config(c.boolOr("current", false)) {
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

var newDiskRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^([a-z][a-z0-9\-_.]*[a-z0-9]):(\d+(?:\.\d+)?)(,.*)?$`)
})

// The options each config privilege covers, as qemu-server's
// src/PVE/API2/Qemu.pm lists them ($cpuoptions, $memoryoptions,
// $hwtypeoptions, $generaloptions, $vmpoweroptions, $diskoptions,
// $cloudinitoptions); allow-ksm and running-nets-host-mtu are PVE 9's.
var (
	cpuOptions     = setOf("cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus")
	memoryOptions  = setOf("memory", "balloon", "shares", "allow-ksm")
	hwTypeOptions  = setOf("acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga", "watchdog", "audio0", "rng0")
	generalOptions = setOf("agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime",
		"migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf", "template")
	vmPowerOptions   = setOf("freeze")
	diskOptions      = setOf("boot", "bootdisk", "vmstatestorage")
	cloudinitOptions = setOf("cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys")
	numaKeyRe        = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^numa\d+$`) })
	ipconfigKeyRe    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^ipconfig\d+$`) })
	skipPermKeyRe    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(?:unused|serial|usb|hostpci|virtiofs)\d+$`) })
)

func setOf(keys ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// checkModifyConfigPerm is qemu-server's $check_vm_modify_config_perm:
// the privilege each option needs on /vms/<vmid>; drives, tags and a few
// device options are checked elsewhere, and an option in no list is
// root's ("only root can set 'args' config"). Call with s.mu held.
func (c *call) checkModifyConfigPerm(vmid int, keys []string) error {
	uc, path := c.s.access, "/vms/"+strconv.Itoa(vmid)
	for _, opt := range keys {
		var err error
		switch {
		case diskKeyRe().MatchString(opt), opt == "cdrom", skipPermKeyRe().MatchString(opt), opt == "tags":
		case cpuOptions[opt], numaKeyRe().MatchString(opt):
			err = uc.check(c.authid, path, "VM.Config.CPU")
		case memoryOptions[opt]:
			err = uc.check(c.authid, path, "VM.Config.Memory")
		case hwTypeOptions[opt]:
			err = uc.check(c.authid, path, "VM.Config.HWType")
		case generalOptions[opt]:
			err = uc.check(c.authid, path, "VM.Config.Options")
			if err == nil && opt == "startup" {
				err = uc.check(c.authid, "/", "Sys.Modify")
			}
		case vmPowerOptions[opt]:
			err = uc.check(c.authid, path, "VM.PowerMgmt")
		case diskOptions[opt]:
			err = uc.check(c.authid, path, "VM.Config.Disk")
		case netKeyRe().MatchString(opt), opt == "running-nets-host-mtu":
			err = uc.check(c.authid, path, "VM.Config.Network")
		case cloudinitOptions[opt], ipconfigKeyRe().MatchString(opt):
			err = uc.checkAny(c.authid, path, "VM.Config.Cloudinit", "VM.Config.Network")
		case opt == "vmstate":
			err = uc.check(c.authid, path, "VM.Config.Disk", "VM.PowerMgmt")
		default:
			err = dieErr("only root can set '%s' config", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkDrivePerm is update_vm_api's $check_drive_perms: a cloud-init
// drive needs VM.Config.Cloudinit and VM.Config.CDROM, a CD-ROM
// VM.Config.CDROM, a disk VM.Config.Disk. Call with s.mu held.
func (c *call) checkDrivePerm(vmid int, drive string) error {
	path := "/vms/" + strconv.Itoa(vmid)
	switch {
	case isCDROM(drive) && strings.Contains(volumeID(drive), "cloudinit"):
		return c.s.access.check(c.authid, path, "VM.Config.Cloudinit", "VM.Config.CDROM")
	case isCDROM(drive):
		return c.s.access.check(c.authid, path, "VM.Config.CDROM")
	}
	return c.s.access.check(c.authid, path, "VM.Config.Disk")
}

// checkStorageAccess is update_vm_api's $check_storage_access for the
// drives set: a new disk ("storage:size") needs Datastore.AllocateSpace
// on its storage, which must hold images. Call with s.mu held.
func (c *call) checkStorageAccess(changes map[string]string) error {
	for _, k := range sortedKeys(changes) {
		if !diskKeyRe().MatchString(k) || isCDROM(changes[k]) {
			continue
		}
		m := newDiskRe().FindStringSubmatch(changes[k])
		if m == nil {
			continue
		}
		if err := c.s.access.check(c.authid, "/storage/"+m[1], "Datastore.AllocateSpace"); err != nil {
			return err
		}
		if st := c.s.storage(m[1]); st == nil {
			return dieErr("storage '%s' does not exist", m[1])
		} else if !st.hasContent("images") {
			return paramErr("storage", fmt.Sprintf("storage '%s' does not support vm images", m[1]))
		}
	}
	return nil
}

// checkConfig is update_vm_api's $load_and_check_config: the digest, the
// config lock, and the balloon, which may not be larger than the memory
// (the memory set, else the config's). Call with s.mu held.
func checkConfig(v *vm, digest string, changes map[string]string) error {
	if digest != "" && digest != v.digest() {
		return errors.New("checksum mismatch (file change by other user?)")
	}
	if err := v.checkLock(); err != nil {
		return err
	}
	mem, setMem := changes["memory"]
	balloon, setBalloon := changes["balloon"]
	if (setMem && mem != "" && mem != "0") || setBalloon {
		if !setMem || mem == "" || mem == "0" {
			mem = v.conf["memory"]
		}
		if !setBalloon {
			balloon = v.conf["balloon"]
		}
		maxmem := memoryOption(mem)
		if b, _ := strconv.ParseInt(balloon, 10, 64); b != 0 && b > maxmem {
			return errors.New("balloon value too large (must be smaller than assigned memory)")
		}
	}
	return nil
}

// setConfig is POST (a qmconfig task) or PUT (synchronous) .../config:
// qemu-server's update_vm_api. What can be checked at once is (the
// options, the privileges each needs, the config's digest, lock and
// balloon); then, holding the VM's config lock (waiting up to 10 s), the
// checks again and the changes.
func setConfig(c *call, async bool) (any, error) {
	s := c.s
	if err := c.noSkiplock(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	vmid, node := c.int("vmid"), c.str("node")
	changes := map[string]string{}
	for k := range c.params {
		if !configMeta[k] {
			changes[k] = c.str(k)
		}
	}
	deletes := splitList(c.str("delete"))
	early := func() error {
		if len(deletes) == 0 && !c.has("revert") && len(changes) == 0 {
			return dieErr("no options specified")
		}
		for _, d := range deletes {
			if _, both := changes[d]; both {
				return paramErr("delete", fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", d, d))
			}
			if c.m.Params.Properties[d] == nil || configMeta[d] {
				return paramErr("delete", fmt.Sprintf("unknown option '%s'", d))
			}
		}
		if err := c.checkModifyConfigPerm(vmid, deletes); err != nil {
			return err
		}
		if err := c.checkModifyConfigPerm(vmid, sortedKeys(changes)); err != nil {
			return err
		}
		if err := c.checkStorageAccess(changes); err != nil {
			return err
		}
		if err := c.checkBridges(changes); err != nil {
			return err
		}
		v, err := c.loadVM()
		if err != nil {
			return err
		}
		if err := checkConfig(v, c.str("digest"), changes); err != nil {
			return dieErr("%s", err)
		}
		return nil
	}
	if err := early(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	digest := c.str("digest")
	var unplugs []string // NICs apply leaves to unplugNICs
	// apply is $updatefn, with s.mu held.
	apply := func(t *task) error {
		v, ok := s.vms[vmid]
		if !ok || v.node != node {
			return fmt.Errorf("Configuration file '%s' does not exist", configFile(node, vmid))
		}
		if err := checkConfig(v, digest, changes); err != nil {
			return err
		}
		if t != nil {
			var args []string
			for _, k := range sortedKeys(c.params) {
				if k != "node" && k != "vmid" && k != "digest" && k != "background_delay" {
					val := c.str(k)
					if k == "cipassword" {
						val = "<hidden>"
					}
					args = append(args, "-"+k, val)
				}
			}
			t.logf("update VM %d: %s", vmid, strings.Join(args, " "))
		}
		for _, d := range deletes {
			old, set := v.conf[d]
			switch {
			case !set:
			case diskKeyRe().MatchString(d):
				if err := c.checkDrivePerm(vmid, old); err != nil {
					return err
				}
			case d == "tags":
				if err := c.s.access.check(c.authid, "/vms/"+strconv.Itoa(vmid), "VM.Config.Options"); err != nil {
					return err
				}
			case netKeyRe().MatchString(d):
				if err := c.checkBridges(map[string]string{d: old}); err != nil {
					return err
				}
			}
		}
		for _, k := range sortedKeys(changes) {
			old, set := v.conf[k]
			switch {
			case diskKeyRe().MatchString(k):
				if set {
					if err := c.checkDrivePerm(vmid, old); err != nil {
						return err
					}
				}
				if err := c.checkDrivePerm(vmid, changes[k]); err != nil {
					return err
				}
			case k == "tags":
				if err := c.s.access.check(c.authid, "/vms/"+strconv.Itoa(vmid), "VM.Config.Options"); err != nil {
					return err
				}
			case netKeyRe().MatchString(k) && set:
				if err := c.checkBridges(map[string]string{k: old}); err != nil {
					return err
				}
			}
		}
		// A running VM takes what it can hot-plug; the rest waits in
		// [PENDING] for its next start. A stopped one takes everything
		// (and its pending values for these options are dropped).
		running := v.status == "running"
		for _, d := range deletes {
			if running && !v.hotplug(d, "", true) {
				v.setPending(d, "", true)
				continue
			}
			if _, set := v.conf[d]; running && set && netKeyRe().MatchString(d) {
				// A NIC is unplugged from the guest: it stays in the
				// config, to be removed, until the guest let it go
				// (unplugNICs).
				v.setPending(d, "", true)
				unplugs = append(unplugs, d)
				continue
			}
			delete(v.conf, d)
			if v.pending != nil {
				delete(v.pending, d)
			}
		}
		for _, k := range sortedKeys(changes) {
			val := changes[k]
			switch {
			case netKeyRe().MatchString(k):
				if netMAC(val) == "" {
					val = withNewMAC(val)
				}
			case k == "tags":
				val = normalizeTags(val)
			case diskKeyRe().MatchString(k):
				if m := newDiskRe().FindStringSubmatch(val); m != nil {
					// "local-lvm:4" allocates a new 4 GiB volume.
					size, _ := strconv.ParseFloat(m[2], 64)
					st := s.storage(m[1])
					val = fmt.Sprintf("%s:%s,size=%s%s", m[1], st.volName("full", vmid, v.nextDiskIndex(), ""), formatSize(int64(size*(1<<30))), m[3])
				}
			}
			if running && !v.hotplug(k, val, false) {
				v.setPending(k, val, false)
				continue
			}
			v.conf[k] = val
			v.pendingDelete = slices.DeleteFunc(v.pendingDelete, func(d string) bool { return d == k })
			if v.pending != nil {
				delete(v.pending, k)
			}
		}
		return nil
	}
	if !async {
		s.mu.Unlock()
		release, err := s.lockConfig(c.ctx, node, vmid, false, configLockTimeout)
		if err != nil {
			return nil, dieErr("%s", err)
		}
		defer release()
		s.mu.Lock()
		err = apply(nil)
		s.mu.Unlock()
		if err != nil {
			var api *apiError
			if errors.As(err, &api) {
				return nil, api
			}
			return nil, dieErr("%s", err)
		}
		if err := s.unplugNICs(vmid, unplugs); err != nil {
			return nil, err
		}
		return nil, nil
	}
	upid := s.runTask(c, taskSpec{node: node, typ: "qmconfig", id: strconv.Itoa(vmid),
		locks: []taskLock{{vmid: vmid, timeout: configLockTimeout}}, work: func(t *task) error {
			s.mu.Lock()
			err := apply(t)
			s.mu.Unlock()
			if err == nil {
				if perr := s.unplugNICs(vmid, unplugs); perr != nil {
					t.logf("%s", perr.Error())
					err = perr
				}
			}
			return err
		}})
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
				return nil, dieErr("failed to update VM %d: %s", vmid, exit)
			}
			return nil, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return upid, nil
}

// memoryOption is get_current_memory: the current= of a memory option
// (default 512 MiB).
func memoryOption(m string) int64 {
	m = strings.TrimPrefix(m, "current=")
	m, _, _ = strings.Cut(m, ",")
	n, err := strconv.ParseInt(m, 10, 64)
	if err != nil || n <= 0 {
		return 512
	}
	return n
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

// Pending changes. A config change to a running VM goes to the config's
// [PENDING] section, and qemu-server applies at once only what it can
// hot-plug (src/PVE/QemuServer.pm vmconfig_hotplug_pending): the "fast
// plug" options, cloud-init options, cpulimit, cpuunits, the agent
// option, a balloon that stays enabled or disabled, NICs and SCSI/VirtIO
// disks with the default hotplug (network,disk,usb), memory and vcpus only
// with memory or cpu hotplug. Cores, sockets and the rest stay pending
// until the VM starts again (vm_start: vmconfig_apply_pending). GET config
// shows the pending values unless current=1.

var fastPlugOptions = setOf("description", "hookscript", "lock", "migrate_downtime", "migrate_speed", "name",
	"onboot", "protection", "shares", "startup", "tags", "vmstatestorage")

// hotplugFeatures parses the hotplug option (default network,disk,usb;
// "1" is that, "0" none).
func hotplugFeatures(v string) map[string]bool {
	switch v {
	case "", "1":
		return setOf("network", "disk", "usb")
	case "0":
		return map[string]bool{}
	}
	return setOf(splitList(v)...)
}

// hotplug says whether a change of opt to val (del: its removal) applies
// to the running VM at once.
func (v *vm) hotplug(opt, val string, del bool) bool {
	hp := hotplugFeatures(v.conf["hotplug"])
	switch {
	case fastPlugOptions[opt], cloudinitOptions[opt], ipconfigKeyRe().MatchString(opt):
		return true
	case opt == "cpulimit", opt == "cpuunits", opt == "agent" && !del:
		return true
	case opt == "balloon":
		enabled := func(b string, set bool) bool { return !set || b != "0" }
		old, had := v.conf["balloon"]
		return !del && enabled(old, had) == enabled(val, true)
	case netKeyRe().MatchString(opt):
		return hp["network"]
	case diskKeyRe().MatchString(opt):
		return hp["disk"] && (strings.HasPrefix(opt, "scsi") || strings.HasPrefix(opt, "virtio"))
	case opt == "memory":
		return hp["memory"]
	case opt == "vcpus":
		return hp["cpu"]
	}
	return false
}

// setPending records a change for the next start; "" with del removes.
// Call with s.mu held.
func (v *vm) setPending(opt, val string, del bool) {
	v.pendingDelete = slices.DeleteFunc(v.pendingDelete, func(k string) bool { return k == opt })
	if v.pending != nil {
		delete(v.pending, opt)
	}
	if del {
		if _, set := v.conf[opt]; set {
			v.pendingDelete = append(v.pendingDelete, opt)
		}
		return
	}
	if v.pending == nil {
		v.pending = map[string]string{}
	}
	v.pending[opt] = val
}

// applyPending is vmconfig_apply_pending, at a start. Call with s.mu held.
func (v *vm) applyPending() {
	for _, k := range v.pendingDelete {
		delete(v.conf, k)
	}
	for k, val := range v.pending {
		v.conf[k] = val
	}
	v.pending, v.pendingDelete = nil, nil
}

// config is the config as GET config shows it: with the pending changes
// unless current.
func (v *vm) config(current bool) map[string]string {
	if current || len(v.pending)+len(v.pendingDelete) == 0 {
		return v.conf
	}
	out := maps.Clone(v.conf)
	for _, k := range v.pendingDelete {
		delete(out, k)
	}
	maps.Copy(out, v.pending)
	return out
}

// GET .../pending: every option with its current value, its pending one
// and whether it is to be removed (qemu-server vm_pending).
func hPending(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	for k := range v.conf {
		keys[k] = true
	}
	for k := range v.pending {
		keys[k] = true
	}
	out := []map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k == "description" || k == "lock" || k == "digest" {
			continue
		}
		e := map[string]any{"key": k}
		if val, ok := v.conf[k]; ok {
			e["value"] = val
		}
		if val, ok := v.pending[k]; ok {
			e["pending"] = val
		}
		if slices.Contains(v.pendingDelete, k) {
			e["delete"] = 1
		}
		out = append(out, e)
	}
	return out, nil
}

// unplugNICs hot-unplugs NICs from a running VM, as qemu-server's
// vmconfig_hotplug_pending does with a NIC to delete (src/PVE/QemuServer.pm
// vm_deviceunplug): device_del, then qemu_devicedelverify, which looks
// for the device in the VM's device list right away and then once a
// second, 5 s at most, and dies "error on hot-unplugging device 'net0'
// - still busy in guest?" when the guest never lets it go (a guest
// without ACPI PCI hotplug: Faults.StuckUnplugs). The guest takes some
// time to answer the eject, so the first look finds it still there: an
// unplug takes UnplugDelay (a second on a real cluster), a failed one
// six times that. A NIC unplugged is gone from the config; one that
// failed stays, still to be removed ([PENDING] delete), and the call
// fails with the parameter's error (update_vm_api's raise_param_exc),
// the other changes of the call made. Called holding the VM's config
// lock, not s.mu. A guest without its NIC reaches nothing (network.go).
func (s *Server) unplugNICs(vmid int, nets []string) error {
	if len(nets) == 0 {
		return nil
	}
	s.mu.Lock()
	stuck, wait := s.faults.StuckUnplugs, s.opts.UnplugDelay
	s.mu.Unlock()
	if stuck {
		wait *= 6
	}
	select {
	case <-time.After(wait):
	case <-s.ctx.Done():
		return dieErr("%s", s.ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	errs := map[string]string{}
	for _, d := range nets {
		switch {
		case v == nil:
		case stuck:
			errs[d] = fmt.Sprintf("hotplug problem - error on hot-unplugging device '%s' - still busy in guest?", d)
		default:
			delete(v.conf, d)
			v.pendingDelete = slices.DeleteFunc(v.pendingDelete, func(k string) bool { return k == d })
		}
	}
	if len(errs) > 0 {
		return &ParamError{Errors: errs}
	}
	return nil
}
