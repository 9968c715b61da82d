package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPveSimLeastPrivilege: `delegate pve-sim --least-privilege` prints
// the env of a token it made through its own access API with the
// documented role, and `delegate run` works with it (PVE 8.4, whose agent
// privilege is VM.Monitor, and 9.1).
func TestPveSimLeastPrivilege(t *testing.T) {
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
			run := exec.CommandContext(ctx, binary, "run", "--script", `echo "job as $USER"`)
			run.Env = serverEnv(t.TempDir(), "DELEGATE_LOG_LEVEL=warn", "DELEGATE_BACKEND=proxmox", "DEFAULT_MEMORY=512M", "DEFAULT_DISK=1G")
			for k, v := range env {
				run.Env = append(run.Env, k+"="+v)
			}
			var stdout, runErr bytes.Buffer
			run.Stdout, run.Stderr = &stdout, &runErr
			if err := run.Run(); err != nil || !strings.HasPrefix(stdout.String(), "job as") {
				t.Fatalf("run with the least-privilege token: %v %q\n%s\nsimulator: %s", err, stdout.String(), runErr.String(), stderr.String())
			}
		})
	}
}
