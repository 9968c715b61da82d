package pvesim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/pve"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// TestLifecycle drives a VM through its life with the pve client: clone
// (linked and full), config, start, boot, agent ping, exec, files, stop
// with a command running, destroy, and checks that nothing is left.
func TestLifecycle(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			testLifecycle(t, full, false)
		})
	}
	// The shell emulation of the agent (where qemu-ga is missing) answers
	// the same.
	t.Run("emulated agent", func(t *testing.T) { testLifecycle(t, false, true) })
}

func testLifecycle(t *testing.T, full, emulation bool) {
	s := newSim(t, Options{BootDelay: time.Second, AgentEmulation: emulation})
	if emulation && s.AgentKind() != "emulation" {
		t.Fatalf("agent %s", s.AgentKind())
	}
	ctx := ctxT(t)
	c := s.c
	id, err := c.NextID(ctx)
	if err != nil || id != 100 {
		t.Fatalf("nextid %d %v", id, err)
	}

	// Clone.
	upid, err := c.CloneVM(ctx, "pve1", tplID, pve.CloneOptions{NewID: id, Name: "job-1", Description: "first job", Full: &full})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := pve.ParseUPID(upid); err != nil || u.Type != "qmclone" || u.ID != "9000" || u.Node != "pve1" {
		t.Fatalf("upid %q: %+v %v", upid, u, err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	conf, err := c.VMConfig(ctx, "pve1", id)
	if err != nil {
		t.Fatal(err)
	}
	disk := conf.Option("scsi0")
	wantDisk := "local-lvm:base-9000-disk-0/vm-100-disk-0,"
	if full {
		wantDisk = "local-lvm:vm-100-disk-0,"
	}
	if !strings.HasPrefix(disk, wantDisk) || conf.Name != "job-1" || conf.Description != "first job" || bool(conf.Template) || conf.Lock != "" {
		t.Fatalf("clone config: scsi0=%q %+v", disk, conf)
	}
	tplConf, _ := c.VMConfig(ctx, "pve1", tplID)
	if conf.Option("net0") == tplConf.Option("net0") {
		t.Error("the clone kept the template's MAC")
	}

	// Config: synchronous and as a task.
	desc := "job 1, step 2"
	if err := c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{
		Cores: 1, MemoryMiB: 1024, Tags: []string{"delegate", "job-1"}, Description: &desc,
		Nets: map[int]string{1: "virtio,bridge=vmbr0"}, Digest: conf.Digest,
	}); err != nil {
		t.Fatal(err)
	}
	upid, err = c.SetVMConfigAsync(ctx, "pve1", id, pve.VMConfigUpdate{Name: "job-1b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "", upid); err != nil {
		t.Fatal(err)
	}
	conf, _ = c.VMConfig(ctx, "pve1", id)
	if conf.Cores != 1 || conf.MemoryMiB() != 1024 || conf.Tags != "delegate;job-1" || conf.Description != desc || conf.Name != "job-1b" {
		t.Fatalf("config after set: %+v", conf)
	}
	if net1 := conf.Option("net1"); !strings.HasPrefix(net1, "virtio=BC:24:11:") || !strings.HasSuffix(net1, ",bridge=vmbr0") {
		t.Errorf("net1 = %q: want a generated MAC", net1)
	}
	// A stale digest is refused.
	err = c.SetVMConfig(ctx, "pve1", id, pve.VMConfigUpdate{Cores: 2, Digest: strings.Repeat("0", 40)})
	var api *pve.APIError
	if !errors.As(err, &api) || api.Reason != "checksum mismatch (file change by other user?)" {
		t.Errorf("stale digest: %v", err)
	}

	// Start; the agent answers only after the boot.
	upid, err = c.StartVM(ctx, "pve1", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AgentPing(ctx, "pve1", id); !pve.IsVMNotRunning(err) && !pve.IsAgentNotRunning(err) {
		t.Errorf("ping while starting: %v", err)
	}
	// The guest is made at the end of the start task and boots for
	// BootDelay: the ping goes as soon as the simulator has the guest,
	// not after WaitTask's growing pauses between polls (which, after a
	// start slowed by a loaded host, can outlast the boot).
	testkit.Eventually(t, 60*time.Second, "the VM's guest", func() bool {
		v, _ := s.VM(id)
		return v.Sandbox != ""
	})
	if err := c.AgentPing(ctx, "pve1", id); !pve.IsAgentNotRunning(err) {
		t.Errorf("ping while booting: %v", err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	st, err := c.VMStatus(ctx, "pve1", id)
	if err != nil || st.Status != "running" || st.PID == 0 || !bool(st.Agent) || st.MaxMem != 1024<<20 {
		t.Errorf("status: %+v %v", st, err)
	}
	waitAgent(t, s, id)

	// Exec: stdout and stderr apart, the exit code.
	pid, err := c.AgentExec(ctx, "pve1", id, []string{"/bin/sh", "-c", "echo hi; echo err >&2; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	es := waitExec(t, s, id, pid)
	if es.ExitCode == nil || *es.ExitCode != 3 || es.Signal != nil || string(es.Stdout) != "hi\n" || string(es.Stderr) != "err\n" || es.StdoutTruncated {
		t.Errorf("exec: %+v", es)
	}
	// The agent forgets a pid once it reported its end.
	if _, err := c.AgentExecStatus(ctx, "pve1", id, pid); !pve.IsAgentError(err) || !strings.HasSuffix(err.Error(), "Agent error: Invalid parameter 'pid'") {
		t.Errorf("second status: %v", err)
	}
	// Stdin, binary safe.
	input := []byte{0, 1, 2, 'a', 0x7f, 0x80, 0xc3, 0xa9, 0xff, '\n'}
	pid, err = c.AgentExec(ctx, "pve1", id, []string{"cat"}, input)
	if err != nil {
		t.Fatal(err)
	}
	if es := waitExec(t, s, id, pid); !bytes.Equal(es.Stdout, input) || *es.ExitCode != 0 {
		t.Errorf("cat: %q", es.Stdout)
	}
	if es := run(t, s, id, "/bin/sh", "-c", "kill -KILL $$"); es.Signal == nil || *es.Signal != 9 || es.ExitCode != nil {
		t.Errorf("killed: %+v", es)
	}
	if _, err := c.AgentExec(ctx, "pve1", id, []string{"nosuch-program"}, nil); err == nil ||
		!strings.HasSuffix(err.Error(), "Agent error: Guest agent command failed, error was 'Failed to execute child process “nosuch-program” (No such file or directory)'") {
		t.Errorf("missing program: %v", err)
	}

	// Files: round trip, overwrite, limits, errors.
	data := make([]byte, pve.MaxFileWrite)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := c.AgentFileWrite(ctx, "pve1", id, "/tmp/data.bin", data); err != nil {
		t.Fatal(err)
	}
	fc, err := c.AgentFileRead(ctx, "pve1", id, "/tmp/data.bin")
	if err != nil || !bytes.Equal(fc.Data, data) || fc.Truncated {
		t.Fatalf("read back %d bytes (truncated %v): %v", len(fc.Data), fc.Truncated, err)
	}
	sum := sha256.Sum256(data)
	if es := run(t, s, id, "sha256sum", "/tmp/data.bin"); !strings.HasPrefix(string(es.Stdout), hex.EncodeToString(sum[:])) {
		t.Errorf("the guest sees %q", es.Stdout)
	}
	if err := c.AgentFileWrite(ctx, "pve1", id, "/tmp/data.bin", []byte("short")); err != nil {
		t.Fatal(err)
	}
	if fc, _ := c.AgentFileRead(ctx, "pve1", id, "/tmp/data.bin"); string(fc.Data) != "short" {
		t.Errorf("overwrite: %q", fc.Data)
	}
	if err := c.AgentFileWrite(ctx, "pve1", id, "/workspace/x", make([]byte, pve.MaxFileWrite+1)); err == nil {
		t.Error("the client sent more than a call may carry")
	}
	r := s.raw(t, "POST", fmt.Sprintf("/api2/json/nodes/pve1/qemu/%d/agent/file-write", id), "", "application/json",
		`{"file":"/tmp/big","content":"`+strings.Repeat("a", 61441)+`"}`)
	if r.Status != 400 || r.Body["errors"].(map[string]any)["content"] != "value may only be 61440 characters long" {
		t.Errorf("61441 characters: %d %v", r.Status, r.Body["errors"])
	}
	r = s.raw(t, "POST", fmt.Sprintf("/api2/json/nodes/pve1/qemu/%d/agent/file-write", id), "", "application/json",
		`{"file":"/workspace/big","content":"`+strings.Repeat("a", 61440)+`"}`)
	if r.Status != 200 {
		t.Errorf("61440 characters with encode=1: %d %s", r.Status, r.Reason)
	}
	if _, err := c.AgentFileRead(ctx, "pve1", id, "/nonexistent"); !pve.IsAgentError(err) ||
		!strings.HasSuffix(err.Error(), "Agent error: failed to open file '/nonexistent' (mode: 'r'): No such file or directory") {
		t.Errorf("read missing: %v", err)
	}
	if err := c.AgentFileWrite(ctx, "pve1", id, "/etc/delegate.conf", []byte("x")); !pve.IsAgentError(err) ||
		!strings.HasSuffix(err.Error(), "(mode: 'wb'): Read-only file system") {
		t.Errorf("write to /etc: %v", err)
	}
	ifs, err := c.AgentNetworkInterfaces(ctx, "pve1", id)
	if err != nil || len(ifs) != 3 || ifs[1].Name != "eth0" || ifs[2].Name != "eth1" || // net0 and net1
		!strings.Contains(strings.ToLower(conf.Option("net1")), ifs[2].HardwareAddress) ||
		!strings.Contains(strings.ToLower(conf.Option("net0")), ifs[1].HardwareAddress) {
		t.Errorf("interfaces: %+v %v (net0 %s)", ifs, err, conf.Option("net0"))
	}

	// Stop with a command running: it dies with the VM.
	marker := fmt.Sprintf("%d.%d", 4000+id, time.Now().UnixNano()%1000)
	pid, err = c.AgentExec(ctx, "pve1", id, []string{"/bin/sh", "-c", "echo up > /tmp/up; exec sleep " + marker}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command to start", func() bool {
		fc, err := c.AgentFileRead(ctx, "pve1", id, "/tmp/up")
		return err == nil && string(fc.Data) == "up\n"
	})
	if !processRunning("sleep " + marker) {
		t.Fatal("the command does not run on the host")
	}
	vm, _ := s.VM(id)
	sandboxDir := filepath.Join(s.opts.SandboxDir, vm.Sandbox)
	if _, err := os.Stat(sandboxDir); err != nil || vm.Sandbox == "" {
		t.Fatalf("sandbox %q: %v", vm.Sandbox, err)
	}
	if _, err := c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{}); err == nil || !strings.HasSuffix(err.Error(), fmt.Sprintf("VM %d is running - destroy failed", id)) {
		t.Errorf("delete while running: %v", err)
	}
	upid, err = c.StopVM(ctx, "pve1", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AgentExecStatus(ctx, "pve1", id, pid); !pve.IsVMNotRunning(err) {
		t.Errorf("exec-status after stop: %v", err)
	}
	waitFor(t, "the command to die", func() bool { return !processRunning("sleep " + marker) })
	if _, err := os.Stat(sandboxDir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir after stop: %v", err)
	}

	// Destroy: nothing left.
	upid, err = c.DeleteVM(ctx, "pve1", id, pve.DeleteOptions{Purge: true, DestroyUnreferencedDisks: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTask(ctx, "pve1", upid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VMConfig(ctx, "pve1", id); !pve.IsNotFound(err) {
		t.Errorf("config after delete: %v", err)
	}
	if _, ok := s.VM(id); ok {
		t.Error("VM still listed")
	}
	assertNoGuests(t, s)
}

// assertNoGuests checks that no sandbox, mount or process of a guest is
// left.
func assertNoGuests(t *testing.T, s *sim) {
	t.Helper()
	ids, err := s.backend.List(ctxT(t))
	if err != nil || len(ids) != 0 {
		t.Errorf("sandboxes left: %v %v", ids, err)
	}
	entries, _ := os.ReadDir(s.opts.SandboxDir)
	if len(entries) != 0 {
		t.Errorf("sandbox dir not empty: %v", entries)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), s.opts.SandboxDir) {
		t.Errorf("mounts left under %s", s.opts.SandboxDir)
	}
	// A sandbox's supervisor (the shim) names its directory.
	if processRunning(s.opts.SandboxDir) {
		t.Errorf("processes of %s left", s.opts.SandboxDir)
	}
}

// processRunning looks for a host process whose command line contains s.
func processRunning(s string) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(strings.ReplaceAll(string(cmd), "\x00", " "), s) {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
