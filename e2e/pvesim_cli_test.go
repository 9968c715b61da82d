package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPveSimLeastPrivilege: `delegate pve-sim --least-privilege` prints
// the env of a token it made through its own access API with the
// documented role, and `delegate run` works with it (PVE 8.4, whose agent
// privilege is VM.Monitor, and 9.1).
func TestPveSimLeastPrivilege(t *testing.T) {
	t.Parallel() // waits on the simulator's latencies, mostly
	for _, version := range []string{"8.4", "9.1"} {
		t.Run(version, func(t *testing.T) {
			ctx := testContext(t)
			sim := exec.CommandContext(ctx, binary, "pve-sim", "--listen", "127.0.0.1:0", "--least-privilege",
				"--pve-version", version, "--task-delay", "30ms", "--boot-delay", "300ms", "--sandbox-dir", t.TempDir())
			sim.Env = serverEnv(t.TempDir(), "DELEGATE_LOG_LEVEL=warn")
			var stderr syncBuffer
			sim.Stderr = &stderr
			out, err := sim.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := sim.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// An interrupt closes the simulator, which stops its guests.
				sim.Process.Signal(os.Interrupt)
				done := make(chan struct{})
				go func() { sim.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					sim.Process.Kill()
					<-done
				}
			})
			env := map[string]string{}
			var comments []string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				if c, ok := strings.CutPrefix(line, "# "); ok {
					comments = append(comments, c)
					continue
				}
				k, v, _ := strings.Cut(strings.TrimPrefix(line, "export "), "=")
				env[k] = strings.Trim(v, "'")
				if k == "DEFAULT_VM_TEMPLATE" {
					break
				}
			}
			if env["PROXMOX_USER"] != "delegate@pve" || env["PROXMOX_TOKEN_NAME"] != "jobs" || env["PROXMOX_TOKEN_VALUE"] == "" {
				t.Fatalf("env %v\n%s", env, stderr.String())
			}
			agentPriv := "VM.GuestAgent.Unrestricted"
			if version == "8.4" {
				agentPriv = "VM.Monitor"
			}
			if !strings.Contains(strings.Join(comments, "\n"), "role DelegateJobs (") || !strings.Contains(strings.Join(comments, "\n"), agentPriv) {
				t.Errorf("comments %q", comments)
			}
			dataDir := t.TempDir()
			run := exec.CommandContext(ctx, binary, "run", "--script", `echo "job as $USER"`)
			run.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn", "DELEGATE_BACKEND=proxmox", "DEFAULT_MEMORY=512M", "DEFAULT_DISK=1G")
			for k, v := range env {
				run.Env = append(run.Env, k+"="+v)
			}
			var stdout, runErr bytes.Buffer
			run.Stdout, run.Stderr = &stdout, &runErr
			if err := run.Run(); err != nil || !strings.HasPrefix(stdout.String(), "job as") {
				t.Fatalf("run with the least-privilege token: %v %q\n%s\nsimulator: %s", err, stdout.String(), runErr.String(), stderr.String())
			}
			// jobs status shows where the start spent its time.
			status := exec.CommandContext(ctx, binary, "jobs", "status", newestJob(t, dataDir))
			status.Env = run.Env
			shown, err := status.Output()
			for _, w := range []string{"timeline:", "cloning from delegate-template on pve1", "starting VM", "waiting for the guest agent"} {
				if err != nil || !strings.Contains(string(shown), w) {
					t.Errorf("jobs status of a Proxmox job lacks %q: %v\n%s", w, err, shown)
				}
			}
		})
	}
}

// TestPveSimNewUser: as a new user tries it, the example of `pve-sim
// --help` returns (the simulator lets go of its stdout once the env is
// printed), the env says DELEGATE_BACKEND=proxmox, and `serve --toolsets
// proxmox` after it starts, also with the local backend and its
// DEFAULT_VM_TEMPLATE naming no root filesystem: a server without the
// job tools opens no job backend.
func TestPveSimNewUser(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	envFile := dir + "/pve.env"
	script := `out="$("$0" pve-sim --listen 127.0.0.1:0 --task-delay 30ms --boot-delay 300ms --sandbox-dir "$1" &)"
printf '%s\n' "$out" > "$2"
eval "$out"
echo "backend=$DELEGATE_BACKEND port=$PROXMOX_PORT template=$DEFAULT_VM_TEMPLATE"`
	t.Cleanup(func() {
		// The simulator outlives the shell: stop it (it said its pid).
		printed, _ := os.ReadFile(envFile)
		pid := simPid(printed)
		if pid == 0 {
			return
		}
		p, _ := os.FindProcess(pid)
		p.Signal(os.Interrupt)
		for range 100 {
			if p.Signal(syscall.Signal(0)) != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.Kill()
	})
	sh := exec.CommandContext(ctx, "/bin/sh", "-c", script, binary, dir+"/guests", envFile)
	sh.Env = serverEnv(t.TempDir(), "DELEGATE_LOG_LEVEL=warn")
	// A file, not a pipe: the simulator keeps the shell's stderr.
	stderr, err := os.Create(dir + "/stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	sh.Stderr = stderr
	done := make(chan struct{})
	var out []byte
	go func() { out, err = sh.Output(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		sh.Process.Kill()
		t.Fatal(`eval "$(delegate pve-sim &)" did not return within 30 s`)
	}
	printed, _ := os.ReadFile(envFile)
	pid := simPid(printed)
	if err != nil || !strings.HasPrefix(string(out), "backend=proxmox port=") || !strings.HasSuffix(string(out), "template=delegate-template\n") || pid == 0 {
		t.Fatalf("%v %q\nprinted:\n%s", err, out, printed)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(printed), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = strings.Trim(v, "'")
		}
	}
	for _, backend := range []string{"proxmox", "local"} {
		extra := []string{"DELEGATE_TOOLSETS=proxmox"}
		for k, v := range env {
			if k != "DELEGATE_BACKEND" {
				extra = append(extra, k+"="+v)
			}
		}
		extra = append(extra, "DELEGATE_BACKEND="+backend)
		cs, _, _ := stdioSession(t, t.TempDir(), "", extra...)
		if names, _, _ := listTools(t, cs); len(names) == 0 || slices.Contains(names, "submit_job") {
			t.Errorf("backend %s: tools %v", backend, names)
		}
		nodes := call[struct {
			Nodes []struct {
				Node string `json:"node"`
			} `json:"nodes"`
		}](t, cs, "proxmox_get_nodes", map[string]any{})
		if len(nodes.Nodes) != 1 {
			t.Errorf("backend %s: nodes %+v", backend, nodes)
		}
	}
}

// simPid reads the pid pve-sim printed.
func simPid(printed []byte) int {
	var pid int
	for _, line := range strings.Split(string(printed), "\n") {
		if _, err := fmt.Sscanf(line, "# pvesim runs as pid %d", &pid); err == nil {
			return pid
		}
	}
	return 0
}
