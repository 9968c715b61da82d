package cli

import (
	"context"
	"github.com/delegate-dev/delegate/internal/testkit/testsim"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/pve"
)

// TestPveSimCallback: a guest with a NIC of a standalone `delegate
// pve-sim` reaches delegate's callback server: the env it prints names
// CALLBACK_PUBLIC_URL at the server's address on the simulated network,
// whose connections the simulator carries to CALLBACK_HOST:CALLBACK_PORT
// on this host (job VMs fetch their workspaces there).
func TestPveSimCallback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the callback server at "+r.URL.Path) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	guests := t.TempDir() // removed after the simulator closed
	env := testsim.Printed(t, func(ctx context.Context, stdout io.Writer) {
		cmdPveSim(ctx, Config{CallbackHost: "0.0.0.0", CallbackPort: port}, []string{"--listen", "127.0.0.1:0",
			"--task-delay", "30ms", "--boot-delay", "300ms", "--sandbox-dir", guests}, stdout, io.Discard)
	})
	ctx := t.Context()
	want := "http://10.0.0.5:" + strconv.Itoa(port)
	if env["CALLBACK_PUBLIC_URL"] != want {
		t.Fatalf("CALLBACK_PUBLIC_URL=%q, want %q (env %v)", env["CALLBACK_PUBLIC_URL"], want, env)
	}

	// A clone of the template keeps its NIC; its guest fetches the URL.
	p, _ := strconv.Atoi(env["PROXMOX_PORT"])
	c, err := pve.New(pve.Config{Host: env["PROXMOX_HOST"], Port: p, User: env["PROXMOX_USER"], TokenName: env["PROXMOX_TOKEN_NAME"],
		TokenValue: env["PROXMOX_TOKEN_VALUE"], SSLMode: pve.SSLVerify, Fingerprint: env["PROXMOX_FINGERPRINT"], TaskPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	upid, err := c.CloneVM(ctx, "pve1", 9000, pve.CloneOptions{NewID: 100, Name: "guest"})
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err == nil {
		upid, err = c.StartVM(ctx, "pve1", 100)
	}
	if err == nil {
		err = c.WaitTask(ctx, "pve1", upid)
	}
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the guest agent answers", func() bool { return c.AgentPing(ctx, "pve1", 100) == nil })
	pid, err := c.AgentExec(ctx, "pve1", 100, []string{"curl", "-sS", "--max-time", "10", want + "/x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var st pve.ExecStatus
	testkit.Eventually(t, 30*time.Second, "curl ends", func() bool {
		st, err = c.AgentExecStatus(ctx, "pve1", 100, pid)
		return err != nil || st.Exited
	})
	if err != nil || string(st.Stdout) != "the callback server at /x" {
		t.Fatalf("the guest's curl of %s: %v %q %q", want, err, st.Stdout, st.Stderr)
	}
}
