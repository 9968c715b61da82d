package pvesim

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vm is a guest's configuration and run state: a QEMU VM, or an LXC
// container (ct). Both share one id space, as pmxcfs's vmlist has it.
type vm struct {
	vmid int
	node string
	ct   bool // an LXC container (it runs nothing: see lxc.go)
	// paused: a running VM suspended (status/suspend); its guest is
	// frozen.
	paused bool
	// conf is the config file: key -> value as written (lock, template
	// and description included).
	conf    map[string]string
	status  string // stopped, running
	started time.Time
	pid     int
	// While running: what it was started with (capacity accounting), and
	// its guest (nil until the start task has created it).
	runCPUs int
	runMem  int64
	guest   *guest
	rootfs  string // the local sandbox template its guests use
	// agentDisabled are the qemu-ga commands its guest does not allow
	// (the template's OS image decides; clones inherit it).
	agentDisabled []string
	// snapshots are the [snapname] sections of its config file.
	snapshots map[string]*snapshot
	// pending is the [PENDING] section: changes made while the VM ran
	// that apply at its next start (pendingDelete: options to remove).
	pending       map[string]string
	pendingDelete []string
	// fw is its firewall configuration (firewall/<vmid>.fw); nil: none.
	fw *vmFirewall
	// docker: its guest runs Docker; selinux: SELinux confines its
	// qemu-ga (the template's image decides both).
	docker, selinux bool
}

// VM is a VM as tests see it.
type VM struct {
	VMID     int
	Node     string
	Name     string
	Status   string // stopped, running
	Template bool
	Lock     string
	Config   map[string]string
	// Sandbox is the id of the guest's sandbox while it runs.
	Sandbox string
	// AgentUp: the guest agent answers.
	AgentUp bool
	// Type is qemu or lxc.
	Type string
	// Snapshots are the names of its snapshots, oldest first.
	Snapshots []string
	// Pending are changes waiting for its next start ("" for an option
	// to be removed).
	Pending map[string]string
	// Paused: running, suspended (status/suspend) until a resume.
	Paused bool
}

// VMs lists the VMs by vmid.
func (s *Server) VMs() []VM {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []VM
	for _, id := range slices.Sorted(maps.Keys(s.vms)) {
		out = append(out, s.vmView(s.vms[id]))
	}
	return out
}

// VM returns one VM.
func (s *Server) VM(vmid int) (VM, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[vmid]
	if !ok {
		return VM{}, false
	}
	return s.vmView(v), true
}

func (s *Server) vmView(v *vm) VM {
	out := VM{VMID: v.vmid, Node: v.node, Name: v.conf["name"], Status: v.status,
		Template: v.conf["template"] == "1", Lock: v.conf["lock"], Config: maps.Clone(v.conf), Type: v.typ(),
		Snapshots: v.snapshotNames(), Paused: v.paused}
	if len(v.pending)+len(v.pendingDelete) > 0 {
		out.Pending = maps.Clone(v.pending)
		if out.Pending == nil {
			out.Pending = map[string]string{}
		}
		for _, k := range v.pendingDelete {
			out.Pending[k] = ""
		}
	}
	if v.ct {
		out.Name = v.conf["hostname"]
	}
	if v.guest != nil {
		out.Sandbox = v.guest.sb.ID()
		out.AgentUp = s.agentUp(v) == nil
	}
	return out
}

