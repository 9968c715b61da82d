package proxmox_test

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sqlite"
)

// egressServer is a delegate server whose job VMs reach out only
// through the egress proxy at 10.0.0.5:3128 (and the callback server at
// 10.0.0.5:8765), on the job network's bridge vmbr1 (withProxy).
func egressServer(t *testing.T, c *pve.Client) (*engine.Engine, *sqlite.DB) {
	t.Helper()
	return egressServerOn(t, c, "vmbr1", 0)
}

func egressServerOn(t *testing.T, c *pve.Client, bridge string, vlan int) (*engine.Engine, *sqlite.DB) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eg, err := engine.NewEgress(st, engine.EgressConfig{Proxy: egress.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 50 * time.Millisecond, Bridge: bridge, VLAN: vlan,
		Egress: &proxmox.Egress{Proxy: netip.MustParseAddrPort("10.0.0.5:3128"), Callback: netip.MustParseAddrPort("10.0.0.5:8765")}})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, b, engine.Config{Egress: eg, PollInterval: 50 * time.Millisecond, CleanupInterval: 200 * time.Millisecond,
		Defaults: delegate.Defaults{Timeout: 120, CPU: 1, Memory: "256M", Disk: "1G"}, ArtifactDir: t.TempDir()})
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(); eg.Close() })
	return eng, st
}

// withProxy is a simulated cluster whose job network, the bridge vmbr1
// (no address of the nodes on it), has the egress proxy at
// 10.0.0.5:3128: a stand-in that answers every request 407, as
// delegate's proxy does one without credentials.
func withProxy(t *testing.T, tune func(*pvesim.Options)) func(*pvesim.Options) {
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
				c.Read(make([]byte, 512))
				c.Write([]byte("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"))
			}()
		}
	}()
	return func(o *pvesim.Options) {
		o.Hosts = map[string]string{"10.0.0.5:3128": ln.Addr().String()}
		o.Bridges = []pvesim.BridgeSpec{{Name: "vmbr1", Ports: "eno2"}, {Name: "vmbr2", Ports: "eno3", VLANAware: true,
			VLANAddresses: map[int]string{20: "10.20.0.11/24"}}}
		if tune != nil {
			tune(o)
		}
	}
}

// runningVM waits for a job to run and returns its VM's id.
func runningVM(t *testing.T, eng *engine.Engine, sim *pvesim.Server, id string) int {
	t.Helper()
	vmid := 0
	testkit.Eventually(t, 60*time.Second, "job "+id+" running in a VM", func() bool {
		j, err := eng.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Status.Terminal() {
			t.Fatalf("job %s ended: %s %s", id, j.Status, j.Error)
		}
		if j.Status == delegate.StatusRunning {
			for _, v := range sim.VMs() {
				if !v.Template && v.Status == "running" {
					vmid = v.VMID
					return true
				}
			}
		}
		return false
	})
	return vmid
}

