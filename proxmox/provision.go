package proxmox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Provisioning: a clone (or a pool VM being made) becomes a job's VM.

// configure sizes and tags the VM, starts it, waits for its agent and
// readies the guest. The clone's config is read first: its disks and NICs
// are the template's, under names of its own.
func (b *Backend) configure(ctx context.Context, vmid int, node string, o owner, h *hold, spec sandbox.Spec, desc string) error {
	s := &vmSandbox{b: b, vmid: vmid, node: node, owner: o}
	cfg, err := b.c.VMConfig(ctx, s.node, s.vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read the config of VM %d: %w", s.vmid, privilegeHint(err))
	}
	sh := shapeOf(spec.CPU, spec.MemoryBytes)
	u := pve.VMConfigUpdate{
		Cores:       sh.cores,
		Sockets:     1, // a template's sockets would multiply the cores
		MemoryMiB:   h.memMiB,
		Tags:        s.owner.tags(),
		Description: &desc,
		// No balloon: the job gets the memory it asked for, and a
		// template's balloon larger than that memory is refused.
		Options: map[string]string{"balloon": "0"},
	}
	if sh.cpulimit > 0 {
		u.Options["cpulimit"] = strconv.FormatFloat(sh.cpulimit, 'f', 2, 64)
	}
	// A clone copies the template's protection, which would keep it from
	// ever being destroyed.
	if cfg.Option("protection") == "1" {
		u.Delete = append(u.Delete, "protection")
	}
	// Its disks are left out of backups: vzdump --all neither freezes a
	// running job nor keeps its secrets. Only the buses' drives have a
	// backup key: an EFI vars disk or a TPM state (UEFI templates) given
	// one is refused (qemu-server Drive.pm $efidisk_fmt, $tpmstate_fmt),
	// and vzdump always takes both anyway.
	for _, k := range diskKeys(cfg) {
		if v := cfg.Option(k); isBusDisk(k) && !strings.Contains(v, "media=cdrom") {
			u.Options[k] = withDriveOption(v, "backup", "0")
		}
	}
	proxied := spec.Network && spec.Egress != nil
	daemon := "" // the node's firewall daemon, for a proxied job
	switch {
	case !spec.Network:
		u.Delete = append(u.Delete, netKeys(cfg)...) // no NIC: the job reaches nothing, the agent still works
	case b.cfg.Bridge != "":
		u.Nets = map[int]string{0: jobNet(cfg.Option("net0"), b.cfg.Bridge, b.cfg.VLAN)}
	}
	if proxied {
		// Its one NIC, behind the firewall (egress.go); a NIC the rules
		// do not cover goes.
		if b.cfg.Egress == nil {
			return fmt.Errorf("proxmox: this backend has no egress proxy (PROXMOX_EGRESS_PROXY): %w", errFirewall)
		}
		if len(spec.Egress.CACert) > 0 {
			return errors.New("proxmox: injected credentials need the job's CA in the VM's trust, which this backend does not install")
		}
		if daemon, err = b.fw.checkOn(ctx, s.node); err != nil {
			return err
		}
		if err := b.fw.checkJobNet(ctx, s.node); err != nil {
			return err
		}
		net0 := cfg.Option("net0")
		if u.Nets != nil {
			net0 = u.Nets[0]
		}
		if net0 == "" {
			return fmt.Errorf("proxmox: template of VM %d has no net0 to put behind the firewall: %w", s.vmid, errFirewall)
		}
		u.Nets = map[int]string{0: withDriveOption(net0, "firewall", "1")}
		for _, k := range netKeys(cfg) {
			if k != "net0" {
				u.Delete = append(u.Delete, k)
			}
		}
	}
	if err := b.c.SetVMConfig(ctx, s.node, s.vmid, u); err != nil {
		return fmt.Errorf("proxmox: configure VM %d: %w", s.vmid, privilegeHint(err))
	}
	if proxied {
		spec.Step(fmt.Sprintf("setting VM %d's firewall: only the egress proxy", s.vmid))
		if err := b.fw.set(ctx, s); err != nil {
			return err
		}
	}
	if disk, size := bootDisk(cfg); disk != "" && spec.DiskBytes > size {
		upid, err := b.c.ResizeDisk(ctx, s.node, s.vmid, disk, strconv.FormatInt((spec.DiskBytes+(1<<30)-1)>>30, 10)+"G")
		if err == nil {
			logTask(b.log, "resize", s.vmid, s.owner.job, upid)
			err = b.c.WaitTask(ctx, s.node, upid)
		}
		if err != nil {
			return fmt.Errorf("proxmox: resize %s of VM %d: %w", disk, s.vmid, privilegeHint(err))
		}
	}
	// Idle pool VMs destroyed to make room for this one: it starts once
	// they are gone, so that the node never holds both.
	for _, v := range h.evict {
		select {
		case <-v.gone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	spec.Step(fmt.Sprintf("starting VM %d", s.vmid))
	upid, err := b.c.StartVM(ctx, s.node, s.vmid)
	if err == nil {
		logTask(b.log, "start", s.vmid, s.owner.job, upid)
		err = b.c.WaitTask(ctx, s.node, upid)
	}
	if err != nil {
		return fmt.Errorf("proxmox: start VM %d: %w", s.vmid, privilegeHint(err))
	}
	spec.Step("waiting for the guest agent")
	if err := b.waitAgent(ctx, s); err != nil {
		return err
	}
	if err := b.tpls.checkAgent(ctx, s, h.info); err != nil {
		return err
	}
	if proxied {
		if err := b.fw.pin(ctx, s, daemon); err != nil {
			return err
		}
	}
	return s.prepare(ctx)
}

// checkNICsGone reads a running VM's config as it runs (current=1: a
// NIC whose unplug Proxmox could not do, or left for the next start, is
// still there, its removal pending) and fails if it has a NIC.
func checkNICsGone(ctx context.Context, c *pve.Client, node string, vmid int) error {
	cfg, err := c.CurrentVMConfig(ctx, node, vmid)
	if err != nil {
		return fmt.Errorf("proxmox: read VM %d's config: %w", vmid, privilegeHint(err))
	}
	if nets := netKeys(cfg); len(nets) > 0 {
		return fmt.Errorf("proxmox: VM %d still has %s after its removal (Proxmox unplugs a NIC from a running VM only under network hotplug, and only when the guest lets it go)",
			vmid, strings.Join(nets, ", "))
	}
	return nil
}

// diskKeys lists the drive keys of a config (disks and CD-ROMs).
func diskKeys(cfg pve.VMConfig) []string {
	var keys []string
	for k := range cfg.Raw {
		if isDiskKey(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// withDriveOption sets key=value in a drive (or NIC) string, keeping the
// rest.
func withDriveOption(drive, key, value string) string {
	parts := strings.Split(drive, ",")
	for i, p := range parts {
		if k, _, _ := strings.Cut(p, "="); k == key && i > 0 {
			parts[i] = key + "=" + value
			return strings.Join(parts, ",")
		}
	}
	return drive + "," + key + "=" + value
}

// jobNet is a NIC of the clone moved to the job's bridge and VLAN: its
// model, MAC and other options (firewall, rate, mtu, queues...) stay, so
// that the template's firewall still applies. A clone without a NIC gets
// a virtio one.
func jobNet(net, bridge string, vlan int) string {
	if net == "" {
		net = "virtio"
	}
	var parts []string
	for _, p := range strings.Split(net, ",") {
		if k, _, _ := strings.Cut(p, "="); k != "bridge" && k != "tag" {
			parts = append(parts, p)
		}
	}
	out := parts[0] + ",bridge=" + bridge
	if vlan > 0 {
		out += ",tag=" + strconv.Itoa(vlan)
	}
	for _, p := range parts[1:] {
		out += "," + p
	}
	return out
}

func netKeys(cfg pve.VMConfig) []string {
	var keys []string
	for k := range cfg.Raw {
		if n, ok := strings.CutPrefix(k, "net"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// bootDisk finds the VM's first disk and its size in bytes.
func bootDisk(cfg pve.VMConfig) (string, int64) {
	for _, bus := range []string{"scsi", "virtio", "sata", "ide"} {
		for i := range 4 {
			key := bus + strconv.Itoa(i)
			v := cfg.Option(key)
			if v == "" || strings.Contains(v, "media=cdrom") {
				continue
			}
			for _, part := range strings.Split(v, ",") {
				if size, ok := strings.CutPrefix(part, "size="); ok {
					return key, parseSize(size)
				}
			}
			return key, 0
		}
	}
	return "", 0
}

func parseSize(s string) int64 {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "T"):
		mult, s = 1<<40, strings.TrimSuffix(s, "T")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return int64(n * float64(mult))
}

// waitAgent polls the guest agent until it answers. Until its deadline
// every error that may pass is waited out: the agent not up yet, and any
// transient 5xx or transport error; what cannot pass (the VM gone or
// stopped, no agent configured, a refused token) ends the wait at once.
//
// The pings back off: a ping to a guest that is still booting holds one
// of its node's three pvedaemon workers for 3 s (qemu-server's
// qga_check_running), so pinging without a pause keeps a worker busy for
// each booting VM (the client's per-node bound keeps one free whatever
// happens). The first comes a PollInterval after the start (no guest
// answers sooner), then the pauses grow by half from half a PollInterval
// to two: a booting VM holds a worker at most about two thirds of the
// time, and is found ready at most some 5 s after it is.
func (b *Backend) waitAgent(ctx context.Context, s *vmSandbox) error {
	deadline := time.Now().Add(b.cfg.AgentTimeout)
	pause := b.cfg.PollInterval
	for first := true; ; first = false {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		if first {
			pause = b.cfg.PollInterval / 2
		} else {
			pause = min(pause*3/2, 2*b.cfg.PollInterval)
		}
		err := b.c.AgentPing(ctx, s.node, s.vmid)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if lastingAgentError(err) {
			return fmt.Errorf("proxmox: guest agent of VM %d: %w", s.vmid, privilegeHint(err))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxmox: the guest agent of VM %d did not answer within %s (is qemu-guest-agent installed and enabled in the template?): %w",
				s.vmid, b.cfg.AgentTimeout, err)
		}
	}
}

// lastingAgentError: an agent call failed in a way waiting cannot change.
func lastingAgentError(err error) bool {
	var api *pve.APIError
	if errors.As(err, &api) && api.StatusCode >= 400 && api.StatusCode < 500 {
		return true // refused: parameters, token, privileges
	}
	return pve.IsNotFound(err) || pve.IsVMNotRunning(err) || pve.IsAgentNotConfigured(err)
}

// privilegeHint names the privilege a 403 says the token lacks.
func privilegeHint(err error) error {
	path, priv := pve.MissingPrivilege(err)
	switch {
	case strings.HasPrefix(priv, "VM.GuestAgent."):
		// A role made on PVE 8 gave the agent with VM.Monitor, which PVE 9
		// no longer has: after the upgrade every job fails here.
		return fmt.Errorf("the API token lacks %s on %s: PVE 9 replaced VM.Monitor with VM.GuestAgent.*, so a role made for PVE 8 lost the guest agent in the upgrade; "+
			"add it: pveum role modify DelegateJobs --privs VM.GuestAgent.Unrestricted --append 1 (docs/PROXMOX.md, \"Upgrading from PVE 8 to 9\"): %w", priv, path, err)
	case priv != "":
		return fmt.Errorf("the API token lacks %s on %s (see docs/PROXMOX.md for the role delegate needs): %w", priv, path, err)
	}
	return err
}
