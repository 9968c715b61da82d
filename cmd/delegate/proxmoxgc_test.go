package main

import (
	"bytes"
	"context"
	"github.com/delegate-dev/delegate/internal/testkit/testsim"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
)

// pveSim runs `delegate pve-sim` with these nodes through the command's
// entry point, and returns the env it prints and a client of it.
func pveSim(t *testing.T, nodes int) (map[string]string, *pve.Client) {
	t.Helper()
	guests := t.TempDir() // removed after the simulator closed
	env := testsim.Printed(t, func(ctx context.Context, stdout io.Writer) {
		cli.Execute(ctx, cli.Program{Stdout: stdout, Stderr: io.Discard, Getenv: func(string) string { return "" }},
			[]string{"pve-sim", "--listen", "127.0.0.1:0", "--nodes", strconv.Itoa(nodes),
				"--task-delay", "20ms", "--boot-delay", "200ms", "--sandbox-dir", guests})
	})
	port, _ := strconv.Atoi(env["PROXMOX_PORT"])
	c, err := pve.New(pve.Config{Host: env["PROXMOX_HOST"], Port: port, User: env["PROXMOX_USER"], TokenName: env["PROXMOX_TOKEN_NAME"],
		TokenValue: env["PROXMOX_TOKEN_VALUE"], SSLMode: pve.SSLVerify, Fingerprint: env["PROXMOX_FINGERPRINT"], TaskPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("a client of the simulator (env %v): %v", env, err)
	}
	t.Cleanup(func() { c.Close() })
	return env, c
}

// delegateCmd runs one delegate command, as main wires it, with the env
// of the simulator and a data dir; it returns stdout, stderr and the
// exit code.
func delegateCmd(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Execute(t.Context(), cli.Program{
		Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv:       func(k string) string { return env[k] },
		Open:         openService,
		ProxmoxGC:    proxmoxGC,
		ProxmoxDrain: proxmoxDrain,
		PollInterval: 20 * time.Millisecond,
	}, args)
	return stdout.String(), stderr.String(), code
}

// vmsOn lists the VMs (not templates) on each node.
func vmsOn(t *testing.T, c *pve.Client) map[int]pve.Resource {
	t.Helper()
	rs, err := c.ClusterResources(t.Context(), pve.ResourceVM)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]pve.Resource{}
	for _, r := range rs {
		if !bool(r.Template) {
			out[int(r.VMID)] = r
		}
	}
	return out
}

