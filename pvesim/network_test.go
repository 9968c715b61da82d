package pvesim

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// standInProxy answers every connection as an HTTP proxy would a request
// without credentials.
func standInProxy(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 512)
				c.Read(buf)
				c.Write([]byte("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"))
			}()
		}
	}()
	return ln.Addr().String()
}

// probeScript connects to $1 and prints the first line it is answered.
const probeScript = `use IO::Socket::INET; $SIG{ALRM} = sub { print "timeout\n"; exit 2 }; alarm 3;
my $s = IO::Socket::INET->new(PeerAddr => $ARGV[0], Proto => "tcp") or do { print "refused\n"; exit 1 };
print $s "OPTIONS * HTTP/1.0\r\n\r\n"; my $l = <$s>; print defined $l ? $l : "closed\n";`

// TestGuestNetwork: a guest's address comes by DHCP after its agent
// answers, docker0 is listed before eth0, and its connections are judged
// by its firewall as the last cycle compiled it.
func TestGuestNetwork(t *testing.T) {
	proxy := standInProxy(t)
	s := newSim(t, Options{DHCPDelay: 500 * time.Millisecond, FirewallInterval: time.Hour,
		Hosts: map[string]string{"10.0.0.5:3128": proxy}})
	if err := s.AddTemplate("pve1", 9002, "docker-tpl", TemplateSpec{Docker: true}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	c := s.c
	upid, err := c.CloneVM(ctx, "pve1", 9002, pve.CloneOptions{NewID: 400})
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	if upid, err = c.StartVM(ctx, "pve1", 400); err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitAgent(t, s, 400)
	ifaces, err := c.AgentNetworkInterfaces(ctx, "pve1", 400)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := c.VMConfig(ctx, "pve1", 400)
	mac := strings.ToLower(netMAC(cfg.Option("net0")))
	var names []string
	for _, in := range ifaces {
		names = append(names, in.Name)
		if in.Name == "eth0" {
			if in.HardwareAddress != mac {
				t.Errorf("eth0's MAC %s, net0's %s", in.HardwareAddress, mac)
			}
			for _, a := range in.IPAddresses {
				if a.Type == "ipv4" {
					t.Errorf("eth0 has %s as soon as the agent answers", a.Address)
				}
			}
		}
	}
	if strings.Join(names, ",") != "lo,docker0,eth0" {
		t.Errorf("interfaces %v", names)
	}
	lease := ""
	for deadline := time.Now().Add(10 * time.Second); lease == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ifaces, _ = c.AgentNetworkInterfaces(ctx, "pve1", 400)
		for _, in := range ifaces {
			for _, a := range in.IPAddresses {
				if in.Name == "eth0" && a.Type == "ipv4" {
					lease = a.Address
				}
			}
		}
	}
	if lease != "10.10.1.152" {
		t.Fatalf("eth0's lease %q", lease)
	}
	probe := func() string {
		t.Helper()
		st := run(t, s, 400, "/usr/bin/perl", "-e", probeScript, "10.0.0.5:3128")
		return strings.TrimSpace(string(st.Stdout))
	}
	// No firewall in force: it reaches the proxy.
	if got := probe(); got != "HTTP/1.1 407 Proxy Authentication Required" {
		t.Fatalf("unfiltered: %q", got)
	}
	// The firewall as delegate sets it, before its address is pinned.
	s.SetFirewall("", true)
	if err := c.SetVMFirewall(ctx, "pve1", 400, map[string]string{"enable": "1", "ipfilter": "1", "policy_out": "DROP", "dhcp": "1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddVMFirewallRule(ctx, "pve1", 400, pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "tcp", Dest: "10.0.0.5", DPort: "3128", Enable: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVMIPSet(ctx, "pve1", 400, "ipfilter-net0"); err != nil {
		t.Fatal(err)
	}
	if got := probe(); got != "HTTP/1.1 407 Proxy Authentication Required" {
		t.Errorf("configured, not yet compiled: %q", got)
	}
	s.FirewallCycle()
	if got := probe(); got != "closed" {
		t.Errorf("in force, its address not in ipfilter-net0: %q", got)
	}
	if err := c.AddVMIPSetEntry(ctx, "pve1", 400, "ipfilter-net0", lease+"/32"); err != nil {
		t.Fatal(err)
	}
	if got := probe(); got != "closed" {
		t.Errorf("pinned, not yet compiled: %q", got)
	}
	s.FirewallCycle()
	if got := probe(); got != "HTTP/1.1 407 Proxy Authentication Required" {
		t.Errorf("pinned and in force: %q", got)
	}
	if got := strings.TrimSpace(string(run(t, s, 400, "/usr/bin/perl", "-e", probeScript, "10.0.0.6:443").Stdout)); got != "closed" {
		t.Errorf("another host: %q", got)
	}
}

// TestNICUnplug: a NIC deleted from a running VM is hot-unplugged while
// the call waits (qemu-server's device_del and its verification), gone
// from the config and the agent's interfaces, and the guest reaches
// nothing after; a guest that does not let it go fails the call with
// qemu-server's parameter error, the NIC kept and still to be removed,
// the call's other changes made; without network hotplug the removal
// waits for the next start.
func TestNICUnplug(t *testing.T) {
	proxy := standInProxy(t)
	const delay = 300 * time.Millisecond
	s := newSim(t, Options{DHCPDelay: time.Millisecond, UnplugDelay: delay, Hosts: map[string]string{"10.0.0.5:3128": proxy}})
	ctx := ctxT(t)
	c := s.c
	id := cloneAndBoot(t, s, 410, nil)
	probe := func() string {
		t.Helper()
		st := run(t, s, id, "/usr/bin/perl", "-e", probeScript, "10.0.0.5:3128")
		return strings.TrimSpace(string(st.Stdout))
	}
	if got := probe(); got != "HTTP/1.1 407 Proxy Authentication Required" {
		t.Fatalf("with its NIC: %q", got)
	}
	t0 := time.Now()
	if err := c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Delete: []string{"net0"}}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < delay {
		t.Errorf("the unplug answered in %s, before the device could be seen gone (%s)", d, delay)
	}
	cfg, err := c.CurrentVMConfig(ctx, "pve1", id)
	if err != nil || cfg.Option("net0") != "" {
		t.Errorf("net0 after its unplug: %q %v", cfg.Option("net0"), err)
	}
	ifaces, err := c.AgentNetworkInterfaces(ctx, "pve1", id)
	if err != nil || slices.ContainsFunc(ifaces, func(in pve.NetworkInterface) bool { return in.Name == "eth0" }) {
		t.Errorf("interfaces after the unplug: %+v %v", ifaces, err)
	}
	if got := probe(); got != "closed" {
		t.Errorf("without its NIC the guest reaches the proxy: %q", got)
	}

	// A guest that keeps the device: the call fails as qemu-server's does.
	if err := c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Nets: map[int]string{0: "virtio,bridge=vmbr0"}}); err != nil {
		t.Fatal(err)
	}
	s.SetFaults(Faults{StuckUnplugs: true})
	err = c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Name: "renamed", Delete: []string{"net0"}})
	var api *pve.APIError
	if !errors.As(err, &api) || api.StatusCode != 400 || api.Errors["net0"] != "hotplug problem - error on hot-unplugging device 'net0' - still busy in guest?" {
		t.Fatalf("a stuck unplug: %v", err)
	}
	s.SetFaults(Faults{})
	cfg, _ = c.CurrentVMConfig(ctx, "pve1", id)
	pending, _ := c.Pending(ctx, "pve1", id)
	if cfg.Name != "renamed" || cfg.Option("net0") == "" || !slices.ContainsFunc(pending, func(p pve.PendingOption) bool { return p.Key == "net0" && p.Delete > 0 }) {
		t.Errorf("after a stuck unplug: name %q, net0 %q, pending %+v", cfg.Name, cfg.Option("net0"), pending)
	}

	// No network hotplug: the removal waits for the next start.
	id2 := 411
	upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: id2})
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err == nil {
		err = c.SetVMConfig(ctx, "pve1", id2, pve.VMConfigUpdate{Options: map[string]string{"hotplug": "disk,usb"}})
	}
	if err == nil {
		if upid, err = c.StartVM(ctx, "pve1", id2); err == nil {
			err = c.WaitTask(ctx, "pve1", upid)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetVMConfig(ctx, "pve1", id2, pve.VMConfigUpdate{Delete: []string{"net0"}}); err != nil {
		t.Fatal(err)
	}
	if cfg, _ := c.CurrentVMConfig(ctx, "pve1", id2); cfg.Option("net0") == "" {
		t.Error("net0 unplugged without network hotplug")
	}
}
