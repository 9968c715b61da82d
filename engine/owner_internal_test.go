package engine

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestOwnerAliveZombie: a server killed but not reaped yet is a zombie,
// which runs nothing: its jobs must be adopted.
func TestOwnerAliveZombie(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	host, _ := os.Hostname()
	owner := fmt.Sprintf("%s/%d/%s/%s", host, pid, procStart(pid), "00000000")
	if !ownerAlive(owner) {
		t.Fatal("a running process counts as dead")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	// A poll: the kernel announces no event when a killed process
	// becomes a zombie (waiting for it would reap it).
	if !testkit.Poll(5*time.Second, func() bool { return procState(pid) == "Z" }) {
		t.Fatalf("process state %q, want Z", procState(pid))
	}
	if ownerAlive(owner) {
		t.Error("a zombie counts as alive")
	}
	cmd.Wait()
}