// TestProxmoxDrainCommand (issue 39, item 11): `delegate proxmox drain
// NODE` lists delegate's VMs still on the node (a kept sandbox), which
// goes on working there; a job run after it is placed on the other node;
// an unknown node is refused naming it; --undo ends the drain.
func TestProxmoxDrainCommand(t *testing.T) {
	env, c := pveSim(t, 2)
	env["DELEGATE_DATA_DIR"] = t.TempDir()
	env["DELEGATE_LOG_LEVEL"] = "warn"
	env["DEFAULT_MEMORY"], env["DEFAULT_DISK"] = "512M", "1G"

	// A kept sandbox, placed on a node before the drain.
	out, errOut, code := delegateCmd(t, env, "sandboxes", "open")
	sbx := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(sbx, "sbx-") {
		t.Fatalf("sandboxes open: %d %q %s", code, out, errOut)
	}
	before := vmsOn(t, c)
	if len(before) != 1 {
		t.Fatalf("VMs after sandboxes open: %+v", before)
	}
	var kept pve.Resource
	for _, r := range before {
		kept = r
	}
	out, errOut, code = delegateCmd(t, env, "proxmox", "drain", kept.Node)
	want := "still on it: VM " + strconv.Itoa(int(kept.VMID)) + " (" + kept.Name + ") kept sandbox " + sbx
	if code != 0 || !strings.Contains(out, "node "+kept.Node+" drained") || !strings.Contains(out, want) {
		t.Fatalf("proxmox drain %s: %d %q %s; want a line %q", kept.Node, code, out, errOut, want)
	}
	if nc, err := c.NodeConfig(t.Context(), kept.Node); err != nil || !strings.Contains(nc.Description, proxmox.DrainMarker) {
		t.Fatalf("node %s's notes after the drain: %q %v", kept.Node, nc.Description, err)
	}

	// The kept sandbox goes on working on the drained node.
	out, errOut, code = delegateCmd(t, env, "exec", sbx, "--", "echo", "still here")
	if code != 0 || out != "still here\n" {
		t.Errorf("exec in the kept sandbox on the drained node: %d %q %s", code, out, errOut)
	}
	if r, ok := vmsOn(t, c)[int(kept.VMID)]; !ok || r.Node != kept.Node {
		t.Errorf("the kept sandbox's VM after the drain: %+v %v", r, ok)
	}

	// New VMs go to the other node.
	for i := range 2 {
		out, errOut, code = delegateCmd(t, env, "run", "--keep", "--script", "echo job "+strconv.Itoa(i))
		if code != 0 || !strings.Contains(out, "job "+strconv.Itoa(i)) {
			t.Fatalf("run %d after the drain: %d %q %s", i, code, out, errOut)
		}
	}
	placed := 0
	for vmid, r := range vmsOn(t, c) {
		if vmid == int(kept.VMID) {
			continue
		}
		placed++
		if r.Node == kept.Node {
			t.Errorf("VM %d (%s) of a job run after the drain is on the drained node %s", vmid, r.Name, r.Node)
		}
	}
	if placed != 2 {
		t.Errorf("%d VMs of the two kept jobs, want 2", placed)
	}

	// An unknown node is refused by name, with the nodes there are; a
	// bad name too.
	for bad, want := range map[string]string{
		"pve9":         `node "pve9": not a node of this cluster (its nodes: pve1, pve2)`,
		"no such node": `node "no such node": not a node name`,
	} {
		out, errOut, code = delegateCmd(t, env, "proxmox", "drain", bad)
		if code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("proxmox drain %q: %d %q %q; want an error %q", bad, code, out, errOut, want)
		}
	}

	out, errOut, code = delegateCmd(t, env, "proxmox", "drain", "--undo", kept.Node)
	if nc, _ := c.NodeConfig(t.Context(), kept.Node); code != 0 || strings.Contains(nc.Description, proxmox.DrainMarker) {
		t.Errorf("drain --undo: %d %q %s; notes %q", code, out, errOut, nc.Description)
	}
}

// simVM clones the simulator's template into a VM of this name and tags,
// started if asked.
func simVM(t *testing.T, c *pve.Client, vmid int, name string, tags []string, start bool) {
	t.Helper()
	ctx := t.Context()
	upid, err := c.CloneVM(ctx, "pve1", 9000, pve.CloneOptions{NewID: vmid, Name: name})
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err == nil && tags != nil {
		err = c.SetVMConfig(ctx, "pve1", vmid, pve.VMConfigUpdate{Tags: tags})
	}
	if err == nil && start {
		if upid, err = c.StartVM(ctx, "pve1", vmid); err == nil {
			err = c.WaitTask(ctx, "pve1", upid)
		}
	}
	if err != nil {
		t.Fatalf("VM %d (%s): %v", vmid, name, err)
	}
}