// AddTemplate creates a template VM (template: 1) on a node, like one
// made with "qm template": its disk is a base volume linked clones share.
func (s *Server) AddTemplate(node string, vmid int, name string, spec TemplateSpec) error {
	if err := formats["pve-vmid"](strconv.Itoa(vmid)); err != nil {
		return fmt.Errorf("pvesim: vmid %d: %s", vmid, strings.TrimSpace(err.Error()))
	}
	if err := dnsName(name); err != nil {
		return fmt.Errorf("pvesim: name %q: %s", name, strings.TrimSpace(err.Error()))
	}
	if spec.Cores == 0 {
		spec.Cores = 2
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 2048
	}
	if spec.DiskSize == "" {
		spec.DiskSize = "8G"
	}
	if spec.Agent == "" {
		spec.Agent = "1"
	}
	if spec.Sockets == 0 {
		spec.Sockets = 1
	}
	if spec.Storage == "" {
		spec.Storage = "local-lvm"
	}
	size, ok := parseSize(spec.DiskSize)
	if !ok {
		return fmt.Errorf("pvesim: disk size %q", spec.DiskSize)
	}
	if spec.BalloonMiB > spec.MemoryMiB {
		return fmt.Errorf("pvesim: balloon %d MiB is more than the memory, %d MiB", spec.BalloonMiB, spec.MemoryMiB)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(node) == nil {
		return fmt.Errorf("pvesim: no node %q", node)
	}
	if _, exists := s.vms[vmid]; exists {
		return fmt.Errorf("pvesim: VM %d exists", vmid)
	}
	st := s.storage(spec.Storage)
	switch {
	case st == nil:
		return fmt.Errorf("pvesim: no storage %q", spec.Storage)
	case !st.hasContent("images"):
		return fmt.Errorf("pvesim: storage %s does not hold VM images (content %s)", st.id, st.content)
	case !st.canTemplate():
		// qemu-server's template call: the storage lacks the template
		// feature (LVMPlugin), so no template can live there.
		return fmt.Errorf("pvesim: storage %s (%s) cannot hold a template", st.id, st.typ)
	}
	conf := map[string]string{
		"name":     name,
		"template": "1",
		"cores":    strconv.Itoa(spec.Cores),
		"sockets":  strconv.Itoa(spec.Sockets),
		"memory":   strconv.Itoa(spec.MemoryMiB),
		"scsi0":    fmt.Sprintf("%s:%s,iothread=1,size=%s", st.id, st.volName("base", vmid, 0, ""), formatSize(size)),
		"scsihw":   "virtio-scsi-single",
		"net0":     "virtio=" + randomMAC() + ",bridge=vmbr0,firewall=1",
		"agent":    spec.Agent,
		"ostype":   "l26",
		"boot":     "order=scsi0;net0",
		"smbios1":  "uuid=" + uuid(),
		"vmgenid":  uuid(),
		"meta":     fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", time.Now().Unix()),
	}
	if spec.Tags != "" {
		conf["tags"] = normalizeTags(spec.Tags)
	}
	if spec.Protection {
		conf["protection"] = "1"
	}
	if spec.Net0 != "" {
		conf["net0"] = spec.Net0
	}
	if spec.CloudInit != "" {
		ci := s.storage(spec.CloudInit)
		if ci == nil || !ci.hasContent("images") {
			return fmt.Errorf("pvesim: no storage %q for the cloud-init drive", spec.CloudInit)
		}
		conf["ide2"] = fmt.Sprintf("%s:vm-%d-cloudinit,media=cdrom", ci.id, vmid)
	}
	// An EFI vars disk and a TPM state are drives of their own formats
	// (qemu-server src/PVE/QemuServer/Drive.pm $efidisk_fmt and
	// $tpmstate_fmt: no backup, cache or iothread key), 4 MiB each,
	// base volumes of the template like its disk.
	if spec.OVMF {
		conf["bios"], conf["machine"] = "ovmf", "q35"
		conf["efidisk0"] = fmt.Sprintf("%s:%s,efitype=4m,pre-enrolled-keys=1,size=4M", st.id, st.volName("base", vmid, 1, ""))
	}
	if spec.TPM {
		conf["tpmstate0"] = fmt.Sprintf("%s:%s,size=4M,version=v2.0", st.id, st.volName("base", vmid, 2, ""))
	}
	if spec.CIUpgrade != "" {
		conf["ciupgrade"] = spec.CIUpgrade
	}
	if spec.BalloonMiB > 0 {
		conf["balloon"] = strconv.Itoa(spec.BalloonMiB)
	}
	s.vms[vmid] = &vm{vmid: vmid, node: node, conf: conf, status: "stopped", rootfs: spec.Rootfs,
		agentDisabled: slices.Clone(spec.AgentDisabledRPCs), docker: spec.Docker, selinux: spec.SELinux}
	return nil
}

// configFile is where PVE keeps a VM's config, as its errors name it.
func configFile(node string, vmid int) string {
	return fmt.Sprintf("nodes/%s/qemu-server/%d.conf", node, vmid)
}

// typ is the guest's type as the API names it.
func (v *vm) typ() string {
	if v.ct {
		return "lxc"
	}
	return "qemu"
}

// loadVM is PVE::QemuConfig->load_config on the node a call runs on (a
// container's id has no QEMU config there). Call with s.mu held.
func (c *call) loadVM() (*vm, error) {
	node, vmid := c.str("node"), c.int("vmid")
	v, ok := c.s.vms[vmid]
	if !ok || v.node != node || v.ct {
		return nil, dieErr("Configuration file '%s' does not exist", configFile(node, vmid))
	}
	return v, nil
}

// loadVMToChange is loadVM for a call that changes the VM, which (like
// PVE for a non-root user) refuses skiplock. Call with s.mu held.
func (c *call) loadVMToChange() (*vm, error) {
	v, err := c.loadVM()
	if err != nil {
		return nil, err
	}
	if err := c.noSkiplock(); err != nil {
		return nil, err
	}
	return v, nil
}

// checkLock is PVE::AbstractConfig->check_lock ("VM" or "CT" is its
// guest_type).
func (v *vm) checkLock() error {
	if l := v.conf["lock"]; l != "" {
		if v.ct {
			return fmt.Errorf("CT is locked (%s)", l)
		}
		return fmt.Errorf("VM is locked (%s)", l)
	}
	return nil
}

func (v *vm) isTemplate() bool { return v.conf["template"] == "1" }

// digest is the SHA-1 of the config file, as GET config reports it and
// the digest parameter checks it.
func (v *vm) digest() string {
	var b strings.Builder
	for _, line := range strings.Split(v.conf["description"], "\n") {
		if v.conf["description"] != "" {
			b.WriteString("#" + line + "\n")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(v.conf)) {
		if k != "description" {
			fmt.Fprintf(&b, "%s: %s\n", k, v.conf[k])
		}
	}
	// The pending section and the snapshots follow: they change it too.
	if len(v.pending)+len(v.pendingDelete) > 0 {
		b.WriteString("\n[PENDING]\n")
		for _, k := range slices.Sorted(maps.Keys(v.pending)) {
			fmt.Fprintf(&b, "%s: %s\n", k, v.pending[k])
		}
		if len(v.pendingDelete) > 0 {
			fmt.Fprintf(&b, "delete: %s\n", strings.Join(v.pendingDelete, ","))
		}
	}
	for _, name := range v.snapshotNames() {
		sn := v.snapshots[name]
		fmt.Fprintf(&b, "\n[%s]\n", name)
		for _, k := range slices.Sorted(maps.Keys(sn.conf)) {
			fmt.Fprintf(&b, "%s: %s\n", k, sn.conf[k])
		}
		fmt.Fprintf(&b, "snaptime: %d\nsnapstate: %s\n", sn.snaptime, sn.snapstate)
	}
	sum := sha1.Sum([]byte(b.String()))
	return hex.EncodeToString(sum[:])
}

// memoryMiB reads the memory option ("[current=]N", default 512).
func (v *vm) memoryMiB() int64 { return memoryOption(v.conf["memory"]) }

// vcpus is sockets x cores, the VM's maximum vCPUs (qemu-server
// config_to_command: $maxcpus = $sockets * $cores).
func (v *vm) vcpus() int {
	atoi := func(k string, def int) int {
		if n, err := strconv.Atoi(v.conf[k]); err == nil && n > 0 {
			return n
		}
		return def
	}
	return atoi("cores", 1) * atoi("sockets", 1)
}

// fsFreeze is qemu-server's should_fs_freeze: the agent is enabled and
// its freeze-fs option (alias freeze-fs-on-backup) is not off.
func (v *vm) fsFreeze() bool {
	if !v.agentEnabled() {
		return false
	}
	for _, part := range strings.Split(v.conf["agent"], ",") {
		if k, val, ok := strings.Cut(part, "="); ok && (k == "freeze-fs" || k == "freeze-fs-on-backup") {
			b, _ := parseBoolean(val)
			return b != "0"
		}
	}
	return true
}

// agentEnabled reads the agent option ("1" or "enabled=1,...").
func (v *vm) agentEnabled() bool {
	a, ok := v.conf["agent"]
	if !ok {
		return false
	}
	for _, part := range strings.Split(a, ",") {
		k, val, hasKey := strings.Cut(part, "=")
		if !hasKey {
			val = k
		} else if k != "enabled" {
			continue
		}
		b, _ := parseBoolean(val)
		return b == "1"
	}
	return false
}

var (
	diskKeyRe     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(ide|sata|scsi|virtio)\d+$|^efidisk0$|^tpmstate0$`) })
	ctVolumeKeyRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^rootfs$|^mp\d+$`) })
	netKeyRe      = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^net\d+$`) })
)

// driveKeys lists the config keys holding a drive (disks and CD-ROMs;
// a container's root and mount points).
func (v *vm) driveKeys() []string {
	re := diskKeyRe()
	if v.ct {
		re = ctVolumeKeyRe()
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(v.conf)) {
		if re.MatchString(k) {
			out = append(out, k)
		}
	}
	return out
}

// disks lists the config keys holding a disk (not a CD-ROM).
func (v *vm) disks() []string {
	var out []string
	for _, k := range v.driveKeys() {
		if !isCDROM(v.conf[k]) {
			out = append(out, k)
		}
	}
	return out
}

// isCDROM is drive_is_cdrom: a drive with media=cdrom (cloud-init drives
// too).
func isCDROM(drive string) bool {
	for _, p := range strings.Split(drive, ",") {
		if p == "media=cdrom" {
			return true
		}
	}
	return false
}

// storageOf is the storage of a volume id ("local-lvm:vm-100-disk-0").
func storageOf(vol string) string {
	sid, _, _ := strings.Cut(vol, ":")
	return sid
}

// diskSize reads size= from a drive string.
func diskSize(drive string) int64 {
	for _, part := range strings.Split(drive, ",") {
		if v, ok := strings.CutPrefix(part, "size="); ok {
			if n, ok := parseSize(v); ok {
				return n
			}
		}
	}
	return 0
}

// withSize rewrites size= in a drive string.
func withSize(drive string, size int64) string {
	parts := strings.Split(drive, ",")
	found := false
	for i, p := range parts {
		if strings.HasPrefix(p, "size=") {
			parts[i] = "size=" + formatSize(size)
			found = true
		}
	}
	if !found {
		parts = append(parts, "size="+formatSize(size))
	}
	return strings.Join(parts, ",")
}

func (v *vm) maxDisk() int64 {
	var total int64
	for _, k := range v.disks() {
		total += diskSize(v.conf[k])
	}
	return total
}

// volumeID is the volume id of a drive string ("local-lvm:vm-101-disk-0").
func volumeID(drive string) string {
	vol, _, _ := strings.Cut(drive, ",")
	return vol
}

// baseVolume is the base volume a linked clone's volume is made from:
// "local-lvm:base-9000-disk-0/vm-101-disk-0" -> "local-lvm:base-9000-disk-0".
func baseVolume(vol string) (string, bool) {
	storage, name, ok := strings.Cut(vol, ":")
	if !ok {
		return "", false
	}
	v := parseVolname(name)
	if !v.linked {
		return "", false
	}
	return storage + ":" + v.base, true
}

// normalizeTags is pve-guest-common's get_unique_tags with the default
// tag style: lower case, sorted, without duplicates, ";"-separated.
func normalizeTags(s string) string {
	var out []string
	for _, t := range splitList(s) {
		t = strings.ToLower(t)
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ";")
}

// randomMAC is PVE::Tools::random_ether_addr with Proxmox's prefix.
func randomMAC() string {
	b := make([]byte, 3)
	rand.Read(b)
	return fmt.Sprintf("BC:24:11:%02X:%02X:%02X", b[0], b[1], b[2])
}

func uuid() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// withNewMAC gives a net device a new MAC, keeping its other options
// (clones always get one; so does a net device set without one). The
// model is the key whose value is the MAC: "virtio=BC:24:11:..".
func withNewMAC(net string) string {
	parts := strings.Split(net, ",")
	for i, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		if k == "model" {
			_, k, _ = strings.Cut(p, "=")
		}
		if isNICModel(k) {
			parts[i] = k + "=" + randomMAC()
			return strings.Join(parts, ",")
		}
	}
	return net
}

func isNICModel(s string) bool {
	switch s {
	case "virtio", "e1000", "e1000e", "rtl8139", "vmxnet3", "ne2k_pci", "ne2k_isa", "pcnet", "i82551", "i82557b", "i82559er",
		"e1000-82540em", "e1000-82544gc", "e1000-82545em":
		return true
	}
	return false
}

// netMAC returns the MAC address of a net device string.
func netMAC(net string) string {
	for _, p := range strings.Split(net, ",") {
		k, v, ok := strings.Cut(p, "=")
		if ok && (isNICModel(k) || k == "macaddr") {
			return v
		}
	}
	return ""
}

// netBridge returns the bridge= of a net device string.
func netBridge(net string) string { return netOption(net, "bridge") }

// netOption returns an option (bridge, tag...) of a net device string.
func netOption(net, key string) string {
	for _, p := range strings.Split(net, ",") {
		if v, ok := strings.CutPrefix(p, key+"="); ok {
			return v
		}
	}
	return ""
}

// SetVMLock sets (or, with "", clears) a VM's lock, as a task that died
// half-way leaves it (a node that rebooted during a clone): only root's
// qm unlock clears it on a real cluster.
func (s *Server) SetVMLock(vmid int, lock string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[vmid]
	if !ok {
		return fmt.Errorf("pvesim: no VM %d", vmid)
	}
	if lock == "" {
		delete(v.conf, "lock")
	} else {
		v.conf["lock"] = lock
	}
	return nil
}
