//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// TestNetHelperLeavesHostMountsAlone: a network helper must not change
// the host's mount table. slirp4netns --enable-sandbox makes "/" private
// without MS_REC, pivots and detaches the old root; on a host whose "/"
// is shared (systemd makes it so) the detach propagated and unmounted
// /sys/fs/cgroup, /dev/shm, /run/netns/* and more, on the host. Each
// helper runs an egress job inside a mount namespace of the test's own
// whose "/" is made shared as systemd does (so nothing leaks out of the
// test), and the mount table of that namespace must be the same after
// the job as before.
func TestNetHelperLeavesHostMountsAlone(t *testing.T) {
	canRun(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range netTools(t) {
		t.Run(tool, func(t *testing.T) {
			cmd := exec.Command(self, tool, t.TempDir())
			cmd.Env = append(os.Environ(), testHelperEnv+"=sharedroot")
			// A copy of the test's mount namespace: made private there
			// before anything else (runSharedRoot), so that what happens
			// in it never reaches the test's.
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("the job in a namespace with a shared root: %v", err)
			}
			if !strings.Contains(string(out), "the job succeeded") {
				t.Error("the egress job failed")
			}
			if !strings.Contains(string(out), "mount table unchanged") {
				t.Errorf("the mount table changed: the network helper's mounts reached the namespace that started it")
			}
		})
	}
}

// runSharedRoot is the child of TestNetHelperLeavesHostMountsAlone, as
// root of a mount namespace of its own: args are the helper and a
// directory for the sandboxes.
func runSharedRoot(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sharedroot TOOL DIR")
		return 2
	}
	// Cut from the test's namespace first, then shared among the mounts
	// of this one, as systemd leaves a host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Println("make / private:", err)
		return 1
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		fmt.Println("make / shared:", err)
		return 1
	}
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	b, err := New(Config{Dir: args[1]})
	if err != nil {
		fmt.Println("New:", err)
		return 1
	}
	b.nets.force = args[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := defaultSpec()
	spec.Network = true
	sb, err := b.Create(ctx, spec)
	if err != nil {
		fmt.Println("Create:", err)
		return 1
	}
	p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}, Env: testEnv})
	if err != nil {
		fmt.Println("Exec:", err)
		return 1
	}
	exit, err := p.Wait(ctx)
	if err != nil || exit.Code != 0 {
		fmt.Printf("the job failed: %+v, %v\n", exit, err)
	} else {
		fmt.Println("the job succeeded")
	}
	if err := sb.Destroy(ctx); err != nil {
		fmt.Println("Destroy:", err)
	}
	after, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	bl, al := mountLines(before), mountLines(after)
	// A mount whose mount point its owner removed meanwhile went in every
	// namespace (the kernel detaches mounts on a removed directory): the
	// sandboxes of other tests on this host, which no helper of ours
	// touched.
	// So did the mounts other tests' sandboxes, in the host's temporary
	// directory, unmounted meanwhile (the Proxmox simulator's guests, kept
	// sandboxes paused or rolled back): a mount of this job's own
	// directory, or anywhere else, still counts.
	tmp := filepath.Clean(os.TempDir()) + "/"
	own := filepath.Clean(args[1]) + "/"
	bl = slices.DeleteFunc(bl, func(l string) bool {
		f := strings.Fields(l)
		if len(f) < 5 || slices.Contains(al, l) {
			return false
		}
		at := unescapeMountPath(f[4])
		if strings.HasPrefix(at, tmp) && !strings.HasPrefix(at+"/", own) {
			return true
		}
		_, err := os.Lstat(at)
		return errors.Is(err, os.ErrNotExist)
	})
	fmt.Printf("%s: %d mounts before the job, %d after\n", args[0], len(bl), len(al))
	if slices.Equal(bl, al) {
		fmt.Println("mount table unchanged")
		return 0
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			fmt.Println("gone:", l)
		}
	}
	for _, l := range al {
		if !slices.Contains(bl, l) {
			fmt.Println("new:", l)
		}
	}
	return 0
}

// mountLines are the lines of a mountinfo, in order.
func mountLines(data []byte) []string {
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}