// TestEgressFirewallOnSimulator: a job whose network goes through the
// egress proxy gets a VM whose firewall lets out only the proxy and the
// callback server (net0 firewall=1; options; rules; its address pinned
// by ipfilter) and whose environment names the proxy with the job's
// token; the job is refused when the datacenter's firewall is off, or
// when the VM's firewall (from its template) lets out more.
func TestEgressFirewallOnSimulator(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), withProxy(t, nil))
	c, _ := client(t, sim, "root@pam", pvesim.RoleAdministrator)
	eng, _ := egressServer(t, c)
	ctx := context.Background()
	submit := func() *delegate.Job {
		t.Helper()
		j, err := eng.Submit(ctx, delegate.Manifest{Task: `echo "proxy=$https_proxy"; echo "no=$no_proxy"; sleep 1`,
			Network: delegate.Allowlist("pypi.org")}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	failsWith := func(want string) {
		t.Helper()
		j := submit()
		done, err := eng.Wait(ctx, j.ID)
		if err != nil || done.Status != delegate.StatusFailed || !strings.Contains(done.Error, want) {
			t.Errorf("job %s: %s %q, want failed with %q", j.ID, done.Status, done.Error, want)
		}
		noJobVMs(t, sim)
	}

	// The datacenter's firewall is off by default.
	failsWith("the datacenter's firewall is off")
	sim.SetFirewall("", true)

	j := submit()
	vmid := runningVM(t, eng, sim, j.ID)
	vm, _ := sim.VM(vmid)
	fw := sim.VMFirewall(vmid)
	if !strings.Contains(vm.Config["net0"], "firewall=1") {
		t.Errorf("net0 = %s", vm.Config["net0"])
	}
	for k, want := range map[string]string{"enable": "1", "ipfilter": "1", "macfilter": "1", "policy_in": "DROP", "policy_out": "DROP"} {
		if fw.Options[k] != want {
			t.Errorf("firewall option %s = %q, want %q", k, fw.Options[k], want)
		}
	}
	var rules []string
	for _, r := range fw.Rules {
		rules = append(rules, r["type"]+" "+r["action"]+" "+r["proto"]+" "+r["dest"]+":"+r["dport"]+" enable="+r["enable"])
	}
	slices.Sort(rules)
	if want := []string{"out ACCEPT tcp 10.0.0.5:3128 enable=1", "out ACCEPT tcp 10.0.0.5:8765 enable=1"}; !slices.Equal(rules, want) {
		t.Errorf("rules %q, want %q", rules, want)
	}
	if set := fw.IPSets["ipfilter-net0"]; len(set) != 1 || !strings.HasPrefix(set[0], "10.10.") {
		t.Errorf("ipfilter-net0 = %v, want the VM's address", set)
	}
	done, _ := eng.Wait(ctx, j.ID)
	res, _ := eng.Result(ctx, j.ID, delegate.ResultOptions{})
	out := string(res.Output)
	if done.Status != delegate.StatusSuccess || !strings.Contains(out, "proxy=http://job:dlg_") || !strings.Contains(out, "@10.0.0.5:3128") ||
		!strings.Contains(out, "no=localhost,127.0.0.1") {
		t.Errorf("job %s %s:\n%s", done.Status, done.Error, out)
	}
	noJobVMs(t, sim)

	// A template whose firewall (copied by the clone) lets everything out.
	if err := c.AddVMFirewallRule(ctx, "pve1", 9000, pve.FirewallRule{Type: "out", Action: "ACCEPT"}); err != nil {
		t.Fatal(err)
	}
	failsWith("accepts outbound traffic delegate did not allow")
}

// TestEgressFirewallPrivileges: the least-privilege job token (the
// DelegateJobs role on /vms, /nodes, the storages, the bridge) may set a
// VM's firewall but not read the datacenter's: the job is refused with
// what to grant.
func TestEgressFirewallPrivileges(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), withProxy(t, nil))
	sim.SetFirewall("", true)
	admin := pvesim.Token{ID: "root@pam!admin", Secret: "admin-secret", Privileges: pvesim.RoleAdministrator}
	if err := sim.AddToken(admin); err != nil {
		t.Fatal(err)
	}
	jt, err := sim.CreateJobToken(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := egressServer(t, clientFor(t, sim, jt.User, jt.TokenName, jt.Secret))
	j, err := eng.Submit(context.Background(), delegate.Manifest{Task: "true", Network: delegate.Allowlist("pypi.org")}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done, _ := eng.Wait(context.Background(), j.ID)
	if done.Status != delegate.StatusFailed || !strings.Contains(done.Error, "Sys.Audit on /") {
		t.Errorf("job %s: %q", done.Status, done.Error)
	}
	noJobVMs(t, sim)
}

// jobProbe is a job that connects to the egress proxy at once and
// prints the first line it is answered ("closed" if none).
const jobProbe = `perl -MIO::Socket::INET -e '$SIG{ALRM} = sub { print "timeout\n"; exit }; alarm 5;
my $s = IO::Socket::INET->new(PeerAddr => "10.0.0.5:3128", Proto => "tcp") or do { print "refused\n"; exit };
print $s "OPTIONS * HTTP/1.0\r\n\r\n"; my $l = <$s>; print defined $l ? $l : "closed\n"'`

// TestEgressAddressPinning (issue 39, 4): DHCP answers a while after the
// guest agent, the guest runs Docker (docker0 is listed first), and the
// firewall applies its rules on a cycle: the job VM is pinned to net0's
// address once it has one, and the job starts once the proxy answers it,
// so that its first connection gets through.
func TestEgressAddressPinning(t *testing.T) {
	t.Parallel()
	sim := simWith(t, pvesim.DefaultNodes(1), pvesim.TemplateSpec{Docker: true}, withProxy(t, func(o *pvesim.Options) {
		o.DHCPDelay = 1500 * time.Millisecond
		o.FirewallInterval = 800 * time.Millisecond
	}))
	sim.SetFirewall("", true)
	c, _ := client(t, sim, "root@pam", pvesim.RoleAdministrator)
	eng, _ := egressServer(t, c)
	ctx := context.Background()
	j, err := eng.Submit(ctx, delegate.Manifest{Task: jobProbe, Network: delegate.Allowlist("pypi.org")}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmid := runningVM(t, eng, sim, j.ID)
	if set := sim.VMFirewall(vmid).IPSets["ipfilter-net0"]; len(set) != 1 || !strings.HasPrefix(set[0], "10.10.") {
		t.Errorf("ipfilter-net0 = %v, want net0's address (10.10.x.y), not docker0's", set)
	}
	done, _ := eng.Wait(ctx, j.ID)
	res, _ := eng.Result(ctx, j.ID, delegate.ResultOptions{})
	if done.Status != delegate.StatusSuccess || !strings.HasPrefix(string(res.Output), "HTTP/1.1 407") {
		t.Errorf("job %s %s: the job's first connection to the proxy got %q", done.Status, done.Error, res.Output)
	}
	noJobVMs(t, sim)
}

// TestEgressFirewallChecks (issue 39, 5): the datacenter's firewall
// decides whether VM rules apply, not a node's own enable, under either
// daemon; a template's copied rules are checked completely: a security
// group it uses, read for what it accepts, and inbound ACCEPT rules.
func TestEgressFirewallChecks(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), withProxy(t, nil))
	sim.SetFirewall("", true)
	c, _ := client(t, sim, "root@pam", pvesim.RoleAdministrator)
	ctx := context.Background()
	// Templates whose firewall lets in, or out through a security group.
	cases := []struct {
		vmid int
		name string
		rule pve.FirewallRule
		want string
	}{
		{9101, "tpl-ssh-in", pve.FirewallRule{Type: "in", Action: "ACCEPT", Proto: "tcp", DPort: "22"}, "accepts inbound traffic"},
		{9102, "tpl-in-macro", pve.FirewallRule{Type: "in", Action: "ACCEPT", Macro: "SSH"}, "accepts inbound traffic"},
		{9103, "tpl-group", pve.FirewallRule{Type: "group", Action: "webout"}, "security group webout"},
	}
	if err := c.CreateSecurityGroup(ctx, "webout", "web out"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddSecurityGroupRule(ctx, "webout", pve.FirewallRule{Type: "out", Action: "ACCEPT", Proto: "tcp", DPort: "443"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		if err := sim.AddTemplate("pve1", tc.vmid, tc.name, pvesim.TemplateSpec{Tags: "delegate;template"}); err != nil {
			t.Fatal(err)
		}
		if err := c.AddVMFirewallRule(ctx, "pve1", tc.vmid, tc.rule); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	eng, _ := egressServer(t, c)
	run := func(tpl string) *delegate.Job {
		t.Helper()
		j, err := eng.Submit(ctx, delegate.Manifest{Task: "true", VMTemplate: tpl, Network: delegate.Allowlist("pypi.org")}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done, _ := eng.Wait(ctx, j.ID)
		noJobVMs(t, sim)
		return done
	}
	// A node whose host firewall is off still applies VM rules.
	sim.SetFirewall("pve1", false)
	if j := run(""); j.Status != delegate.StatusSuccess {
		t.Errorf("node firewall off: %s %q", j.Status, j.Error)
	}
	// proxmox-firewall (nftables) on the node.
	if err := c.SetNodeFirewall(ctx, "pve1", map[string]string{"enable": "1", "nftables": "1"}); err != nil {
		t.Fatal(err)
	}
	if j := run(""); j.Status != delegate.StatusSuccess {
		t.Errorf("proxmox-firewall: %s %q", j.Status, j.Error)
	}
	for _, tc := range cases {
		if j := run(tc.name); j.Status != delegate.StatusFailed || !strings.Contains(j.Error, tc.want) {
			t.Errorf("%s: %s %q, want failed with %q", tc.name, j.Status, j.Error, tc.want)
		}
	}
}

// TestEgressJobNetwork (issue 39, 3): the egress proxy needs a job
// network of its own, since the firewall lets a job's DHCP packets out
// to any address: PROXMOX_JOB_BRIDGE is required, must be a bridge of
// the node, and must not carry the node's own address (on the bridge,
// or on its VLAN interface when PROXMOX_JOB_VLAN is set).
func TestEgressJobNetwork(t *testing.T) {
	t.Parallel()
	sim := newSim(t, pvesim.DefaultNodes(1), withProxy(t, nil))
	sim.SetFirewall("", true)
	c, _ := client(t, sim, "root@pam", pvesim.RoleAdministrator)
	_, err := proxmox.New(c, proxmox.Config{Egress: &proxmox.Egress{Proxy: netip.MustParseAddrPort("10.0.0.5:3128")}})
	if err == nil || !strings.Contains(err.Error(), "PROXMOX_JOB_BRIDGE") {
		t.Errorf("egress without a job bridge: %v", err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		bridge string
		vlan   int
		want   string // "" : the job runs
	}{
		{"vmbr0", 0, "node pve1 has an address on the job network (10.0.0.11/24 on vmbr0)"},
		{"vmbr9", 0, "PROXMOX_JOB_BRIDGE=vmbr9: node pve1 has no such interface"},
		{"vmbr2", 20, "node pve1 has an address on the job network (10.20.0.11/24 on vmbr2.20)"},
		{"vmbr2", 30, ""},
		{"vmbr1", 0, ""},
	} {
		eng, _ := egressServerOn(t, c, tc.bridge, tc.vlan)
		j, err := eng.Submit(ctx, delegate.Manifest{Task: "true", Network: delegate.Allowlist("pypi.org")}, delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done, _ := eng.Wait(ctx, j.ID)
		switch {
		case tc.want == "" && done.Status != delegate.StatusSuccess:
			t.Errorf("%s tag %d: %s %q", tc.bridge, tc.vlan, done.Status, done.Error)
		case tc.want != "" && (done.Status != delegate.StatusFailed || !strings.Contains(done.Error, tc.want)):
			t.Errorf("%s tag %d: %s %q, want failed with %q", tc.bridge, tc.vlan, done.Status, done.Error, tc.want)
		}
		eng.Close()
		noJobVMs(t, sim)
	}
}
