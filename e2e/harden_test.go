package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCancelWithoutServer: `delegate jobs cancel` of a job whose server is
// gone (killed here) stops the job for real: its processes die, its
// sandbox (workspace mount, cgroups, directory) goes, and the job is
// cancelled. It used to be only recorded as cancelled, and run on.
func TestCancelWithoutServer(t *testing.T) {
	dataDir := t.TempDir()
	cs, cmd, _ := stdioSession(t, dataDir, "")
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "echo started; exec sleep 1000"}})
	waitFor(t, cs, job.JobID, "running")
	sandboxDir := sandboxOf(t, dataDir, job.JobID)
	initPID := readPIDFile(t, filepath.Join(sandboxDir, "init.pid"))
	killServer(t, cmd)
	if err := syscall.Kill(initPID, 0); err != nil {
		t.Fatalf("the job died with its server: %v", err)
	}

	out, errOut, code := delegateCLI(t, dataDir, "jobs", "cancel", job.JobID)
	if code != 0 || out != job.JobID+" cancelled\n" {
		t.Fatalf("jobs cancel: code %d, %q %s", code, out, errOut)
	}
	if err := syscall.Kill(initPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the job's processes still run after jobs cancel (kill -0 %d: %v)", initPID, err)
	}
	if _, err := os.Stat(sandboxDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox is still there: %v", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), dataDir) {
		t.Errorf("mounts left under the data dir")
	}
	if out, _, _ := delegateCLI(t, dataDir, "jobs", "status", job.JobID); !strings.Contains(out, "cancelled") {
		t.Errorf("jobs status: %q", out)
	}
	if out, _, _ := delegateCLI(t, dataDir, "jobs", "logs", job.JobID); out != "started\n" {
		t.Errorf("jobs logs: %q", out)
	}
}

// TestTemplateNames: over MCP, vmTemplate names a root filesystem of
// DELEGATE_ROOTFS_DIR; a host path is refused at submission with the field
// and the names there are. A bad DEFAULT_VM_TEMPLATE stops the server at
// start, naming the variable.
func TestTemplateNames(t *testing.T) {
	dataDir := t.TempDir()
	rootfsDir := filepath.Join(t.TempDir(), "rootfs")
	miniRootfs(t, filepath.Join(rootfsDir, "mini"))
	cs, _, _ := stdioSession(t, dataDir, "", "DELEGATE_ROOTFS_DIR="+rootfsDir)

	for _, tpl := range []string{"/", "/etc", filepath.Join(rootfsDir, "mini"), "../mini", "nope"} {
		msg := callErr(t, cs, "submit_job", map[string]any{"manifest": map[string]any{
			"agentType": "script", "task": "ls /", "vmTemplate": tpl}})
		if !strings.Contains(msg, "manifest.vmTemplate") || !strings.Contains(msg, "available: mini") {
			t.Errorf("vmTemplate %q: %s", tpl, msg)
		}
	}
	job := call[submitOut](t, cs, "submit_job", map[string]any{"manifest": map[string]any{
		"agentType": "script", "task": "read x < /marker; echo $x", "vmTemplate": "mini"}})
	call[statusOut](t, cs, "wait_job", map[string]any{"job_id": job.JobID, "timeout_seconds": 30})
	if res := call[resultOut](t, cs, "get_job_result", map[string]any{"job_id": job.JobID}); res.Status != "success" || res.Output != "from-the-template\n" {
		t.Fatalf("job in the named rootfs: %+v", res)
	}

	for _, tc := range []struct{ tpl, want string }{
		{"/", "DEFAULT_VM_TEMPLATE"},
		{dataDir, "DEFAULT_VM_TEMPLATE"},
		{"nope", `DEFAULT_VM_TEMPLATE="nope"`},
	} {
		cmd := exec.Command(binary, "serve")
		cmd.Env = serverEnv(dataDir, "DELEGATE_ROOTFS_DIR="+rootfsDir, "DEFAULT_VM_TEMPLATE="+tc.tpl)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve with DEFAULT_VM_TEMPLATE=%s: %v\n%s", tc.tpl, err, out)
		}
	}
}

// miniRootfs makes a root filesystem at root from the host's /bin/sh and
// the libraries ldd lists for it, plus a marker file.
func miniRootfs(t *testing.T, root string) {
	t.Helper()
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Skipf("no /bin/sh: %v", err)
	}
	out, err := exec.Command("ldd", sh).Output()
	if err != nil {
		t.Skipf("ldd %s: %v", sh, err)
	}
	copyFile := func(src, dst string) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(sh, filepath.Join(root, "bin/sh"))
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			real, err := filepath.EvalSymlinks(f)
			if err != nil {
				t.Fatal(err)
			}
			copyFile(real, filepath.Join(root, f))
		}
	}
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte("from-the-template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}