// TestProxmoxGCCommand (issue 39, item 13): `delegate proxmox gc` takes
// the VMs of an instance that stamped them two days ago (its server gone),
// a running one too: without --act it prints each and why and removes
// nothing; with --act it removes exactly those, never a live instance's
// pool VMs (stamped now), another VM or the template.
func TestProxmoxGCCommand(t *testing.T) {
	env, c := pveSim(t, 1)
	env["DELEGATE_LOG_LEVEL"] = "warn"
	seen := func(ago time.Duration) string {
		return proxmox.SeenTagPrefix + strconv.FormatInt(time.Now().Add(-ago).Unix(), 10)
	}
	const gone, live = "aaaa1111", "bbbb2222"
	stale := map[int]string{201: "delegate-" + gone + "-job-q1w2e3r4", 202: "delegate-" + gone + "-pool-z9x8c7v6"}
	simVM(t, c, 201, stale[201], []string{"delegate", "delegate-" + gone, "job-q1w2e3r4", seen(48 * time.Hour)}, true)
	simVM(t, c, 202, stale[202], []string{"delegate", "delegate-" + gone, proxmox.PoolTag, seen(48 * time.Hour)}, false)
	simVM(t, c, 203, "delegate-"+live+"-pool-a1s2d3f4", []string{"delegate", "delegate-" + live, proxmox.PoolTag, proxmox.ReadyTag, seen(time.Minute)}, true)
	simVM(t, c, 204, "delegate-"+live+"-pool-g5h6j7k8", []string{"delegate", "delegate-" + live, proxmox.PoolTag, seen(4 * time.Minute)}, false)
	simVM(t, c, 205, "someones", nil, false)
	all := []int{201, 202, 203, 204, 205}
	exist := func(what string, want map[int]bool) {
		t.Helper()
		rs, err := c.ClusterResources(t.Context(), pve.ResourceVM)
		if err != nil {
			t.Fatal(err)
		}
		for vmid, w := range want {
			if ok := slices.ContainsFunc(rs, func(r pve.Resource) bool { return int(r.VMID) == vmid }); ok != w {
				t.Errorf("%s: VM %d exists %v, want %v", what, vmid, ok, w)
			}
		}
	}
	lines := func(out string) []string { return strings.Split(strings.TrimSpace(out), "\n") }

	// The dry run: each stale VM and why, then the count; nothing goes.
	out, errOut, code := delegateCmd(t, env, "proxmox", "gc")
	want := []string{
		"would remove VM 201 (" + stale[201] + ") on pve1: instance " + gone + " last saw it 48h0m0s ago (",
		"would remove VM 202 (" + stale[202] + ") on pve1: instance " + gone + " last saw it 48h0m0s ago (",
		"2 VMs; nothing removed (--act removes them)",
	}
	if got := lines(out); code != 0 || len(got) != len(want) {
		t.Fatalf("proxmox gc: %d %q %s; want lines %q", code, out, errOut, want)
	} else {
		for i := range want {
			if !strings.HasPrefix(got[i], want[i]) {
				t.Errorf("proxmox gc line %d: %q, want %q…", i+1, got[i], want[i])
			}
		}
	}
	exist("after the dry run", map[int]bool{201: true, 202: true, 203: true, 204: true, 205: true, 9000: true})

	// Not stale for a longer --older-than; too short a one is refused.
	out, errOut, code = delegateCmd(t, env, "proxmox", "gc", "--older-than", "72h")
	if code != 0 || out != "no VM of a delegate server unseen for 72h0m0s\n" {
		t.Errorf("proxmox gc --older-than 72h: %d %q %s", code, out, errOut)
	}
	out, errOut, code = delegateCmd(t, env, "proxmox", "gc", "--older-than", "1m", "--act")
	if code == 0 || !strings.Contains(errOut, "--older-than 1m0s: must be at least 10m0s") {
		t.Errorf("proxmox gc --older-than 1m: %d %q %q; want it refused", code, out, errOut)
	}
	exist("after the refused gc", map[int]bool{201: true, 202: true, 203: true, 204: true, 205: true})

	// --act removes exactly the stale two.
	out, errOut, code = delegateCmd(t, env, "proxmox", "gc", "--act")
	want = []string{"removed VM 201 (" + stale[201] + ") on pve1: ", "removed VM 202 (" + stale[202] + ") on pve1: "}
	if got := lines(out); code != 0 || len(got) != len(want) || !strings.HasPrefix(got[0], want[0]) || !strings.HasPrefix(got[1], want[1]) {
		t.Errorf("proxmox gc --act: %d %q %s; want lines %q", code, out, errOut, want)
	}
	exist("after gc --act", map[int]bool{201: false, 202: false, 203: true, 204: true, 205: true, 9000: true})
	if vms := vmsOn(t, c); len(vms) != len(all)-2 {
		t.Errorf("VMs after gc --act: %d, want %d", len(vms), len(all)-2)
	}
	out, errOut, code = delegateCmd(t, env, "proxmox", "gc", "--act")
	if code != 0 || out != "no VM of a delegate server unseen for 24h0m0s\n" {
		t.Errorf("proxmox gc --act again: %d %q %s", code, out, errOut)
	}
}
