package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
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
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(ctx, cli.Program{Stdout: pw, Stderr: io.Discard, Getenv: func(string) string { return "" }},
			[]string{"pve-sim", "--listen", "127.0.0.1:0", "--nodes", strconv.Itoa(nodes),
				"--task-delay", "20ms", "--boot-delay", "200ms", "--sandbox-dir", guests})
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		go io.Copy(io.Discard, pr)
		<-done
	})
	env := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "# pvesim runs as pid") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "="); ok {
			env[k] = strings.Trim(v, "'")
		}
	}
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
